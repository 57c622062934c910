//! Least privilege, read back from the kernel: the daemon runs the AF_XDP lab holding exactly
//! the documented capabilities (`privileges::KEPT`), with no-new-privileges, as `nobody`, both
//! when root starts it with `user: nobody` and when it is started as `nobody` with those
//! capabilities as ambient ones; and a reload that adds an AF_XDP port still works with them.
//! Needs root; fails under CI=true when it cannot run.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use wasmswitch::demo::lab_yaml;
use wasmswitch::lab::Lab;
use wasmswitch::privileges::{kept_mask, KEPT};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

/// The value of `key` in /proc/PID/status.
fn status(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key}"));
    line[key.len() + 1..].trim().to_string()
}

fn caps(pid: u32, key: &str) -> u64 {
    u64::from_str_radix(&status(pid, key), 16).unwrap()
}

fn spawn(mut cmd: Command, port: u16) -> Child {
    cmd.stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    child
}

/// Checks the running daemon's credentials, then its forwarding and a reload that opens an
/// AF_XDP port with only those capabilities, then a clean stop.
fn exercise(lab: &Lab, dir: &Scratch, all: &str, mut child: Child, port: u16, bounding_dropped: bool) {
    let pid = child.id();
    assert_eq!(status(pid, "Uid"), "65534\t65534\t65534\t65534", "runs as nobody");
    assert_eq!(caps(pid, "CapEff"), kept_mask(), "CapEff is exactly {KEPT:?}");
    assert_eq!(caps(pid, "CapPrm"), kept_mask());
    assert_eq!(caps(pid, "CapInh") | caps(pid, "CapAmb"), 0, "nothing passes on to children");
    if bounding_dropped {
        assert_eq!(caps(pid, "CapBnd"), kept_mask(), "the bounding set holds only the kept ones");
    }
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    let (h1, h2, h3) = (&lab.hosts[0], &lab.hosts[1], &lab.hosts[2]);
    assert!(h1.ping(&h2.ip, 2).unwrap(), "h1 reaches h2");
    dir.write(all);
    let (st, body) = http(port, "POST", "/api/v1/reload").unwrap();
    assert_eq!(st, 200, "a reload opening an AF_XDP port with the kept capabilities: {body}");
    assert!(body.contains("port `h3` added"), "{body}");
    assert!(h3.ping(&h1.ip, 2).unwrap(), "h3 reaches h1 through the port the reload added");
    sigterm(&child);
    let status = child.wait().unwrap();
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(status.success(), "{log}");
    assert!(log.contains("privileges dropped") && log.contains("frames are back in the pool"), "{log}");
    assert!(!log.contains("cannot be read after dropping privileges"), "{log}");
    if all.contains("name: pass") {
        assert!(log.contains("plugins are compiled at every start"), "the unwritable cache is named: {log}");
    }
    for h in &lab.hosts {
        assert!(!xdp_attached(&h.switch_if), "no XDP program left on {}", h.switch_if);
    }
}

/// The lab's config without h3's port, and with it.
fn configs(lab: &Lab, port: u16, extra: &str) -> (String, String) {
    let all = format!("{extra}{}", lab_yaml(lab, &format!("127.0.0.1:{port}"), "sleep"));
    let two = all[..all.find("  - name: h3").unwrap()].to_string();
    (two, all)
}

#[test]
fn root_started_daemon_drops_to_nobody_with_the_documented_capabilities() {
    if !require_lab("root_started_daemon_drops_to_nobody_with_the_documented_capabilities") {
        return;
    }
    let lab = Lab::create(&format!("wq{}", std::process::id() % 10_000), 3, 1, 43).unwrap();
    let dir = Scratch::new("priv-root");
    let port = free_port();
    let (two, all) = configs(&lab, port, "user: nobody\n");
    // A plugin on h1 that passes everything, with the compile cache under root's HOME, which
    // nobody cannot write: the daemon starts all the same (and compiles without the cache).
    let pass = dir.path("pass.wasm");
    std::fs::write(&pass, plugin_that_faults_after(u32::MAX)).unwrap();
    let with_plugin = |y: &str| {
        let h1 = format!("      interface: {}\n", lab.hosts[0].switch_if);
        y.replace(&h1, &format!("{h1}    plugins:\n      - name: pass\n        path: {}\n", pass.display()))
    };
    let (two, all) = (with_plugin(&two), with_plugin(&all));
    assert!(two.contains("name: pass"), "{two}");
    let mut cmd = Command::new(bin());
    cmd.env_remove("WASMSWITCH_CACHE_DIR").env_remove("XDG_CACHE_HOME").env("HOME", "/root");
    cmd.args(["run", "-c"]).arg(dir.write(&two));
    let child = spawn(cmd, port);
    exercise(&lab, &dir, &all, child, port, true);
}

#[test]
fn daemon_started_as_nobody_with_ambient_capabilities_runs_the_lab() {
    if !require_lab("daemon_started_as_nobody_with_ambient_capabilities_runs_the_lab") {
        return;
    }
    let lab = Lab::create(&format!("wn{}", std::process::id() % 10_000), 3, 1, 44).unwrap();
    let dir = Scratch::new("priv-ambient");
    let port = free_port();
    let (two, all) = configs(&lab, port, "");
    // nobody must be able to run the binary: a copy in the world-readable scratch folder.
    let exe = dir.path("wasmswitch");
    std::fs::copy(bin(), &exe).unwrap();
    let caps: Vec<String> = KEPT.iter().map(|(_, n, _)| format!("+{}", n.trim_start_matches("cap_"))).collect();
    let caps = caps.join(",");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg("--")
        .arg(&exe)
        .args(["run", "-c"])
        .arg(dir.write(&two));
    assert!(Path::new("/usr/bin/setpriv").exists(), "setpriv (util-linux) is needed");
    let child = spawn(cmd, port);
    exercise(&lab, &dir, &all, child, port, false);
}

#[test]
fn an_unknown_user_is_a_config_error() {
    let dir = Scratch::new("priv-user");
    let cfg = dir.write("user: no-such-user-here\nports:\n  - name: p0\n    driver: sim\n");
    let out = Command::new(bin()).args(["check", "-c"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(":1:7: user: no user called `no-such-user-here`"), "{err}");
}

#[test]
fn files_the_dropped_user_cannot_read_are_named_at_start() {
    // Read as root before the drop, so the daemon starts; every reload would then fail, which
    // it says at once, per file (the config, the token file, each plugin), instead of at the
    // first reload.
    if !require_lab("files_the_dropped_user_cannot_read_are_named_at_start") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("priv-unreadable");
    let port = free_port();
    let private = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (token, plugin) = (dir.path("token"), dir.path("pass.wasm"));
    std::fs::write(&token, "s3cret-token-0123456789\n").unwrap();
    std::fs::write(&plugin, plugin_that_faults_after(u32::MAX)).unwrap();
    private(&token);
    private(&plugin);
    let cfg = dir.write(&format!(
        "user: nobody\nmetrics:\n  listen: 127.0.0.1:{port}\ncontrol:\n  token_file: token\nworkers:\n  - idle: sleep\n\
         ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - {{ name: pass, path: pass.wasm }}\n"
    ));
    private(&cfg);
    // The folder itself is root's (0700 or 0755): the files' own modes must be what refuses.
    std::fs::set_permissions(dir.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg);
    let child = spawn(cmd, port);
    // It started with the plugin, read before the drop as the config was; a reload, which
    // reads as `nobody`, is refused by name.
    let (st, body) = http(port, "GET", "/api/v1/plugins").unwrap();
    assert!(st == 200 && body.contains("\"pass\""), "{st} {body}");
    let r = http_with(port, "POST", "/api/v1/reload", &["Authorization: Bearer s3cret-token-0123456789"], b"").unwrap();
    assert!(r.status == 422 && r.body.contains("cannot read the config file"), "{} {}", r.status, r.body);
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    for file in [&cfg, &token, &plugin] {
        let line = format!("{}: cannot be read after dropping privileges", file.display());
        assert!(log.contains(&line) && log.contains("every reload will fail"), "{line} in:\n{log}");
    }
}
