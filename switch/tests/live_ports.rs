//! Ports added and removed by a reload while traffic flows on the others: AF_XDP sockets opened
//! and closed on real veths with iperf3 UDP counting every datagram between the untouched
//! ports, and a reload storm on the sim driver. The AF_XDP test needs root; it fails under
//! CI=true when it cannot run.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use wasmswitch_core::PortId;

use common::*;
use wasmswitch::daemon::Switch;
use wasmswitch::demo::lab_yaml;
use wasmswitch::lab::{Lab, LabHost};

/// Total drops of every reason on the port called `name`, summed over workers.
fn drops(sw: &Switch, name: &str) -> u64 {
    let dp = &sw.dataplane;
    let id = dp.ports.id_of(name).unwrap_or_else(|| panic!("port {name} is running")).index();
    dp.workers.iter().map(|w| w.stats.ports[id].drops_total()).sum()
}

fn port_names(sw: &Switch) -> Vec<String> {
    sw.dataplane.ports.snapshot().into_iter().map(|(_, p)| p.name.clone()).collect()
}

fn reload_ok(sw: &Switch, what: &str) -> String {
    let t = Instant::now();
    let r = sw.reload().unwrap_or_else(|e| panic!("{what}: {e}"));
    eprintln!("{what}: {:.0} ms: {r}", t.elapsed().as_secs_f64() * 1e3);
    r
}

/// An iperf3 UDP client at a fixed rate, started in `h`; its JSON report comes at the end.
fn udp_client(h: &LabHost, to: &str, seconds: u32) -> Child {
    h.cmd(&["iperf3", "-J", "-c", to, "-u", "-b", "20M", "-l", "1000", "-t", &seconds.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 is installed by scripts/setup.sh")
}

#[test]
fn afxdp_ports_come_and_go_live_without_losing_a_frame_on_the_others() {
    if !require_lab("afxdp_ports_come_and_go_live_without_losing_a_frame_on_the_others") {
        return;
    }
    let lab = Lab::create(&format!("wl{}", std::process::id() % 10_000), 3, 1, 41).unwrap();
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    let dir = Scratch::new("afxdp");
    let all = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    // The same file without h3's port.
    let h3_at = all.find("  - name: h3").unwrap();
    let two = all[..h3_at].to_string();
    let sw = Switch::start(&dir.write(&two)).unwrap();
    assert!(!xdp_attached(&h3.switch_if));
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");
    let server = h2
        .cmd(&["iperf3", "-s", "-1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 is installed by scripts/setup.sh");
    std::thread::sleep(Duration::from_millis(300));
    let rcvbuf_before = udp_rcvbuf_errors(h2);
    let client = udp_client(h1, &h2.ip, 8);
    std::thread::sleep(Duration::from_millis(1000));
    for round in 0..2 {
        dir.write(&all);
        let r = reload_ok(&sw, &format!("round {round}: add h3"));
        assert!(r.contains("port `h3` added"), "{r}");
        assert!(xdp_attached(&h3.switch_if), "the XDP program is attached to {}", h3.switch_if);
        assert_eq!(port_names(&sw), ["h1", "h2", "h3"]);
        assert!(h3.ping(&h1.ip, 2).unwrap(), "round {round}: h3 reaches h1 through the added port");
        let r = {
            dir.write(&two);
            reload_ok(&sw, &format!("round {round}: remove h3"))
        };
        assert!(r.contains("port `h3` removed"), "{r}");
        // Not at once: a process another test of this binary spawns at that moment holds a
        // copy of every descriptor, the program's link too, until its exec closes them.
        eventually("the XDP program left h3's interface", || !xdp_attached(&h3.switch_if));
        assert_eq!(port_names(&sw), ["h1", "h2"]);
        assert!(!h3.ping(&h1.ip, 1).unwrap(), "round {round}: h3 is cut off once its port is gone");
    }
    let out = client.wait_with_output().unwrap();
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let sum = &j["end"]["sum"];
    let (packets, lost) = (sum["packets"].as_u64().unwrap_or(0), sum["lost_packets"].as_u64().unwrap_or(u64::MAX));
    // Datagrams the server's socket had no room for (iperf3 not scheduled in time on a loaded
    // machine) are the receiver's; every other loss is the switch's or the path's.
    let at_receiver = udp_rcvbuf_errors(h2) - rcvbuf_before;
    eprintln!(
        "UDP h1 -> h2 across 4 reloads: {packets} datagrams, {lost} lost ({at_receiver} in the receiver's socket)"
    );
    assert!(packets > 10_000, "UDP moved only {packets} datagrams: {j}");
    assert_eq!(
        lost.saturating_sub(at_receiver),
        0,
        "datagrams lost between the ports the reloads did not touch ({lost} in all, {at_receiver} in the receiver's socket)"
    );
    assert_eq!(drops(&sw, "h1") + drops(&sw, "h2"), 0, "no frame dropped on h1 or h2");
    sw.dataplane.stop_shared().expect("every frame is back, those of the removed ports included");
}

fn sim_yaml(extra_port: Option<&str>) -> String {
    let mut y = String::from(
        "workers:\n  - idle: sleep\n  - idle: sleep\nports:\n  - name: gen\n    driver: sim\n    sim:\n      queues: 2\n      traffic:\n        rate_pps: 20000\n        broadcast_percent: 0\n        to: [sink]\n  - name: sink\n    driver: sim\n",
    );
    if let Some(p) = extra_port {
        y += p;
    }
    y
}

fn sim_totals(sw: &Switch, name: &str) -> (u64, u64) {
    let dp = &sw.dataplane;
    let id = dp.ports.id_of(name).unwrap().index();
    let rx = dp.workers.iter().map(|w| w.stats.ports[id].rx_packets.get()).sum();
    let tx = dp.workers.iter().map(|w| w.stats.ports[id].tx_packets.get()).sum();
    (rx, tx)
}

#[test]
fn a_reload_storm_of_sim_ports_loses_nothing_and_refuses_what_it_cannot_open() {
    let dir = Scratch::new("sim");
    let extra = "  - name: extra\n    driver: sim\n    sim:\n      queues: 3\n";
    let sw = Switch::start(&dir.write(&sim_yaml(None))).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..20 {
        dir.write(&sim_yaml(Some(extra)));
        let r = sw.reload().unwrap_or_else(|e| panic!("add #{i}: {e}"));
        assert!(r.contains("port `extra` added"), "{r}");
        assert_eq!(port_names(&sw), ["gen", "sink", "extra"]);
        // Counters of a new port start from zero even when its id was used before.
        assert_eq!(sim_totals(&sw, "extra").0, 0);
        dir.write(&sim_yaml(None));
        let r = sw.reload().unwrap_or_else(|e| panic!("remove #{i}: {e}"));
        assert!(r.contains("port `extra` removed"), "{r}");
        assert_eq!(port_names(&sw), ["gen", "sink"]);
    }
    // A port whose interface does not exist: the reload is refused and nothing changes.
    let bad = "  - name: nic\n    driver: afxdp\n    afxdp:\n      interface: wsnoexist0\n";
    dir.write(&sim_yaml(Some(bad)));
    let e = sw.reload().expect_err("an interface that does not exist cannot be opened").to_string();
    assert!(e.starts_with("reload refused, nothing was changed") && e.contains("nic"), "{e}");
    assert_eq!(port_names(&sw), ["gen", "sink"]);
    assert_eq!(sw.config().ports.len(), 2, "the running config is unchanged");
    // A port in a UMEM group the running switch does not have: refused by name (the workers'
    // pool caches are fixed at start), nothing changes.
    dir.write(&sim_yaml(Some(&format!("{extra}    umem: other\n"))));
    let e = sw.reload().expect_err("a new UMEM group needs a restart").to_string();
    assert!(e.starts_with("reload refused, nothing was changed"), "{e}");
    assert!(e.contains("port `extra` belongs in UMEM group `other`") && e.contains("needs a restart"), "{e}");
    assert_eq!(port_names(&sw), ["gen", "sink"]);
    // Moving a running port to another group is a restart key, refused by name.
    dir.write(&sim_yaml(None).replace("  - name: sink\n", "  - name: sink\n    umem: copy\n"));
    sw.reload().unwrap_or_else(|e| panic!("naming the group a port is in already changes nothing: {e}"));
    dir.write(&sim_yaml(None).replace("  - name: sink\n", "  - name: sink\n    umem: other\n"));
    let e = sw.reload().expect_err("moving a port to another UMEM group needs a restart").to_string();
    assert!(e.contains("ports[1].umem"), "{e}");
    assert_eq!(port_names(&sw), ["gen", "sink"]);
    // A sim port's settings change by replacing its queues; its counters carry on.
    let before = sim_totals(&sw, "gen").0;
    dir.write(&sim_yaml(None).replace("queues: 2", "queues: 1"));
    let r = sw.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(r.contains("port `gen` reopened"), "{r}");
    std::thread::sleep(Duration::from_millis(200));
    let (gen_rx, _) = sim_totals(&sw, "gen");
    assert!(gen_rx > before, "gen keeps counting: {before} -> {gen_rx}");
    let (_, sink_tx) = sim_totals(&sw, "sink");
    assert!(sink_tx > 0 && sink_tx + 256 >= gen_rx, "sink sent {sink_tx} of the {gen_rx} generated frames");
    assert_eq!(drops(&sw, "gen") + drops(&sw, "sink"), 0, "nothing dropped on the ports the storm did not touch");
    let missed: u64 = sw
        .dataplane
        .ports
        .snapshot()
        .iter()
        .flat_map(|(_, p)| p.driver.sim().into_iter().flat_map(|s| &s.stats).map(|s| s.rx_missed.get()))
        .sum();
    assert_eq!(missed, 0, "no generated frame found a full ring");
    // A worker pinned and unpinned live: the kernel's view of the thread follows.
    dir.write(&sim_yaml(None).replace("queues: 2", "queues: 1").replacen(
        "  - idle: sleep",
        "  - idle: sleep\n    cpu: 0",
        1,
    ));
    let r = sw.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(r.contains("workers[0] pinned to cpu 0"), "{r}");
    assert_eq!(cpus_allowed(&sw, 0), [0]);
    dir.write(&sim_yaml(None).replace("queues: 2", "queues: 1"));
    let r = sw.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(r.contains("workers[0] unpinned"), "{r}");
    assert_eq!(cpus_allowed(&sw, 0), cpus_allowed(&sw, 1), "back on every CPU, as the unpinned worker 1");
    sw.dataplane.stop_shared().expect("every frame is back");
}

/// (worker, batches, packets, verdicts) of every plugin instance, by worker.
fn plugin_totals(sw: &Switch) -> Vec<(usize, u64, u64, u64)> {
    let t = sw.plugin_metrics.get();
    let mut v: Vec<_> = t
        .plugins
        .iter()
        .map(|r| {
            let s = &r.stats;
            (r.worker, s.batches.get(), s.packets.get(), s.verdict_pass.get() + s.verdict_drop.get())
        })
        .collect();
    v.sort();
    v
}

/// A reload that keeps a plugin (same port, same name) keeps its counters: Prometheus never
/// sees a `wasmswitch_plugin_*_total` go backwards. A renamed plugin starts from zero.
#[test]
fn plugin_counters_survive_a_reload_of_the_same_plugin() {
    let wasm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/out/acl.wasm");
    if !wasm.exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "plugins/out/acl.wasm missing");
        eprintln!("skipped: build the plugins with plugins/build.sh");
        return;
    }
    let dir = Scratch::new("plugin-reload");
    let yaml = |name: &str| {
        let plugin = format!(
            "    plugins:\n      - name: {name}\n        path: {}\n        config: |\n          default allow\n          deny proto=tcp\n",
            wasm.display()
        );
        sim_yaml(None).replacen("        to: [sink]\n", &format!("        to: [sink]\n{plugin}"), 1)
    };
    let sw = Switch::start(&dir.write(&yaml("acl"))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = plugin_totals(&sw);
    assert_eq!(before.len(), 2, "one instance per worker: {before:?}");
    assert!(before.iter().all(|t| t.1 > 0), "traffic reached the plugin: {before:?}");
    let r = reload_ok(&sw, "the same plugin");
    assert!(r.contains("(acl kept with its state)"), "unchanged: its instances stay: {r}");
    let after = plugin_totals(&sw);
    for (b, a) in before.iter().zip(&after) {
        assert!(a.0 == b.0 && a.1 >= b.1 && a.2 >= b.2 && a.3 >= b.3, "before {b:?}, after {a:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let later = plugin_totals(&sw);
    let sum = |v: &[(usize, u64, u64, u64)]| v.iter().map(|t| t.2).sum::<u64>();
    assert!(sum(&later) > sum(&after), "the kept instances count on");
    // A changed config: fresh instances, the same counters.
    dir.write(&yaml("acl").replace("deny proto=tcp", "deny proto=udp dport=9"));
    let r = reload_ok(&sw, "the same plugin with another config");
    assert!(r.contains("reloaded from their files (acl)"), "changed: fresh instances: {r}");
    let changed = plugin_totals(&sw);
    for (b, a) in later.iter().zip(&changed) {
        assert!(a.0 == b.0 && a.1 >= b.1 && a.2 >= b.2 && a.3 >= b.3, "before {b:?}, after {a:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let later = plugin_totals(&sw);
    assert!(sum(&later) > sum(&changed), "the new instances count into the same counters");
    dir.write(&yaml("acl2"));
    reload_ok(&sw, "a renamed plugin");
    let renamed = sw.plugin_metrics.get().plugins.iter().map(|r| r.stats.packets.get()).sum::<u64>();
    assert!(renamed < sum(&later), "a renamed plugin has counters of its own ({renamed})");
    sw.dataplane.stop_shared().expect("every frame is back");
}

/// The CPUs the kernel lets worker `w` of `sw` run on.
fn cpus_allowed(sw: &Switch, w: usize) -> Vec<usize> {
    sw.dataplane.workers[w].cpus_allowed().expect("the worker runs").expect("pthread_getaffinity_np")
}

fn sh(args: &[&str]) {
    let out = std::process::Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}
#[test]
fn a_port_whose_interface_vanishes_is_re_attached_when_it_comes_back() {
    if !require_lab("a_port_whose_interface_vanishes_is_re_attached_when_it_comes_back") {
        return;
    }
    vanish_and_come_back("wv", 42, |y| y, false);
}

#[test]
fn a_port_whose_interface_is_renamed_or_moved_away_and_back_is_re_attached() {
    // The interface comes back as the same device (same index), still carrying the port's
    // XDP link: the port is re-attached all the same, and its counters keep rising.
    if !require_lab("a_port_whose_interface_is_renamed_or_moved_away_and_back_is_re_attached") {
        return;
    }
    let lab = Lab::create(&format!("wr{}", std::process::id() % 10_000), 2, 1, 49).unwrap();
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    let dir = Scratch::new("renamed");
    let sw = Switch::start(&dir.write(&lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep"))).unwrap();
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");
    let info = || sw.dataplane.ports.get(sw.dataplane.ports.id_of(&h2.name).unwrap()).unwrap();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    // Counters every poll or kick moves: the driver's and the kernel's.
    let counted = || {
        let i = info();
        let driver: u64 = afxdp_queues(&i).iter().map(|m| m.stats.rx_ring_empty.get() + m.stats.tx_wakeups.get()).sum();
        let kernel: u64 = afxdp_queues(&i).iter().filter_map(|m| m.xdp_stats()).map(|k| k.tx_ring_empty_descs).sum();
        (driver, kernel)
    };
    let away = format!("wr{}x", std::process::id() % 10_000);
    let ns = format!("wr{}ns", std::process::id() % 10_000);
    sh(&["ip", "netns", "add", &ns]);
    struct DelNs<'a>(&'a str);
    impl Drop for DelNs<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["netns", "del", self.0]).status();
        }
    }
    let _ns = DelNs(&ns);
    let me = std::process::id().to_string();
    let sw_if = h2.switch_if.as_str();
    // (what, the commands that take the interface away, the ones that bring it back, whether the
    // watch sees it gone before it is back)
    type Commands<'a> = Vec<Vec<&'a str>>;
    let mut cases: Vec<(&str, Commands, Commands, bool)> = vec![
        (
            "renamed away and back",
            vec![vec!["ip", "link", "set", sw_if, "down"], vec!["ip", "link", "set", sw_if, "name", &away]],
            vec![vec!["ip", "link", "set", &away, "name", sw_if], vec!["ip", "link", "set", sw_if, "up"]],
            true,
        ),
        (
            "moved to another namespace and back",
            vec![vec!["ip", "link", "set", sw_if, "netns", &ns]],
            vec![vec!["ip", "-n", &ns, "link", "set", sw_if, "netns", &me], vec!["ip", "link", "set", sw_if, "up"]],
            true,
        ),
    ];
    // Back before the watch looks again: the same name and index, but the kernel unbound the
    // port's sockets when the interface left (the port stayed dead, shown up and healthy). Five
    // times: the watch may look while it is away (then it is the case above).
    for _ in 0..5 {
        cases.push((
            "moved to another namespace and straight back",
            vec![vec!["ip", "link", "set", sw_if, "netns", &ns]],
            vec![vec!["ip", "-n", &ns, "link", "set", sw_if, "netns", &me], vec!["ip", "link", "set", sw_if, "up"]],
            false,
        ));
    }
    for (round, (what, go, back, seen_gone)) in cases.into_iter().enumerate() {
        let before = counted();
        let back_before = count(&info().back_events);
        go.iter().for_each(|c| sh(c));
        if seen_gone {
            eventually("the port is marked gone", || info().gone.load(std::sync::atomic::Ordering::Relaxed));
        }
        back.iter().for_each(|c| sh(c));
        eventually("the port is re-attached", || count(&info().back_events) == back_before + 1);
        assert!(h1.ping(&h2.ip, 3).unwrap(), "{what}: h2 is reached again through the re-attached port");
        assert_eq!(count(&info().gone_events), round as u64 + 1, "{what}");
        let after = counted();
        assert!(after.0 >= before.0 && after.1 >= before.1, "{what}: counters went back: {before:?} -> {after:?}");
    }
    sw.dataplane.stop_shared().expect("every frame is back, those of the closed sockets included");
}

#[test]
fn a_port_alone_in_its_umem_group_vanishes_and_comes_back_in_it() {
    // h3 is the only port of a second UMEM group: when its interface goes, its group's UMEM
    // has no socket left, and coming back registers it with the kernel again. Its frames to
    // h1 and h2 are copied between the groups throughout.
    if !require_lab("a_port_alone_in_its_umem_group_vanishes_and_comes_back_in_it") {
        return;
    }
    let copies =
        vanish_and_come_back("wu", 47, |y| y.replace("  - name: h3\n", "  - name: h3\n    umem: second\n"), false);
    assert!(copies > 0, "h3's frames crossed between the groups");
}

/// Makes lab host `h`'s veth again (its old one deleted), up at both ends, with the host's MAC
/// and address on its end.
fn recreate_veth(h: &LabHost) {
    let pid = h.pid().to_string();
    sh(&["ip", "link", "add", &h.switch_if, "type", "veth", "peer", "name", "eth0", "netns", &pid]);
    sh(&["ip", "link", "set", &h.switch_if, "up"]);
    for args in [
        vec!["ip", "link", "set", "eth0", "address", &h.mac],
        vec!["ip", "addr", "add", &format!("{}/24", h.ip), "dev", "eth0"],
        vec!["ip", "link", "set", "eth0", "up"],
    ] {
        h.must(&args).unwrap();
    }
}

/// Deletes and re-creates h3's interface twice and then h1's, pinging around each; returns the
/// frames copied between UMEM groups.
/// `generic`: the ports attach in generic mode to interfaces that do GRO, which they turn off
/// while attached and put back at close, on the interface they found it on only.
fn vanish_and_come_back(tag: &str, subnet: u8, edit: impl Fn(String) -> String, generic: bool) -> u64 {
    let lab = Lab::create(&format!("{tag}{}", std::process::id() % 10_000), 3, 1, subnet).unwrap();
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    let gro_on = |ifname: &str| {
        let out = std::process::Command::new("ethtool").args(["-k", ifname]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == "generic-receive-offload: on")
    };
    let edit = |y: String| match generic {
        true => edit(y).replace("      interface:", "      mode: generic\n      interface:"),
        false => edit(y),
    };
    if generic {
        for h in &lab.hosts {
            sh(&["ethtool", "-K", &h.switch_if, "gro", "on"]);
            assert!(gro_on(&h.switch_if));
        }
    }
    let dir = Scratch::new("vanish");
    let sw = Switch::start(&dir.write(&edit(lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep")))).unwrap();
    assert!(h3.ping(&h1.ip, 2).unwrap(), "h3 reaches h1");
    let info = |name: &str| sw.dataplane.ports.get(sw.dataplane.ports.id_of(name).unwrap()).unwrap();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    // h3 twice, then h1: the first port opened, whose socket the others' UMEM sharing was
    // anchored on (the kernel unbinds a vanished interface's sockets).
    for (round, (gone, others)) in [(h3, (h1, h2)), (h3, (h1, h2)), (h1, (h2, h3))].into_iter().enumerate() {
        let round = round as u64 + 1;
        let id = sw.dataplane.ports.id_of(&gone.name).unwrap().index();
        let (gone_before, back_before) = (count(&info(&gone.name).gone_events), count(&info(&gone.name).back_events));
        let group_before = info(&gone.name).umem.clone();
        // The veth goes (its peer in the host's namespace with it).
        sh(&["ip", "link", "del", &gone.switch_if]);
        eventually("the port is marked gone", || info(&gone.name).gone.load(std::sync::atomic::Ordering::Relaxed));
        assert!(others.0.ping(&others.1.ip, 2).unwrap(), "round {round}: the other ports keep forwarding");
        assert_eq!(sw.ports_json()["ports"][id]["up"], false);
        // What a worker learned there in the round it finished after the stop (the flush when
        // it went does not wait for the workers) must not outlive its return.
        let late_mac: wasmswitch_core::wire::MacAddr = "02:00:00:00:0e:02".parse().unwrap();
        let fdb = sw.dataplane.fdb.get();
        fdb.learn(vid(1), late_mac, PortId::from_index(id), sw.dataplane.start.elapsed().as_secs() as u32);
        // An interface of the same name comes back, as a container restart would make it.
        recreate_veth(gone);
        eventually("the port is re-attached", || count(&info(&gone.name).back_events) == back_before + 1);
        assert_eq!(fdb.lookup(vid(1), late_mac), None, "round {round}: an entry learned after the stop was flushed");
        assert!(xdp_attached(&gone.switch_if), "round {round}: the XDP program is on the new {}", gone.switch_if);
        // A port that saw its link go down before its interface went keeps that state until
        // the watch's next look at the new interface (a tenth of a second): seen under load.
        eventually("the port is up again", || sw.ports_json()["ports"][id]["up"] == true);
        assert!(
            gone.ping(&others.0.ip, 3).unwrap(),
            "round {round}: {} is reached again through the re-attached port",
            gone.name
        );
        assert_eq!(count(&info(&gone.name).gone_events), gone_before + 1);
        assert_eq!(info(&gone.name).umem, group_before, "round {round}: {} is back in its UMEM group", gone.name);
    }
    let copies = sw.dataplane.workers.iter().map(|w| w.stats.umem_copies.get()).sum();
    sw.dataplane.stop_shared().expect("every frame is back, those of the vanished sockets included");
    drop(sw);
    if generic {
        // h1 and h3 are new veths, which start with GRO off: the old devices' GRO was not put
        // on them (it was, by name). h2's own comes back on.
        assert_eq!([h1, h2, h3].map(|h| gro_on(&h.switch_if)), [false, true, false]);
    }
    copies
}

#[test]
fn a_generic_mode_port_puts_gro_back_on_its_own_interface_only() {
    if !require_lab("a_generic_mode_port_puts_gro_back_on_its_own_interface_only") {
        return;
    }
    vanish_and_come_back("wg", 53, |y| y, true);
}

#[test]
fn afxdp_ports_join_and_leave_a_second_umem_group_live() {
    // h2 and h3 share a second UMEM group, h1 is in the default one. A reload adds h3 to the
    // running group (its sockets share h2's registration), then removes h2 (the group's first
    // socket) and adds it back (sharing h3's now).
    if !require_lab("afxdp_ports_join_and_leave_a_second_umem_group_live") {
        return;
    }
    let lab = Lab::create(&format!("wj{}", std::process::id() % 10_000), 3, 1, 48).unwrap();
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    let dir = Scratch::new("umem-live");
    let all = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep")
        .replace("  - name: h2\n", "  - name: h2\n    umem: second\n")
        .replace("  - name: h3\n", "  - name: h3\n    umem: second\n");
    let without = |name: &str| {
        let at = all.find(&format!("  - name: {name}\n")).unwrap();
        let end = all[at + 1..].find("  - name:").map_or(all.len(), |e| at + 1 + e);
        format!("{}{}", &all[..at], &all[end..])
    };
    let sw = Switch::start(&dir.write(&without("h3"))).unwrap();
    let copies = || -> u64 { sw.dataplane.workers.iter().map(|w| w.stats.umem_copies.get()).sum() };
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2 across the groups");
    for (step, yaml, pairs) in [
        ("add h3", all.clone(), [(h3, h2), (h3, h1)]),
        ("remove h2", without("h2"), [(h3, h1), (h1, h3)]),
        ("add h2 back", all.clone(), [(h2, h3), (h2, h1)]),
    ] {
        dir.write(&yaml);
        reload_ok(&sw, step);
        for (a, b) in pairs {
            assert!(a.ping(&b.ip, 2).unwrap(), "{step}: {} reaches {}", a.name, b.name);
        }
    }
    // Within the second group no unicast frame is copied: h2 <-> h3 pings add none.
    let before = copies();
    assert!(h2.ping(&h3.ip, 5).unwrap());
    assert_eq!(copies(), before, "frames between h2 and h3 (one group) were copied");
    assert!(before > 0, "frames between h1 and the second group were copied");
    sw.dataplane.stop_shared().expect("every frame of both groups is back");
}

#[test]
fn writing_out_a_ports_own_umem_group_reopens_nothing() {
    // `umem: <the group the port is in>` added to a running AF_XDP port changes nothing: the
    // reload must not reopen the port (its sockets would find the switch's own XDP program on
    // the interface and refuse the whole reload).
    if !require_lab("writing_out_a_ports_own_umem_group_reopens_nothing") {
        return;
    }
    let lab = Lab::create(&format!("wu{}", std::process::id() % 10_000), 2, 1, 52).unwrap();
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    let dir = Scratch::new("umem-same");
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    let sw = Switch::start(&dir.write(&yaml)).unwrap();
    let dp = &sw.dataplane;
    let group = dp.ports.get(dp.ports.id_of(&h1.name).unwrap()).unwrap().umem.clone();
    let header = format!("  - name: {}\n", h1.name);
    dir.write(&yaml.replace(&header, &format!("{header}    umem: {group}\n")));
    let answer = reload_ok(&sw, "umem written out");
    assert!(!answer.contains("reopened"), "nothing to reopen: {answer}");
    dir.write(&yaml);
    let answer = reload_ok(&sw, "umem left out again");
    assert!(!answer.contains("reopened"), "nothing to reopen: {answer}");
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 still reaches h2");
    sw.dataplane.stop_shared().expect("every frame is back");
}

/// A plugin whose init takes longer than its batch deadline cannot be remade on the worker
/// after a fault (the remake runs under the batch deadline): it is quarantined. A reload of it
/// unchanged must give it the instance the reload made off the worker, not "keep" the faulted
/// one's nothing: after the reload its next fault is a trap in `process` again, not another
/// failed remake.
#[test]
fn a_reload_gives_a_faulted_slow_init_plugin_its_fresh_instance() {
    use wasmswitch_plugin_host::FaultReason;
    let dir = Scratch::new("slow-init");
    // Some 30-300 ms of init (over the 4 ms a remake under a 1 ms deadline may use); every
    // batch call traps.
    let spin = "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.lt_u (local.get $i) (i32.const 100000000))))";
    let wasm = dir.path("slow.wasm");
    std::fs::write(&wasm, plugin_with_init_and_process(spin, "")).unwrap();
    let plugin = format!(
        "    plugins:\n      - name: slow\n        path: {}\n        deadline_us: 1000\n        max_faults: 3\n        on_error: pass\n",
        wasm.display()
    );
    let yaml = sim_yaml(None).replacen("        to: [sink]\n", &format!("        to: [sink]\n{plugin}"), 1);
    let sw = Switch::start(&dir.write(&yaml)).unwrap();
    let faults = |reason| sw.plugin_metrics.get().plugins.iter().map(|r| r.stats.faults(reason).get()).sum::<u64>();
    let all_quarantined = || sw.plugin_metrics.get().plugins.iter().all(|r| r.stats.quarantined.get() == 1);
    eventually("both workers' instances quarantined", all_quarantined);
    // Per worker: the trap, then two remakes the batch deadline stops.
    assert_eq!((faults(FaultReason::Trap), faults(FaultReason::Instantiate)), (2, 4));
    let r = reload_ok(&sw, "the same plugin");
    assert!(r.contains("slow kept with its state"), "{r}");
    eventually("quarantined again", all_quarantined);
    assert_eq!(
        (faults(FaultReason::Trap), faults(FaultReason::Instantiate)),
        (4, 8),
        "each worker's fresh instance ran process (a trap) before failing remakes again"
    );
    sw.dataplane.stop_shared().expect("every frame is back");
}

/// A port whose link goes down (its own end, or a veth's peer) stops like a gone one: reported
/// down, its learned entries forgotten, nothing queued for it; the others keep forwarding. It
/// forwards again when the link is back.
#[test]
fn a_port_whose_link_goes_down_stops_and_starts_again_with_it() {
    if !require_lab("a_port_whose_link_goes_down_stops_and_starts_again_with_it") {
        return;
    }
    let lab = Lab::create(&format!("wk{}", std::process::id() % 10_000), 3, 1, 47).unwrap();
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    let dir = Scratch::new("linkdown");
    let sw = Switch::start(&dir.write(&lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep"))).unwrap();
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");
    let info = || sw.dataplane.ports.get(sw.dataplane.ports.id_of(&h2.name).unwrap()).unwrap();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let reported_up = || {
        let ports = sw.ports_json();
        let p = ports["ports"].as_array().unwrap().iter().find(|p| p["name"] == h2.name.as_str()).unwrap().clone();
        (p["up"].as_bool().unwrap(), p["link"].as_str().unwrap().to_string())
    };
    let sw_if = h2.switch_if.as_str();
    let late_mac: wasmswitch_core::wire::MacAddr = "02:00:00:00:0e:01".parse().unwrap();
    // (what, take the link down, bring it back)
    type Step<'a> = Box<dyn Fn() + 'a>;
    let cases: [(&str, Step, Step); 2] = [
        (
            "the switch's end set down",
            Box::new(|| sh(&["ip", "link", "set", sw_if, "down"])),
            Box::new(|| sh(&["ip", "link", "set", sw_if, "up"])),
        ),
        (
            "the host's end (the veth peer) set down",
            Box::new(|| h2.must(&["ip", "link", "set", "eth0", "down"]).unwrap()),
            Box::new(|| h2.must(&["ip", "link", "set", "eth0", "up"]).unwrap()),
        ),
    ];
    let kicks_failed = || afxdp_queues(&info()).iter().map(|m| m.stats.port_gone.get()).sum::<u64>();
    for (round, (what, down, up)) in cases.iter().enumerate() {
        // Traffic to h2 as the link goes, so that its TX ring likely holds frames then.
        let mut pinger =
            h1.cmd(&["ping", "-q", "-i", "0.002", "-c", "1000", &h2.ip]).stdout(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        down();
        eventually("the port is reported down", || reported_up() == (false, "down".to_string()));
        let _ = pinger.kill();
        let _ = pinger.wait();
        // A kick the kernel answered ENETDOWN was made again every round while the port was
        // stopped: millions a second, a syscall each.
        let failed = kicks_failed();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            kicks_failed() - failed < 100,
            "{what}: {} failed kicks in 0.5 s of a stopped port",
            kicks_failed() - failed
        );
        assert_eq!(count(&info().down_events), round as u64 + 1, "{what}");
        assert!(!info().gone.load(std::sync::atomic::Ordering::Relaxed), "{what}: down, not gone");
        assert!(h1.ping(&h3.ip, 2).unwrap(), "{what}: the other ports keep forwarding");
        // What a worker learned there in the round it finished after the stop (the flush at
        // link down does not wait for the workers) must not outlive the link's return.
        let fdb = sw.dataplane.fdb.get();
        let now = sw.dataplane.start.elapsed().as_secs() as u32;
        fdb.learn(vid(1), late_mac, sw.dataplane.ports.id_of(&h2.name).unwrap(), now);
        up();
        eventually("the port is reported up", || reported_up() == (true, "up".to_string()));
        assert_eq!(
            fdb.lookup(vid(1), late_mac),
            None,
            "{what}: an entry learned after the stop was flushed at link up"
        );
        assert_eq!(count(&info().up_events), round as u64 + 1, "{what}");
        assert!(h1.ping(&h2.ip, 5).unwrap(), "{what}: h2 is reached again");
    }
    // The link goes while a reload holds the table: a flush then could land on a table the
    // reload has already copied (and be lost), so it waits for the reload to let go.
    let (id, (_, down, up)) = (sw.dataplane.ports.id_of(&h2.name).unwrap(), &cases[0]);
    let held = sw.dataplane.fdb.edits().write().unwrap();
    let now = sw.dataplane.start.elapsed().as_secs() as u32;
    sw.dataplane.fdb.get().learn(vid(1), late_mac, id, now);
    down();
    eventually("the port is reported down", || reported_up() == (false, "down".to_string()));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sw.dataplane.fdb.get().lookup(vid(1), late_mac), Some(id), "no flush while a reload holds the table");
    drop(held);
    eventually("flushed once the reload let go", || sw.dataplane.fdb.get().lookup(vid(1), late_mac).is_none());
    up();
    eventually("the port is reported up", || reported_up() == (true, "up".to_string()));
    assert!(h1.ping(&h2.ip, 5).unwrap(), "h2 is reached again");
    // The link goes down, then the interface goes and comes back up: its `up` is counted, or
    // `down > up` (the WasmswitchPortLinkDown alert) would hold for ever.
    down();
    eventually("the port is reported down", || reported_up() == (false, "down".to_string()));
    let back = count(&info().back_events);
    sh(&["ip", "link", "del", sw_if]);
    eventually("the port is marked gone", || info().gone.load(std::sync::atomic::Ordering::Relaxed));
    recreate_veth(h2);
    eventually("the port is re-attached", || count(&info().back_events) == back + 1);
    eventually("its link's return is counted", || count(&info().up_events) == count(&info().down_events));
    assert!(h1.ping(&h2.ip, 3).unwrap(), "h2 is reached through the new interface");
    sw.dataplane.stop_shared().expect("every frame is back");
}

#[test]
fn a_reload_that_parts_port_ids_from_the_files_order_says_so_where_plugins_see_them() {
    // Plugins see ports by id; a start numbers them by position, a reload keeps running ids.
    let dir = Scratch::new("renumber");
    std::fs::write(dir.path("pass.wasm"), plugin_that_faults_after(u32::MAX)).unwrap();
    let port = |n: &str, plugin: bool| {
        let chain = if plugin { "    plugins:\n      - { name: pass, path: pass.wasm }\n" } else { "" };
        format!("  - name: {n}\n    driver: sim\n{chain}")
    };
    let yaml = |ports: &[String]| format!("workers:\n  - idle: sleep\nports:\n{}", ports.concat());
    let sw = Switch::start(&dir.write(&yaml(&[port("p0", false), port("p1", false), port("p2", true)]))).unwrap();
    dir.write(&yaml(&[port("p0", false), port("p2", true)]));
    let r = reload_ok(&sw, "p1 removed");
    assert!(r.contains("`p2` runs as 2, a restart numbers it 1"), "{r}");
    // Put back at the end, p1 takes the lowest free id, 1, at position 2: both said.
    dir.write(&yaml(&[port("p0", false), port("p2", true), port("p1", false)]));
    let r = reload_ok(&sw, "p1 added at the end");
    assert!(r.contains("`p2` runs as 2, a restart numbers it 1, `p1` runs as 1, a restart numbers it 2"), "{r}");
    // Back in the file's order: nothing to say.
    dir.write(&yaml(&[port("p0", false), port("p1", false), port("p2", true)]));
    let r = reload_ok(&sw, "the start's order");
    assert!(!r.contains("note:"), "{r}");
    sw.dataplane.stop_shared().expect("every frame is back");
}

#[test]
fn in_cross_mode_a_reload_that_would_pair_ports_otherwise_than_the_file_is_refused() {
    // `cross` pairs ports by id, which at a start is their place in the file; ids stay with
    // their ports across reloads. A reorder, or a port removed and another added, answered
    // "applied" while the running pairs stayed as before (a restart would pair them otherwise).
    let dir = Scratch::new("cross-order");
    let yaml = |names: &[&str]| {
        let mut y = String::from("switch:\n  mode: cross\nworkers:\n  - idle: sleep\nports:\n");
        for n in names {
            y += &format!("  - name: {n}\n    driver: sim\n    sim: {{}}\n");
        }
        y
    };
    let sw = Switch::start(&dir.write(&yaml(&["a", "b", "c", "d"]))).unwrap();
    let a_with = |file: &str, running: &str| {
        format!("port `a` pairs with `{file}` in the file but would run paired with `{running}`")
    };
    for (names, said) in [(&["a", "c", "b", "d"][..], a_with("c", "b")), (&["a", "c", "d", "e"][..], a_with("c", "e"))]
    {
        dir.write(&yaml(names));
        let e = sw.reload().expect_err("a new pairing").to_string();
        assert!(e.contains("reload refused, nothing was changed") && e.contains(&said), "{e}");
        assert_eq!(port_names(&sw), ["a", "b", "c", "d"], "nothing changed");
    }
    // Ports added after the others, or a whole pair removed, keep every pair.
    dir.write(&yaml(&["a", "b", "c", "d", "e", "f"]));
    reload_ok(&sw, "two ports added at the end");
    dir.write(&yaml(&["a", "b", "e", "f"]));
    reload_ok(&sw, "the middle pair removed");
    dir.write(&yaml(&["a", "b"]));
    reload_ok(&sw, "the last pair removed");
    assert_eq!(port_names(&sw), ["a", "b"]);
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_port_a_reload_reopens_stays_listed_and_keeps_counting_from_where_it_was() {
    // A reload that reopens a port (a new sim ring size) took it out of the port table until
    // its new queues were in: scrapes in between had none of its series. Its sim NIC's
    // rx_missed went back to 0 with the new queues (Prometheus reads a reset).
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = Scratch::new("reopen-counts");
    let yaml = |ring: usize| {
        format!(
            "workers:\n  - idle: sleep\nports:\n  - name: p0\n    driver: sim\n    sim:\n      ring_size: {ring}\n      traffic:\n        rate_pps: 5000000\n  - name: p1\n    driver: sim\n    sim: {{}}\n"
        )
    };
    let sw = Switch::start(&dir.write(&yaml(64))).unwrap();
    let missed = || {
        let dp = &sw.dataplane;
        dp.ports.get(dp.ports.id_of("p0").expect("p0 is listed")).unwrap().driver.sim().unwrap().missed(0)
    };
    let t = Instant::now();
    while missed() == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for ring in [128, 64, 128] {
        let before = missed();
        assert!(before > 0, "a 64-frame ring at 5 Mpps misses some");
        dir.write(&yaml(ring));
        let done = AtomicBool::new(false);
        let (looks, absent) = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let (mut looks, mut absent) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    looks += 1;
                    absent += u64::from(sw.dataplane.ports.id_of("p0").is_none());
                }
                (looks, absent)
            });
            let r = reload_ok(&sw, "a new ring size");
            assert!(r.contains("port `p0` reopened"), "{r}");
            done.store(true, Ordering::Relaxed);
            watcher.join().unwrap()
        });
        assert_eq!(absent, 0, "p0 missing from the port table in {absent} of {looks} looks during the reload");
        assert!(missed() >= before, "rx_missed went from {before} to {}", missed());
    }
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_port_renamed_on_its_interface_is_refused_by_name_and_done_in_two_reloads() {
    // A renamed port is one removed and one added; the reload opened the new one first and
    // met the old one's XDP program, and blamed "whatever owns it".
    if !require_lab("a_port_renamed_on_its_interface_is_refused_by_name_and_done_in_two_reloads") {
        return;
    }
    let lab = Lab::create(&format!("wn{}", std::process::id() % 10_000), 2, 1, 51).unwrap();
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    let dir = Scratch::new("renamed-port");
    let head = format!("metrics:\n  listen: 127.0.0.1:{}\nworkers:\n  - idle: sleep\nports:\n", free_port());
    let yaml = |ports: &[(&str, &str)]| {
        let mut y = head.clone();
        for (name, interface) in ports {
            y += &format!("  - name: {name}\n    driver: afxdp\n    afxdp:\n      interface: {interface}\n");
        }
        y
    };
    let (one, two) = ((h1.name.as_str(), h1.switch_if.as_str()), (h2.name.as_str(), h2.switch_if.as_str()));
    let sw = Switch::start(&dir.write(&yaml(&[one, two]))).unwrap();
    dir.write(&yaml(&[one, ("moved", two.1)]));
    let e = sw.reload().expect_err("renamed on the same interface in one reload").to_string();
    assert!(
        e.starts_with("reload refused, nothing was changed")
            && e.contains(&format!("port `moved` on {} takes the place of port `{}`", two.1, two.0)),
        "{e}"
    );
    assert!(h1.ping(&h2.ip, 2).unwrap(), "the old port still forwards");
    // In two reloads: away, then back under the new name.
    dir.write(&yaml(&[one]));
    reload_ok(&sw, "the old port removed");
    dir.write(&yaml(&[one, ("moved", two.1)]));
    reload_ok(&sw, "the new one added");
    assert_eq!(port_names(&sw), [one.0, "moved"]);
    assert!(h1.ping(&h2.ip, 3).unwrap(), "h2 is reached through the renamed port");
    sw.dataplane.stop_shared().expect("every frame back");
}

/// `ethtool -L` under a port that opens every queue: queues added while it runs get sockets
/// (before, their frames never reached the switch, and nothing said so), and when the pool
/// cannot feed the new queues the port stays stopped with the reason, instead of draining the
/// frames the other ports run on; back at the count that fits, it is re-attached.
#[test]
fn a_port_on_every_queue_follows_its_interfaces_queue_count_within_the_pool() {
    if !require_lab("a_port_on_every_queue_follows_its_interfaces_queue_count_within_the_pool") {
        return;
    }
    let lab = Lab::create(&format!("wc{}", std::process::id() % 10_000), 3, 4, 57).unwrap();
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    let channels = |h: &LabHost, n: &str| {
        sh(&["ethtool", "-L", &h.switch_if, "rx", n, "tx", n]);
        h.must(&["ethtool", "-L", "eth0", "rx", n, "tx", n]).unwrap();
    };
    for h in &lab.hosts {
        channels(h, "1");
    }
    let dir = Scratch::new("requeue");
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    // A pool just large enough for one queue per port (as `check` counts it now).
    let one_queue_each = wasmswitch::config::Config::load(&dir.write(&yaml)).unwrap().frames_needed();
    let sw = Switch::start(&dir.write(&format!("pool:\n  frames: {one_queue_each}\n{yaml}"))).unwrap();
    let id = sw.dataplane.ports.id_of(&h2.name).unwrap().index();
    let info = || sw.dataplane.ports.get(PortId::from_index(id)).unwrap();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(afxdp_queues(&info()).len(), 1);
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");

    // Four queues at h2: more than the pool holds rings for. The port stops and says why; the
    // others keep their frames and forward.
    channels(h2, "4");
    eventually("h2's port is stopped", || info().gone.load(std::sync::atomic::Ordering::Relaxed));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(count(&info().back_events), 0, "not re-attached beyond the pool");
    assert_eq!(sw.ports_json()["ports"][id]["up"], false);
    assert!(h3.ping(&h1.ip, 3).unwrap(), "the other ports forward on");

    // Back to one queue: re-attached.
    channels(h2, "1");
    eventually("h2's port is re-attached", || count(&info().back_events) == 1);
    assert_eq!(afxdp_queues(&info()).len(), 1);
    assert!(h1.ping(&h2.ip, 3).unwrap(), "h2 is reached again");
    let gone_before = count(&info().gone_events);
    sw.dataplane.stop_shared().expect("every frame is back");
    drop(sw);

    // With room for them, the port takes the added queues: re-attached on all four.
    let sw = Switch::start(&dir.write(&yaml)).unwrap();
    let info = || sw.dataplane.ports.get(PortId::from_index(id)).unwrap();
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");
    channels(h2, "4");
    eventually("h2's port is re-attached on four queues", || afxdp_queues(&info()).len() == 4);
    assert_eq!(count(&info().gone_events), 1, "one stop for the change ({gone_before} in the first run)");
    assert!(xdp_attached(&h2.switch_if));
    // Eight UDP flows from h2 hash over its four TX queues, so over the port's four RX queues:
    // what arrives on each is redirected to the switch, none passed to the kernel beside it.
    // (frames XDP saw, frames it redirected) per RX queue of the port, since the veth was made.
    let per_queue = || -> Vec<(u64, u64)> {
        let out = std::process::Command::new("ethtool").args(["-S", &h2.switch_if]).output().unwrap();
        let stats = String::from_utf8_lossy(&out.stdout).into_owned();
        let stat = |name: String| -> u64 {
            stats.lines().find_map(|l| l.trim().strip_prefix(&format!("{name}: "))?.parse().ok()).unwrap_or(0)
        };
        (0..4)
            .map(|q| (stat(format!("rx_queue_{q}_xdp_packets")), stat(format!("rx_queue_{q}_xdp_redirect"))))
            .collect()
    };
    let before = per_queue();
    let mut server = h1
        .cmd(&["iperf3", "-s", "-1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 is installed by scripts/setup.sh");
    std::thread::sleep(Duration::from_millis(300));
    let client = h2
        .cmd(&["iperf3", "-c", &h1.ip, "-u", "-b", "2M", "-l", "200", "-P", "8", "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(client.status.success(), "iperf3 ran");
    let _ = server.wait();
    let after = per_queue();
    let per_queue: Vec<(u64, u64)> = after.iter().zip(&before).map(|(a, b)| (a.0 - b.0, a.1 - b.1)).collect();
    assert!(per_queue.iter().filter(|(p, _)| *p > 0).count() >= 2, "flows on several queues: {per_queue:?}");
    for (q, (packets, redirected)) in per_queue.iter().enumerate() {
        assert_eq!(packets, redirected, "queue {q}: every frame to the switch: {per_queue:?}");
    }
    sw.dataplane.stop_shared().expect("every frame is back, those of the four queues included");
}

/// An AF_XDP port's queue monitors (none for a port of another driver).
fn afxdp_queues(info: &wasmswitch::drivers::PortInfo) -> &[wasmswitch_afxdp::QueueMonitor] {
    info.driver.afxdp().map_or(&[], |a| &a.queues)
}

/// VLAN `v` (a valid VID in every test here).
fn vid(v: u16) -> wasmswitch_core::vlan::Vid {
    wasmswitch_core::vlan::Vid::new(v).unwrap()
}
