//! The client commands (`status`, `ports`, `fdb`, `plugins`, `reload`) against a running daemon
//! on the sim driver, with the control API's token taken from the daemon's config.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};

use common::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

fn cli(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn client_commands_show_a_running_daemon_and_reload_it_with_its_token() {
    let dir = Scratch::new("cli");
    let port = free_port();
    let token = dir.path("token");
    std::fs::write(&token, "s3cret-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let yaml = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sim.yaml"))
        .unwrap()
        .replace("127.0.0.1:9187", &format!("127.0.0.1:{port}"))
        + "control:\n  token_file: token\n";
    let cfg = dir.write(&yaml);
    let cfg = cfg.to_str().unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg]).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    wait_healthy(port, &mut daemon);
    std::thread::sleep(std::time::Duration::from_millis(300));

    let o = cli(&["status", "-c", cfg]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains(&format!("wasmswitch at 127.0.0.1:{port}: healthy")), "{out}");
    for p in ["p0", "p1", "p2"] {
        // id, port, driver, mode, umem group: sim ports are in `copy`.
        let row = |l| -> Vec<&str> { str::split_whitespace(l).skip(1).take(4).collect() };
        assert!(out.lines().any(|l| row(l) == [p, "sim", "sim", "copy"]), "{p} in\n{out}");
    }

    let o = cli(&["ports", "--addr", &format!("127.0.0.1:{port}"), "--json"]);
    let ports: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ports["ports"].as_array().unwrap().len(), 3);
    assert!(ports["ports"][0]["rx_packets"].as_u64().unwrap() > 0, "{ports}");
    // The shipped example's ports all speak in their VLAN: none of their traffic is filtered.
    let (_, metrics) = http(port, "GET", "/metrics").unwrap();
    let filtered: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("wasmswitch_port_drops_total{") && l.contains("reason=\"vlan_filtered\""))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(filtered.is_empty(), "{filtered:?}");

    let o = cli(&["fdb", "-c", cfg]);
    let out = stdout(&o);
    assert!(o.status.success() && out.contains("(capacity 16384)") && out.contains("02:"), "{out}");

    let o = cli(&["plugins", "-c", cfg]);
    assert!(o.status.success() && stdout(&o).starts_with("port "), "{o:?}");

    // A reload needs the token: from the config it works, without it the answer says why.
    let o = cli(&["reload", "-c", cfg]);
    assert!(o.status.success() && stdout(&o).contains("changed keys: none"), "{o:?}");
    let o = cli(&["reload", "--addr", &format!("127.0.0.1:{port}")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("the daemon wants its token"), "{err}");
    let o = cli(&["reload", "--addr", &format!("127.0.0.1:{port}"), "--token-file", token.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    // A token the daemon would refuse as too short, the client refuses too (one reader).
    let short = dir.path("short");
    std::fs::write(&short, "0123456789abcde\n").unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = cli(&["reload", "--addr", &format!("127.0.0.1:{port}"), "--token-file", short.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("a token of 15 bytes: at least 16"), "{err}");
    // A file the daemon will refuse still reaches it: `-c` only finds the daemon and its token,
    // so the refusal is the daemon's (named, counted), not the client's own check that never
    // sent it (systemd's ExecReload and the reload alert saw nothing).
    let refused = || {
        let (_, m) = http(port, "GET", "/metrics").unwrap();
        m.lines().find(|l| l.starts_with("wasmswitch_reloads_total{result=\"refused\"}")).map(str::to_string)
    };
    let before = refused();
    dir.write(&(yaml.clone() + "bogus_key: 1\n"));
    let o = cli(&["reload", "-c", cfg]);
    let out = stdout(&o);
    assert!(!o.status.success() && out.contains("reload refused") && out.contains("bogus_key"), "{o:?}");
    assert_ne!(refused(), before, "counted by the daemon");
    dir.write(&yaml);

    // The build is in the exposition; a daemon that is not there is a clear error.
    let (_, metrics) = http(port, "GET", "/metrics").unwrap();
    assert!(metrics.contains("wasmswitch_build_info{version=\""), "build_info missing");
    sigterm(&daemon);
    assert!(daemon.wait().unwrap().success());
    let o = cli(&["status", "--addr", &format!("127.0.0.1:{port}")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot reach the daemon"), "{err}");
    // One that takes the connection and never answers: said so, after the 5 s the client waits.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let o = cli(&["status", "--addr", &silent.local_addr().unwrap().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("did not answer within 5s"), "{err}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = Scratch::new("jsonlog");
    let cfg = dir.write("ports:\n  - name: p0\n    driver: sim\n");
    let o = Command::new(bin()).args(["--log-format", "json", "check", "-c", cfg.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    // `check` logs nothing on success; `run` (stopped by a port that cannot open) logs
    // through the same logger.
    let cfg = dir.write(&format!(
        "metrics:\n  listen: 127.0.0.1:{}\nports:\n  - name: p0\n    driver: afxdp\n    afxdp:\n      interface: wsnosuch9\n",
        free_port()
    ));
    let o = Command::new(bin())
        .args(["--log-format", "json", "run", "-c", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let logged: Vec<serde_json::Value> = err.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(
        logged.iter().any(|v| v["level"] == "INFO" && v["msg"].as_str().unwrap_or("").contains("privileges dropped")),
        "{err}"
    );
}

#[test]
fn the_daemon_tells_systemd_when_it_is_ready_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = Scratch::new("notify");
    let sock = dir.path("notify.sock");
    let listener = UnixDatagram::bind(&sock).unwrap();
    listener.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let port = free_port();
    let cfg = dir.write(&format!("metrics:\n  listen: 127.0.0.1:{port}\nports:\n  - name: p0\n    driver: sim\n"));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg.to_str().unwrap()]).env("NOTIFY_SOCKET", &sock).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    let mut buf = [0u8; 256];
    let mut next = || {
        let n = listener.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert!(next().starts_with("READY=1"));
    // Ready means serving: the API answers at once.
    assert_eq!(http(port, "GET", "/healthz").unwrap().0, 200);
    signal(&daemon, libc::SIGHUP);
    assert!(next().starts_with("RELOADING=1\nMONOTONIC_USEC="));
    assert_eq!(next(), "READY=1\nSTATUS=reloaded");
    sigterm(&daemon);
    assert_eq!(next(), "STOPPING=1");
    assert!(daemon.wait().unwrap().success());
}

/// A SIGHUP that comes while a reload runs is not lost: one more reload follows it and reads
/// the file as it is then. Before, it was ignored with a warning, and an edit made after the
/// running reload read the file stayed out until some later reload.
#[test]
fn a_sighup_during_a_reload_is_followed_by_a_reload_of_its_own() {
    use std::os::unix::net::UnixDatagram;
    let dir = Scratch::new("hup-during-reload");
    let sock = dir.path("notify.sock");
    let listener = UnixDatagram::bind(&sock).unwrap();
    listener.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let port = free_port();
    // An init that spins some 0.1-0.5 s of CPU (under the 1 s bound): the reload that brings
    // the plugin in runs it for the check and for each worker's instance, so it takes a while.
    let spin = "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1)))
                  (br_if $l (i32.lt_u (local.get $i) (i32.const 150000000))))";
    let pass = "(i32.store (i32.const 32) (i32.const 32768))
        (i32.store (i32.const 36) (i32.mul (i32.load16_u offset=2 (local.get 0)) (i32.const 4)))
        (memory.fill (i32.const 32768) (i32.const 0) (i32.load (i32.const 36)))
        (return (i32.const 32))";
    std::fs::write(dir.path("slow.wasm"), plugin_with_init_and_process(spin, pass)).unwrap();
    let head = format!("metrics:\n  listen: 127.0.0.1:{port}\nports:\n  - name: p0\n    driver: sim\n");
    let with_plugin = format!("{head}    plugins:\n      - name: slow\n        path: slow.wasm\n");
    let cfg = dir.write(&head);
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &sock)
        .env("WASMSWITCH_CACHE_DIR", dir.path("cache"))
        .stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let daemon = cmd.spawn().unwrap();
    let mut buf = [0u8; 256];
    let mut next = || {
        let n = listener.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert!(next().starts_with("READY=1"));
    std::fs::write(&cfg, &with_plugin).unwrap();
    signal(&daemon, libc::SIGHUP);
    assert!(next().starts_with("RELOADING=1"));
    // An edit and a SIGHUP while that reload runs (written aside and renamed, as editors do:
    // the reload may be reading the file right now, and must see all of one version).
    let edited = dir.path("edited.yaml");
    std::fs::write(&edited, format!("switch:\n  batch: 32\n{with_plugin}")).unwrap();
    std::fs::rename(&edited, &cfg).unwrap();
    // Three of them (the reload runs some 0.2 s at least): they ask for one reload, said once.
    for _ in 0..3 {
        signal(&daemon, libc::SIGHUP);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(next(), "READY=1\nSTATUS=reloaded");
    assert!(next().starts_with("RELOADING=1"), "a second reload follows the first");
    assert_eq!(next(), "READY=1\nSTATUS=reloaded");
    let (st, body) = http(port, "GET", "/api/v1/config").unwrap();
    let running: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((st, &running["switch"]["batch"]), (200, &serde_json::json!(32)), "the edit is live: {body}");
    sigterm(&daemon);
    let out = daemon.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(log.matches("SIGHUP during a reload or shadow change: one more reload follows it").count(), 1, "{log}");
    assert_eq!(log.matches("reload: applied").count(), 2, "{log}");
}

/// `check` runs each plugin on the plugin host's built-in frames: a good one gets a line with
/// its verdicts, a redirect to a port the config lacks a warning, and a plugin that traps on
/// one kind of frame fails the check in one line naming the port, plugin and frame.
/// `--no-smoke` only loads and initialises.
#[test]
fn check_runs_each_plugin_on_built_in_frames() {
    let dir = Scratch::new("smoke");
    let n = wasmswitch_plugin_host::smoke_frames().len();
    // Verdicts: `count` records of `verdict` (4 bytes each) at 32768, (ptr, len) at 32.
    let answer = |verdict: u32| {
        format!(
            "(local.set 1 (i32.mul (i32.load16_u offset=2 (local.get 0)) (i32.const 4)))
             (i32.store (i32.const 32) (i32.const 32768))
             (i32.store (i32.const 36) (local.get 1))
             (loop $l
               (local.set 1 (i32.sub (local.get 1) (i32.const 4)))
               (i32.store offset=32768 (local.get 1) (i32.const {verdict}))
               (br_if $l (local.get 1)))
             (return (i32.const 32))"
        )
    };
    std::fs::write(dir.path("pass.wasm"), plugin_with_process(&answer(0))).unwrap();
    // Redirect (kind 2) to port 9.
    std::fs::write(dir.path("away.wasm"), plugin_with_process(&answer(0x0009_0002))).unwrap();
    // Host-copy (kind 4), in a config without a host port.
    std::fs::write(dir.path("copy.wasm"), plugin_with_process(&answer(4))).unwrap();
    // Traps when the first packet's ethertype (metadata offset 6) is ARP.
    let arp = format!(
        "(if (i32.eq (i32.load16_u offset=22 (local.get 0)) (i32.const 0x0806)) (then unreachable)) {}",
        answer(0)
    );
    std::fs::write(dir.path("arp.wasm"), plugin_with_process(&arp)).unwrap();
    let plugin = |name: &str| format!("    plugins:\n      - name: {name}\n        path: {name}.wasm\n");
    let config = |p0: &str, p1: &str| {
        dir.write(&format!(
            "ports:\n  - name: p0\n    driver: sim\n{}  - name: p1\n    driver: sim\n{}",
            plugin(p0),
            plugin(p1)
        ))
    };
    let check = |cfg: &std::path::Path, extra: &[&str]| {
        let o = Command::new(bin()).arg("check").args(extra).arg("-c").arg(cfg).output().unwrap();
        (o.status.success(), stdout(&o), String::from_utf8_lossy(&o.stderr).into_owned())
    };

    let (ok, out, err) = check(&config("pass", "away"), &[]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("port `p0`, plugin `pass`: ok on {n} frames (pass {n}); slowest batch: ")), "{out}");
    assert!(
        out.contains(&format!("port `p1`, plugin `away`: ok on {n} frames (redirect {n}); slowest batch: ")),
        "{out}"
    );
    // The costliest batch of 64 (the default `switch.batch`), against the default deadline.
    assert!(out.contains("(batch of 64 copies), ") || out.contains("a batch of 64 mixed frames, "), "{out}");
    assert!(out.contains(" µs of CPU, ") && out.contains(" % of deadline_us 5000\n"), "{out}");
    assert!(!err.contains("deadline"), "no deadline warning: {err}");
    assert!(
        err.contains(
            "warning: port `p1`, plugin `away`: redirects `ARP request` to port 9, but the config has ports 0-1"
        ),
        "{err}"
    );

    let (ok, out, err) = check(&config("pass", "copy"), &[]);
    assert!(ok && out.contains(&format!("plugin `copy`: ok on {n} frames (host-copy {n})")), "{out}{err}");
    assert!(err.contains(&format!("warning: port `p1`, plugin `copy`: answers `host` or `host-copy` (0 and {n} of the test frames), but the config has no host port")), "{err}");

    let cfg = config("pass", "arp");
    let (ok, out, err) = check(&cfg, &[]);
    assert!(!ok, "{out}");
    let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or_default();
    assert!(
        line.starts_with("error: port `p1`: plugin `arp`: smoke run: trap on frame `ARP request` (batch of 1): "),
        "{err}"
    );
    assert!(line.contains("unreachable"), "{err}");
    assert!(out.contains(&format!("port `p0`, plugin `pass`: ok on {n} frames")), "the others still run: {out}");
    // Every faulty plugin is named, each in its line.
    let (ok, _, err) = check(&config("arp", "arp"), &[]);
    assert!(
        !ok && err.contains("error: 2 plugins failed the smoke run:\n  port `p0`: plugin `arp`: smoke run: trap"),
        "{err}"
    );
    assert!(err.contains("\n  port `p1`: plugin `arp`: smoke run: trap on frame `ARP request`"), "{err}");
    // A faulting shadow plugin only warns: its verdicts are never applied.
    let (ok, _, err) = check(
        &dir.write(&format!(
            "ports:\n  - name: p0\n    driver: sim\n{}    shadow:\n      - name: arp\n        path: arp.wasm\n",
            plugin("pass")
        )),
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: port `p0` (shadow chain): plugin `arp`: smoke run: trap on frame `ARP request`"),
        "{err}"
    );
    let (ok, out, err) = check(&cfg, &["--no-smoke"]);
    assert!(ok && !out.contains("ok on"), "{out}{err}");

    // A real plugin, when built: the ACL dropping TCP to port 80 (the SYN and the full-size frame).
    if let Some(acl) = example_plugin("acl") {
        let cfg = dir.write(&format!(
            "ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: acl\n        path: {}\n        config: \"deny proto=tcp dport=80\"\n",
            acl.display()
        ));
        let (ok, out, err) = check(&cfg, &[]);
        assert!(ok && out.contains(&format!("plugin `acl`: ok on {n} frames (pass {}, drop 2)", n - 2)), "{out}{err}");
    }
}

#[test]
fn check_warns_of_an_interface_this_machine_lacks() {
    let dir = Scratch::new("check-noif");
    let cfg = dir.write("ports:\n  - name: p0\n    driver: afxdp\n    afxdp:\n      interface: wsnosuch9\n");
    let o = Command::new(bin()).arg("check").arg("-c").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // A config for another machine: accepted, and what `run` here would refuse is said.
    assert!(o.status.success(), "{o:?}");
    assert!(err.contains("warning: port `p0`: interface wsnosuch9 does not exist here"), "{err}");
}

#[test]
fn check_warns_of_a_listen_address_this_machine_lacks() {
    let dir = Scratch::new("check-noaddr");
    let token = dir.path("token");
    std::fs::write(&token, "s3cret-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ports = "ports:\n  - name: p0\n    driver: sim\n";
    // 192.0.2.0/24 is TEST-NET-1: documentation only, on no machine.
    let cfg = dir.write(&format!("metrics:\n  listen: 192.0.2.1:9187\ncontrol:\n  token_file: token\n{ports}"));
    let o = Command::new(bin()).arg("check").arg("-c").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(err.contains("warning: metrics.listen 192.0.2.1:9187: this machine has no address 192.0.2.1"), "{err}");
    // Loopback, even on a port something listens on (a running daemon of this config), is no warning.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = dir.write(&format!("metrics:\n  listen: {}\n{ports}", busy.local_addr().unwrap()));
    let o = Command::new(bin()).arg("check").arg("-c").arg(&cfg).output().unwrap();
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("warning"), "{o:?}");
}

#[test]
fn a_command_that_prints_into_a_closed_pipe_dies_quietly() {
    // `wasmswitch fdb | head -1`: the reader goes, the next line hits a closed pipe. That is
    // SIGPIPE's default, a quiet end, not a panic with a backtrace.
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let dir = Scratch::new("pipe");
    let cfg = dir.write("ports:\n  - name: p0\n    driver: sim\n");
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two descriptors; both are owned below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: a fresh descriptor from pipe(2), owned by nothing else.
    drop(unsafe { OwnedFd::from_raw_fd(fds[0]) });
    // SAFETY: as above, the other end.
    let write = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    let out = Command::new(bin()).args(["check", "-c"]).arg(&cfg).stdout(Stdio::from(write)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn check_warns_of_a_tap_that_exists_already() {
    if !require_lab("check_warns_of_a_tap_that_exists_already") {
        return;
    }
    struct Tap(String);
    impl Drop for Tap {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }
    let tap = Tap(format!("wck{}t", std::process::id() % 10_000));
    let made = Command::new("ip").args(["tuntap", "add", "dev", &tap.0, "mode", "tap"]).status().unwrap();
    assert!(made.success(), "ip tuntap add {}", tap.0);
    let dir = Scratch::new("check-tap");
    let cfg = dir.write(&format!("ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: {}\n", tap.0));
    let o = Command::new(bin()).arg("check").arg("-c").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(
        err.contains(&format!(
            "warning: host.tap {} exists on this machine, so a new `run` here would refuse it",
            tap.0
        )),
        "{err}"
    );
}

/// `check` (and `run`, in its log) warns where an interface here contradicts its port: an MTU
/// above the port's (its hosts' full-size frames would be dropped as oversize, and TCP stall),
/// one below it, and generic mode on a veth. A port that agrees with its interface says nothing.
#[test]
fn check_warns_of_an_interface_mtu_or_mode_that_would_hurt_traffic() {
    if !require_lab("check_warns_of_an_interface_mtu_or_mode_that_would_hurt_traffic") {
        return;
    }
    struct Veth(String);
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }
    let id = std::process::id() % 10_000;
    let pairs: Vec<Veth> = ["a", "b", "c", "d"]
        .iter()
        .map(|x| {
            let (end, peer) = (format!("wcm{id}{x}"), format!("wcm{id}{x}p"));
            let made = Command::new("ip").args(["link", "add", &end, "type", "veth", "peer", "name", &peer]).status();
            assert!(made.unwrap().success(), "ip link add {end}");
            Veth(end)
        })
        .collect();
    let set_mtu = |v: &Veth, mtu: &str| {
        assert!(Command::new("ip").args(["link", "set", &v.0, "mtu", mtu]).status().unwrap().success());
    };
    set_mtu(&pairs[0], "3000");
    set_mtu(&pairs[1], "1400");
    let dir = Scratch::new("check-iface");
    let port = |name: &str, v: &Veth, extra: &str| {
        format!("  - name: {name}\n    driver: afxdp\n    afxdp:\n      interface: {}\n{extra}", v.0)
    };
    let cfg = dir.write(&format!(
        "metrics:\n  listen: 127.0.0.1:{}\nports:\n{}{}{}{}",
        free_port(),
        port("big", &pairs[0], ""),
        port("small", &pairs[1], ""),
        port("slow", &pairs[2], "      mode: generic\n"),
        port("fine", &pairs[3], ""),
    ));
    let o = Command::new(bin()).arg("check").arg("-c").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "warnings only: {o:?}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: port `")).collect();
    assert_eq!(warnings.len(), 3, "{err}");
    assert!(
        warnings[0].contains(&format!("port `big`: interface {} has MTU 3000, above the port's mtu 1500: frames of more than 1522 bytes from it are dropped as oversize", pairs[0].0))
            && warnings[0].contains("`mtu: 3000` needs a larger pool.frame_size (its 2048-byte frames hold 1770 at most)"),
        "{err}"
    );
    assert!(
        warnings[1].contains("port `small`: interface")
            && warnings[1].contains("has MTU 1400, below the port's mtu 1500"),
        "{err}"
    );
    assert!(
        warnings[2].contains("port `slow`: interface") && warnings[2].contains("is a veth in generic (SKB) mode"),
        "{err}"
    );
    drop(pairs);
}
