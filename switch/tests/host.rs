//! The host port (issue 4): a TAP served over io_uring by host workers, cpumap style.
//! Needs root (TUN, namespaces); skipped with a reason elsewhere, a failure under CI=true.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use wasmswitch_core::PortId;

use common::*;
use wasmswitch::config::Config;
use wasmswitch::dataplane::{Command as WorkerCommand, Dataplane};
use wasmswitch::demo::lab_yaml;
use wasmswitch::lab::Lab;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};

fn tap_name(tag: &str) -> String {
    format!("wt{tag}{}t", std::process::id() % 10_000)
}

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Waits (up to 5 s) for `name` to disappear: the kernel drops io_uring's registered-file
/// references asynchronously, so the last TAP reference can outlive our close by a moment.
fn gone_soon(name: &str) -> bool {
    let t = Instant::now();
    while link_exists(name) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("{name} gone after {:?}", t.elapsed());
    !link_exists(name)
}

fn host_section(tap: &str, ring: usize) -> String {
    format!("host:\n  name: host\n  tap: {tap}\n  mac: 02:ee:00:00:00:01\n  ring_size: {ring}\n  bulk: 8\n")
}

/// A daemon's config: the sim ports and a host port on `tap`, the API on `port`.
fn daemon_yaml(port: u16, tap: &str) -> String {
    format!("metrics:\n  listen: 127.0.0.1:{port}\n") + &sim_yaml("rate_pps: 1000", &host_section(tap, 1024))
}

/// Sends every `every`-th packet (and only those) to the host.
struct ToHost {
    every: usize,
    n: usize,
}

impl VerdictStage for ToHost {
    fn run(&mut self, _b: &BatchView<'_>, verdicts: &mut [Verdict]) {
        for v in verdicts {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                *v = Verdict::Host;
            }
        }
    }
}

fn sim_yaml(rate: &str, extra: &str) -> String {
    format!(
        "pool:\n  frames: 16384\nworkers:\n  - idle: sleep\nports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        {rate}\n        src_macs: 8\n  - name: p1\n    driver: sim\n    sim:\n      traffic:\n        rate_pps: 20000\n        src_macs: 8\n{extra}"
    )
}

/// A packet socket bound to `ifname`, receiving everything.
struct PacketSocket(i32);

impl PacketSocket {
    fn bind(ifname: &str) -> PacketSocket {
        let idx = wasmswitch_sys::ifindex(ifname).expect("interface exists");
        // SAFETY: plain socket creation; the fd is owned by the returned value.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, (libc::ETH_P_ALL as u16).to_be() as i32) };
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        // SAFETY: sockaddr_ll is plain data, zero is a valid value for every field.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = idx as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and the length matches it.
        let rc = unsafe {
            libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32)
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
        // SAFETY: `tv` is a valid timeval for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        PacketSocket(fd)
    }

    fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: `buf` is writable for its whole length.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        buf.truncate(n as usize);
        Some(buf)
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}

#[test]
fn host_reaches_a_namespace_host_through_the_switch() {
    if !require_lab("host_reaches_a_namespace_host_through_the_switch") {
        return;
    }
    let lab = Lab::create(&format!("wte{}", std::process::id() % 10_000), 1, 1, 26).unwrap();
    let tap = tap_name("e");
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep") + &host_section(&tap, 1024);
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    let ok = Command::new("ip").args(["addr", "add", "10.77.26.254/24", "dev", &tap]).status().unwrap();
    assert!(ok.success());
    let out = Command::new("ping").args(["-c", "3", "-i", "0.2", "-W", "1", "10.77.26.1"]).output().unwrap();
    assert!(out.status.success(), "host -> h1 through TAP and AF_XDP: {}", String::from_utf8_lossy(&out.stdout));
    assert!(lab.hosts[0].ping("10.77.26.254", 3).unwrap(), "h1 -> host");
    let tap_stats =
        dp.ports.get(PortId(1)).unwrap().driver.host().map(|h| h.stats.clone()).expect("host port has TAP stats");
    // `delivered` moves after the write completes, which can be after ping read the reply:
    // poll it (bounded) rather than read it once.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut t = tap_stats.totals();
    while !(t.delivered >= 3 && t.tap_rx_packets >= 3) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        t = tap_stats.totals();
    }
    assert!(t.delivered >= 3 && t.tap_rx_packets >= 3, "both directions went through the TAP: {t:?}");
    dp.stop().expect("no frame leaked");
    drop(dp);
    assert!(gone_soon(&tap), "TAP removed on exit");
}

#[test]
fn host_verdict_lands_frames_on_the_tap() {
    if !require_lab("host_verdict_lands_frames_on_the_tap") {
        return;
    }
    let tap = tap_name("f");
    let cfg = Config::parse(&sim_yaml("rate_pps: 2000", &host_section(&tap, 1024)), Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    let sock = PacketSocket::bind(&tap);
    dp.broadcast(|_| WorkerCommand::SetIngress(PortId(0), Some(Box::new(ToHost { every: 1, n: 0 }))));
    let t = Instant::now();
    let mut seen = 0;
    while seen < 20 && t.elapsed() < Duration::from_secs(5) {
        if let Some(f) = sock.recv() {
            // Generator frames of port p0: source MAC 02:00:00:..., UDP to port 5001.
            if f.len() >= 38 && f[6..9] == [2, 0, 0] && f[36..38] == 5001u16.to_be_bytes() {
                seen += 1;
            }
        }
    }
    assert!(seen >= 20, "frames with verdict host appear on the TAP ({seen} seen)");
    dp.stop().expect("no frame leaked");
}

#[test]
fn ring_full_under_a_flood_drops_counted_forwarding_goes_on_no_leak() {
    if !require_lab("ring_full_under_a_flood_drops_counted_forwarding_goes_on_no_leak") {
        return;
    }
    let tap = tap_name("g");
    // Unlimited traffic on p0, half of it to the host through tiny rings.
    let yaml = sim_yaml("flows: 64", &host_section(&tap, 16)).replace("  - idle: sleep\n", "  - idle: poll\n");
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    dp.broadcast(|_| WorkerCommand::SetIngress(PortId(0), Some(Box::new(ToHost { every: 2, n: 0 }))));
    std::thread::sleep(Duration::from_millis(300));
    let tx_p1 = |dp: &Dataplane| dp.workers.iter().map(|w| w.stats.ports[1].tx_packets.get()).sum::<u64>();
    let before = tx_p1(&dp);
    std::thread::sleep(Duration::from_millis(700));
    let t = dp.ports.get(PortId(2)).unwrap().driver.host().unwrap().stats.totals();
    assert!(t.ring_full > 0, "a flood into 16-entry rings overflows them: {t:?}");
    assert!(t.delivered > 0, "the host still gets what fits");
    assert!(tx_p1(&dp) > before + 1000, "the datapath keeps forwarding its other traffic");
    assert!(dp.healthy());
    dp.stop().expect("no frame leaked despite the drops");
}

#[test]
fn a_deleted_tap_stops_the_host_port_named_and_counted() {
    if !require_lab("a_deleted_tap_stops_the_host_port_named_and_counted") {
        return;
    }
    let tap = tap_name("d");
    let cfg = Config::parse(&sim_yaml("rate_pps: 20000", &host_section(&tap, 1024)), Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    dp.broadcast(|_| WorkerCommand::SetIngress(PortId(0), Some(Box::new(ToHost { every: 2, n: 0 }))));
    let host = dp.ports.id_of("host").unwrap();
    let info = |dp: &Dataplane| dp.ports.get(host).unwrap();
    let tx_p1 = |dp: &Dataplane| dp.workers.iter().map(|w| w.stats.ports[1].tx_packets.get()).sum::<u64>();
    std::thread::sleep(Duration::from_millis(300));
    assert!(info(&dp).driver.host().unwrap().stats.totals().delivered > 0, "the host gets frames");
    let ok = Command::new("ip").args(["link", "del", &tap]).status().unwrap();
    assert!(ok.success());
    eventually("the host port is marked gone", || info(&dp).gone.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(info(&dp).gone_events.load(std::sync::atomic::Ordering::Relaxed), 1);
    let before = tx_p1(&dp);
    std::thread::sleep(Duration::from_millis(500));
    assert!(tx_p1(&dp) > before + 1000, "the other ports keep forwarding");
    assert!(dp.healthy());
    dp.stop().expect("no frame leaked, those the host port held included");
}

#[test]
fn tap_is_gone_after_sigkill_and_the_switch_restarts_cleanly() {
    if !require_lab("tap_is_gone_after_sigkill_and_the_switch_restarts_cleanly") {
        return;
    }
    let tap = tap_name("h");
    let port = free_port();
    let yaml = daemon_yaml(port, &tap);
    let path = std::env::temp_dir().join(format!("wasmswitch-tap-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    let bin = env!("CARGO_BIN_EXE_wasmswitch");
    let mut cmd = Command::new(bin);
    cmd.args(["run", "-c"]).arg(&path);
    die_with_test(&mut cmd);
    let mut child = cmd.stderr(Stdio::null()).spawn().unwrap();
    wait_healthy(port, &mut child);
    assert!(link_exists(&tap), "TAP exists while running");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(gone_soon(&tap), "TAP gone after SIGKILL");
    let mut cmd = Command::new(bin);
    cmd.args(["run", "-c"]).arg(&path);
    die_with_test(&mut cmd);
    let mut again = cmd.stderr(Stdio::piped()).spawn().unwrap();
    wait_healthy(port, &mut again);
    let (_, metrics) = http(port, "GET", "/metrics").unwrap();
    assert!(metrics.contains("wasmswitch_host_batch_size_bucket"), "host metrics exported");
    sigterm(&again);
    let out = again.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(gone_soon(&tap), "TAP gone after a clean exit");
}

#[test]
fn the_api_refuses_a_static_entry_for_the_hosts_address_on_another_port() {
    // Learning never lets a frame pull host.mac to another port; neither may a static entry.
    if !require_lab("the_api_refuses_a_static_entry_for_the_hosts_address_on_another_port") {
        return;
    }
    use wasmswitch::api::FdbChange;
    let (sw, _dir) = InProcess::start("s", "host-static");
    let mac = "02:ee:00:00:00:01".parse().unwrap();
    let e = sw.fdb_change(FdbChange::Add { mac, vlan: 1, port: "p0".into() }).unwrap_err();
    assert!(e.contains("is the host port's own address (host.mac): it is on `host`"), "{e}");
    assert!(!sw.dataplane.fdb.get().entries(0).iter().any(|x| x.mac == mac && x.is_static), "nothing added");
    sw.fdb_change(FdbChange::Add { mac, vlan: 1, port: "host".into() }).expect("on the host port itself it may be");
    sw.stop();
}

#[test]
fn a_shadow_promote_or_discard_on_the_host_port_is_refused_by_name() {
    // The host port's index is past the ports' (it takes no plugins): this indexed past them
    // and panicked.
    if !require_lab("a_shadow_promote_or_discard_on_the_host_port_is_refused_by_name") {
        return;
    }
    use wasmswitch::dataplane::ShadowOp;
    let (sw, _dir) = InProcess::start("p", "host-shadow");
    for op in [ShadowOp::Promote, ShadowOp::Discard] {
        let e = sw.shadow("host", op).unwrap_err().to_string();
        assert!(e.contains("port `host` has no shadow chain"), "{e}");
    }
    sw.stop();
}

/// A switch in this process: one sim port at 1000 pps and a host port on TAP `tap_name(tag)`.
struct InProcess {
    sw: wasmswitch::daemon::Switch,
    tap: String,
}

impl InProcess {
    fn start(tag: &str, scratch: &str) -> (InProcess, Scratch) {
        let tap = tap_name(tag);
        let dir = Scratch::new(scratch);
        let sw = wasmswitch::daemon::Switch::start(&dir.write(&sim_yaml("rate_pps: 1000", &host_section(&tap, 1024))))
            .unwrap();
        (InProcess { sw, tap }, dir)
    }

    /// Stops it: every frame back, and the TAP gone.
    fn stop(self) {
        self.sw.dataplane.stop_shared().expect("every frame back");
        drop(self.sw);
        assert!(gone_soon(&self.tap));
    }
}

impl std::ops::Deref for InProcess {
    type Target = wasmswitch::daemon::Switch;
    fn deref(&self) -> &Self::Target {
        &self.sw
    }
}

#[test]
fn a_restart_right_after_a_clean_exit_takes_its_tap_again() {
    // The TAP of a daemon that has just exited lingers for tens of milliseconds (io_uring
    // gives its file back from a kernel worker): a restart with no pause in between (a unit's
    // restart, an operator's) must wait for it, not fail on its name.
    if !require_lab("a_restart_right_after_a_clean_exit_takes_its_tap_again") {
        return;
    }
    let tap = tap_name("r");
    let port = free_port();
    let yaml = daemon_yaml(port, &tap);
    let scratch = Scratch::new("tap-restart");
    let path = scratch.path("switch.yaml");
    std::fs::write(&path, yaml).unwrap();
    for round in 1..=4 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmswitch"));
        cmd.args(["run", "-c"]).arg(&path).stderr(Stdio::piped());
        die_with_test(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        wait_healthy(port, &mut child);
        sigterm(&child);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "run {round}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(gone_soon(&tap), "TAP gone after the last exit");
}

/// A TCP transfer of 2 s from `client` (a command prefix) to `server_ip:port`; the bytes sent.
fn iperf_tcp(client: &mut Command, server_ip: &str, port: u16) -> u64 {
    let out = client
        .args(["timeout", "20", "iperf3", "-J", "--connect-timeout", "3000", "-t", "2", "-p", &port.to_string()])
        .args(["-c", server_ip])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(j.get("error").is_none(), "TCP to {server_ip}:{port}: {}", j["error"]);
    j["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0)
}

#[test]
fn tcp_between_the_host_and_a_namespace_both_ways() {
    // The namespace's veth offloads its TX checksum (the kernel's default): its segments reach
    // the TAP only because the switch completes their checksums.
    if !require_lab("tcp_between_the_host_and_a_namespace_both_ways") {
        return;
    }
    let lab = Lab::create(&format!("wti{}", std::process::id() % 10_000), 1, 1, 27).unwrap();
    let tap = tap_name("i");
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep") + &host_section(&tap, 1024);
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    let ok = Command::new("ip").args(["addr", "add", "10.77.27.254/24", "dev", &tap]).status().unwrap();
    assert!(ok.success());
    let h1 = &lab.hosts[0];
    assert!(h1.ping("10.77.27.254", 3).unwrap(), "h1 -> host");
    // Namespace -> host: the server listens on the TAP's address in our namespace.
    let port = free_port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "10.77.27.254", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let up = iperf_tcp(&mut h1.cmd(&[]), "10.77.27.254", port);
    let _ = server.kill();
    let _ = server.wait();
    // Host -> namespace.
    let mut server =
        h1.cmd(&["iperf3", "-s", "-1", "-p", "5201"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let down = iperf_tcp(&mut Command::new("env"), &h1.ip, 5201);
    let _ = server.kill();
    let _ = server.wait();
    eprintln!("TCP h1 -> host {up} bytes, host -> h1 {down} bytes in 2 s each");
    assert!(up > 1 << 20 && down > 1 << 20, "both directions moved data: up {up}, down {down}");
    dp.stop().expect("no frame leaked");
}

#[test]
fn a_deleted_tap_is_one_error_line_with_what_to_do() {
    // The host worker's reads then fail (EBADFD) too; that is the same event, not a second error.
    if !require_lab("a_deleted_tap_is_one_error_line_with_what_to_do") {
        return;
    }
    let tap = tap_name("x");
    let port = free_port();
    let dir = Scratch::new("tap-deleted");
    let cfg = dir.write(&daemon_yaml(port, &tap));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmswitch"));
    cmd.args(["run", "-c"]).arg(&cfg).stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    assert!(Command::new("ip").args(["link", "del", &tap]).status().unwrap().success());
    eventually("the host port is reported gone", || {
        http(port, "GET", "/api/v1/ports").is_ok_and(|(_, b)| b.contains("\"link\":\"gone\""))
    });
    // Long enough for the host worker's read-failure streak to end in its own line.
    std::thread::sleep(Duration::from_millis(500));
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains(&format!("TAP {tap} was deleted")) && errors[0].contains("restart the daemon"), "{log}");
}

#[test]
fn a_frame_over_the_host_mtu_from_the_tap_is_dropped_as_oversize_never_forwarded_cut_short() {
    // The TAP's MTU raised by hand above `host.mtu` (at its largest, 1769 with 2048-byte frames):
    // the host sends frames longer than the read of the TAP takes. Each is dropped and counted;
    // none reaches the namespace cut short (which it did at `host.mtu` 1770, where a cut frame
    // filled the read exactly).
    if !require_lab("a_frame_over_the_host_mtu_from_the_tap_is_dropped_as_oversize_never_forwarded_cut_short") {
        return;
    }
    let lab = Lab::create(&format!("wto{}", std::process::id() % 10_000), 1, 1, 28).unwrap();
    let tap = tap_name("o");
    let yaml =
        lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep") + &host_section(&tap, 1024) + "  mtu: 1769\n";
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    for args in [["addr", "add", "10.77.28.254/24", "dev", &tap].as_slice(), &["link", "set", &tap, "mtu", "3000"]] {
        assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
    }
    let h1 = &lab.hosts[0];
    assert!(h1.ping("10.77.28.254", 3).unwrap(), "h1 -> host");
    let host = dp.ports.id_of("host").unwrap().index();
    let oversize = || -> u64 {
        dp.workers
            .iter()
            .map(|w| w.stats.ports[host].drops[wasmswitch_core::stats::DropReason::Oversize as usize].get())
            .sum()
    };
    let truncated = || -> u64 {
        let out = h1.run(&["nstat", "-az", "IpExtInTruncatedPkts"]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("IpExtInTruncatedPkts")?.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let (before, cut_before) = (oversize(), truncated());
    // 2528-byte IP packets, not fragmented: 2542-byte frames from the TAP.
    let out = Command::new("ping")
        .args(["-c", "5", "-i", "0.2", "-W", "1", "-s", "2500", "-M", "do", &h1.ip])
        .output()
        .unwrap();
    assert!(!out.status.success(), "no reply can come: {}", String::from_utf8_lossy(&out.stdout));
    assert!(oversize() >= before + 5, "each counted as oversize: {} -> {}", before, oversize());
    assert_eq!(truncated(), cut_before, "nothing reached h1 cut short");
    dp.stop().expect("no frame leaked");
}

#[test]
fn a_tap_set_down_stops_the_host_port_as_a_link_down_does() {
    // As an AF_XDP port whose link goes down: stopped (nothing queued for it, so no failed
    // writes), counted and reported, and forwarding again once the TAP is up.
    if !require_lab("a_tap_set_down_stops_the_host_port_as_a_link_down_does") {
        return;
    }
    let lab = Lab::create(&format!("wtd{}", std::process::id() % 10_000), 1, 1, 29).unwrap();
    let tap = tap_name("d");
    let yaml = lab_yaml(&lab, &format!("127.0.0.1:{}", free_port()), "sleep") + &host_section(&tap, 1024);
    let cfg = Config::parse(&yaml, Path::new("<test>")).unwrap();
    let mut dp = Dataplane::start(&cfg).unwrap();
    let ip = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
    ip(&["addr", "add", "10.77.29.254/24", "dev", &tap]);
    let h1 = &lab.hosts[0];
    assert!(h1.ping("10.77.29.254", 3).unwrap(), "h1 -> host");
    let id = dp.ports.id_of("host").unwrap();
    let info = || dp.ports.get(id).unwrap();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    ip(&["link", "set", &tap, "down"]);
    eventually("the host port is stopped", || info().link_down.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(count(&info().down_events), 1);
    let errors = info().driver.host().unwrap().stats.totals().write_errors;
    // Unicast to the host (its MAC is learned) and broadcasts: nothing is queued for it.
    assert!(!h1.ping("10.77.29.254", 2).unwrap());
    let _ = h1.run(&["ping", "-b", "-c", "3", "-i", "0.2", "-W", "1", "10.77.29.255"]);
    assert_eq!(info().driver.host().unwrap().stats.totals().write_errors, errors, "no write to a TAP that is down");
    ip(&["link", "set", &tap, "up"]);
    eventually("the host port forwards again", || !info().link_down.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(count(&info().up_events), 1);
    assert!(h1.ping("10.77.29.254", 3).unwrap(), "h1 -> host again");
    dp.stop().expect("no frame leaked");
}
