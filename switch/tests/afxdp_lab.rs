//! The switch on real interfaces: hosts in network namespaces on veth pairs, AF_XDP ports.
//! Needs root; skipped with a reason elsewhere, a failure under CI=true.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use wasmswitch::config::Config;
use wasmswitch::dataplane::Dataplane;
use wasmswitch::demo::lab_yaml;
use wasmswitch::lab::{Lab, LabHost};

/// A short unique interface prefix for this test.
fn prefix(tag: &str) -> String {
    format!("wt{tag}{}", std::process::id() % 10_000)
}

fn start(lab: &Lab, workers: usize) -> Dataplane {
    let mut yaml = lab_yaml(lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    if workers == 2 {
        yaml = yaml.replace("workers:\n  - idle: sleep\n", "workers:\n  - idle: sleep\n  - idle: sleep\n");
    }
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    Dataplane::start(&cfg).unwrap()
}

/// Port `p`'s TX packet total over all workers.
fn tx(dp: &Dataplane, p: usize) -> u64 {
    dp.workers.iter().map(|w| w.stats.ports[p].tx_packets.get()).sum()
}

fn rx_of_worker(dp: &Dataplane, w: usize, p: usize) -> u64 {
    dp.workers[w].stats.ports[p].rx_packets.get()
}

/// Static neighbour entries, so unicast tests see no ARP broadcasts.
fn static_neighbours(lab: &Lab) {
    for h in &lab.hosts {
        for o in &lab.hosts {
            if o.ip != h.ip {
                let out = h
                    .run(&["ip", "neigh", "replace", &o.ip, "lladdr", &o.mac, "dev", "eth0", "nud", "permanent"])
                    .unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
}

fn ping_ok(from: &LabHost, to: &LabHost) {
    assert!(from.ping(&to.ip, 3).unwrap(), "ping {} -> {} through the switch", from.name, to.name);
}

#[test]
fn two_ports_ping_both_ways() {
    if !require_lab("two_ports_ping_both_ways") {
        return;
    }
    let lab = Lab::create(&prefix("a"), 2, 1, 21).unwrap();
    let mut dp = start(&lab, 1);
    ping_ok(&lab.hosts[0], &lab.hosts[1]);
    ping_ok(&lab.hosts[1], &lab.hosts[0]);
    dp.stop().expect("no frame leaked");
}

#[test]
fn three_ports_unicast_isolation_flooding_and_no_hairpin() {
    if !require_lab("three_ports_unicast_isolation_flooding_and_no_hairpin") {
        return;
    }
    let lab = Lab::create(&prefix("b"), 3, 1, 22).unwrap();
    static_neighbours(&lab);
    let mut dp = start(&lab, 1);
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    // ARP through the switch (dynamic entries on h3's side) and both directions.
    ping_ok(h1, h2);
    ping_ok(h2, h1);
    ping_ok(h1, h3);
    // Learned now: unicast h1 <-> h2 must never reach h3's port.
    let h3_before = tx(&dp, 2);
    let h1_before = tx(&dp, 0);
    assert!(h1.ping(&h2.ip, 10).unwrap());
    assert_eq!(tx(&dp, 2), h3_before, "unicast between h1 and h2 leaked to h3's port");
    assert!(tx(&dp, 0) >= h1_before + 10, "replies reached h1");
    // A broadcast from h1 reaches h2 and h3 but never goes back out of h1's port.
    let (b2, b3, b1) = (tx(&dp, 1), tx(&dp, 2), tx(&dp, 0));
    let _ = h1.run(&["ping", "-b", "-c", "3", "-i", "0.2", "-W", "1", "10.77.22.255"]);
    let t = Instant::now();
    while (tx(&dp, 1) < b2 + 3 || tx(&dp, 2) < b3 + 3) && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(tx(&dp, 1) >= b2 + 3 && tx(&dp, 2) >= b3 + 3, "broadcast flooded to every other port");
    assert_eq!(tx(&dp, 0), b1, "nothing comes back out of the ingress port");
    assert!(dp.fdb.get().len() >= 3);
    dp.stop().expect("no frame leaked");
}

#[test]
fn traffic_on_both_queues_of_a_two_queue_veth_is_forwarded() {
    if !require_lab("traffic_on_both_queues_of_a_two_queue_veth_is_forwarded") {
        return;
    }
    let lab = Lab::create(&prefix("c"), 2, 2, 23).unwrap();
    let mut dp = start(&lab, 2); // worker q polls queue q of every port
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    ping_ok(h1, h2);
    // The TX queue h1's veth picks (the RX queue the switch sees) comes from the flow hash,
    // and ICMP echo flows between two addresses all hash alike (every ping of an earlier
    // version of this test landed on queue 1). UDP datagrams from fresh sockets have fresh
    // source ports, hence fresh hashes: send rounds of them until both queues carried some.
    let udp = format!("for i in $(seq 32); do echo x > /dev/udp/{}/9; done", h2.ip);
    let mut rounds = 0;
    while (rx_of_worker(&dp, 0, 0) == 0 || rx_of_worker(&dp, 1, 0) == 0) && rounds < 8 {
        let out = h1.run(&["bash", "-c", &udp]).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        rounds += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let (q0, q1) = (rx_of_worker(&dp, 0, 0), rx_of_worker(&dp, 1, 0));
    eprintln!("after {rounds} rounds of 32 UDP flows: queue 0 received {q0}, queue 1 received {q1} frames");
    assert!(q0 > 0 && q1 > 0, "both RX queues carry traffic (queue 0: {q0}, queue 1: {q1})");
    // Whatever queue a flow used, the switch forwarded it: h2 saw every datagram.
    assert!(tx(&dp, 1) >= (q0 + q1).saturating_sub(8), "forwarded to h2: {} of {} received", tx(&dp, 1), q0 + q1);
    ping_ok(h1, h2);
    dp.stop().expect("no frame leaked");
}

#[test]
fn sigkill_leaves_no_xdp_program_and_a_new_daemon_starts() {
    if !require_lab("sigkill_leaves_no_xdp_program_and_a_new_daemon_starts") {
        return;
    }
    let lab = Lab::create(&prefix("d"), 2, 1, 24).unwrap();
    let port = free_port();
    let cfg_path = std::env::temp_dir().join(format!("wasmswitch-kill-{}.yaml", std::process::id()));
    std::fs::write(&cfg_path, lab_yaml(&lab, &format!("127.0.0.1:{port}"), "sleep")).unwrap();
    let bin = env!("CARGO_BIN_EXE_wasmswitch");
    // Killed with the test's thread if an assertion fails before the test kills it.
    let daemon = || {
        let mut cmd = Command::new(bin);
        cmd.args(["run", "-c"]).arg(&cfg_path).stderr(Stdio::piped());
        die_with_test(&mut cmd);
        cmd
    };
    let mut child = daemon().spawn().unwrap();
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_healthy(port, &mut child))) {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("{e:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(xdp_attached(&lab.hosts[0].switch_if), "program attached while running");
    ping_ok(&lab.hosts[0], &lab.hosts[1]);
    // h1's eth0 with an MTU above its switch-side end's: the veth drops the oversize pings on
    // h1's side, where only h1's namespace counts them.
    let h1 = &lab.hosts[0];
    h1.must(&["ip", "link", "set", "eth0", "mtu", "2000"]).unwrap();
    let _ = h1.run(&["ping", "-c", "3", "-i", "0.05", "-W", "1", "-s", "1800", "-M", "do", &lab.hosts[1].ip]);
    let dev = h1.run(&["cat", "/proc/net/dev"]).unwrap();
    let peer_dropped = dev_column(&String::from_utf8_lossy(&dev.stdout), "eth0", 11);
    assert!(peer_dropped >= 3, "h1's eth0 dropped the 3 oversize pings: {peer_dropped}");
    // The kernel's own drop counters of each socket and interface are exported, and so are
    // a veth peer's.
    let (status, body) = http(port, "GET", "/metrics").unwrap();
    assert_eq!(status, 200);
    let series = "wasmswitch_port_veth_peer_dropped_total{port=\"h1\"}";
    assert_eq!(metric_sum(&body, series), peer_dropped as f64, "{series} is h1 eth0's tx_dropped:\n{body}");
    for series in [
        "wasmswitch_afxdp_kernel_rx_ring_full_total{port=\"h1\",queue=\"0\"}",
        "wasmswitch_afxdp_kernel_rx_fill_ring_empty_total{port=\"h2\",queue=\"0\"}",
        "wasmswitch_afxdp_tx_kernel_drops_total{port=\"h1\",queue=\"0\"}",
        "wasmswitch_port_interface_dropped_total{port=\"h2\",direction=\"tx\"}",
    ] {
        assert!(body.contains(series), "{series} missing from /metrics:\n{body}");
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let t = Instant::now();
    while lab.hosts.iter().any(|h| xdp_attached(&h.switch_if)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in &lab.hosts {
        assert!(!xdp_attached(&h.switch_if), "XDP program left on {} after SIGKILL", h.switch_if);
    }
    let mut again = daemon().spawn().unwrap();
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_healthy(port, &mut again))) {
        let _ = again.kill();
        let out = again.wait_with_output().unwrap();
        panic!("restart after SIGKILL: {e:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    ping_ok(&lab.hosts[1], &lab.hosts[0]);
    sigterm(&again);
    let out = again.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&cfg_path);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("frames are back in the pool"));
    for h in &lab.hosts {
        assert!(!xdp_attached(&h.switch_if), "program detached after a clean exit");
    }
}

#[test]
fn the_pool_check_counts_every_queue_of_an_interface_without_queues() {
    // `run` opens every queue of a port without `queues:`, so `check` (and the load `run` does)
    // counts them all: a pool sized for one queue per port is refused, named.
    if !require_lab("the_pool_check_counts_every_queue_of_an_interface_without_queues") {
        return;
    }
    let lab = Lab::create(&prefix("q"), 2, 4, 25).unwrap();
    let all = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    let one = all.replace("      interface: ", "      queues: [0]\n      interface: ");
    let roomy = |y: &str| "pool:\n  frames: 262144\n".to_string() + y;
    let needed = |y: &str| Config::parse(&roomy(y), Path::new("<test>")).unwrap().frames_needed();
    let (n_all, n_one) = (needed(&all), needed(&one));
    assert!(n_all > n_one, "four queues need more frames than one: {n_all} against {n_one}");
    let small = format!("pool:\n  frames: {n_one}\n") + &all;
    let err = format!("{:#}", Config::parse(&small, Path::new("<test>")).map(|_| ()).expect_err("refused"));
    assert!(err.contains(&format!("at least {n_all} are needed")), "{err}");
    Config::parse(&(format!("pool:\n  frames: {n_one}\n") + &one), Path::new("<test>")).expect("one queue fits");
}

#[test]
fn missing_interface_is_a_clear_error() {
    if !require_lab("missing_interface_is_a_clear_error") {
        return;
    }
    let yaml = "ports:\n  - name: up\n    driver: afxdp\n    afxdp:\n      interface: wsnosuch0\n";
    let cfg = Config::parse(yaml, Path::new("<test>")).unwrap();
    let err = format!("{:#}", Dataplane::start(&cfg).err().expect("must fail"));
    assert!(err.contains("port `up`") && err.contains("wsnosuch0"), "{err}");
}

#[test]
fn zero_copy_a_driver_does_not_offer_is_refused_by_check_as_by_run() {
    // veth declares its XDP features (basic, redirect, rx-sg) without xsk-zerocopy: `run`
    // would fail at the bind, so the load `check` and `run` share refuses it, named, first.
    if !require_lab("zero_copy_a_driver_does_not_offer_is_refused_by_check_as_by_run") {
        return;
    }
    let lab = Lab::create(&prefix("z"), 2, 1, 25).unwrap();
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep");
    let zc = yaml.replacen("      interface: ", "      bind: zerocopy\n      interface: ", 1);
    assert_ne!(zc, yaml, "the lab's config has an afxdp section");
    let err = format!("{:#}", Config::parse(&zc, Path::new("<test>")).map(|_| ()).expect_err("refused"));
    assert!(
        err.contains("(driver veth) does not offer AF_XDP zero-copy")
            && err.contains("redirect")
            && err.contains("bind: copy"),
        "{err}"
    );
    let copy = yaml.replacen("      interface: ", "      bind: copy\n      interface: ", 1);
    Config::parse(&copy, Path::new("<test>")).expect("copy mode is what veth offers");
}
