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

// ---------------------------------------------------------------- the plugin compile cache

/// A config for `user` (if any) with one sim port whose traffic goes through the plugin
/// `guard` (`path`, `config`).
fn cache_config(dir: &Scratch, user: &str, port: u16, path: &Path, config: &str) -> std::path::PathBuf {
    dir.write(&format!(
        "{user}metrics:\n  listen: 127.0.0.1:{port}\nworkers:\n  - idle: sleep\nports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        rate_pps: 20000\n        src_macs: 16\n    plugins:\n      - name: guard\n        path: {}\n        config: \"{config}\"\n  - name: p1\n    driver: sim\n",
        path.display()
    ))
}

/// One run of the daemon on `cfg` with the plugin cache in `cache`, until `guard` has seen
/// traffic: (`/api/v1/plugins`'s `guard` entry, `/metrics`, the log) after a clean stop.
fn run_once(cfg: &Path, cache: &Path, port: u16) -> (serde_json::Value, String, String) {
    let mut cmd = Command::new(bin());
    cmd.env_remove("XDG_CACHE_HOME").env("WASMSWITCH_CACHE_DIR", cache).args(["run", "-c"]).arg(cfg);
    let child = spawn(cmd, port);
    let mut guard = serde_json::Value::Null;
    eventually("guard sees traffic", || {
        let body = http(port, "GET", "/api/v1/plugins").unwrap().1;
        let all: serde_json::Value = serde_json::from_str(&body).unwrap();
        guard = all["plugins"].as_array().unwrap().iter().find(|p| p["plugin"] == "guard").unwrap().clone();
        guard["packets"].as_u64().unwrap() > 100
    });
    let metrics = http(port, "GET", "/metrics").unwrap().1;
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    (guard, metrics, log)
}

/// The `.cwasm` entries in `cache`.
fn entries(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    v.sort();
    v
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b).iter().map(|b| format!("{b:02x}")).collect()
}

/// Issue 41's attack. Root starts the daemon with `user: nobody` and a cache directory nobody
/// owns; a process of nobody's rewrites the plugin's entry with a valid header (magic, the
/// plugin's key), the compiled code of another component (compiled by the same engine
/// configuration) and that code's SHA-256. The daemon must run its own plugin (its verdicts,
/// the SHA-256 `/api/v1/plugins` reports), count the entry, and write it again; and a
/// legitimate entry still loads at the next start without a compile.
#[test]
fn a_forged_cache_entry_is_not_run_by_a_daemon_dropped_to_nobody() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !require_lab("a_forged_cache_entry_is_not_run_by_a_daemon_dropped_to_nobody") {
        return;
    }
    let Some(acl) = example_plugin("acl") else { return };
    let dir = Scratch::new("cache-forge");
    std::fs::set_permissions(dir.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = dir.path("cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let port = free_port();
    // A (the plugin configured): the ACL dropping everything. B (the forger's): passes all.
    let a_cfg = cache_config(&dir, "user: nobody\n", port, &acl, "default deny");
    let (guard, _, log) = run_once(&a_cfg, &cache, port);
    assert!(guard["verdicts"]["drop"].as_u64().unwrap() > 0, "A drops: {guard} {log}");
    let a_entry = entries(&cache);
    assert_eq!(a_entry.len(), 1, "A's entry: {a_entry:?} {log}");
    let a_entry = a_entry[0].clone();
    let pass = dir.path("pass.wasm");
    std::fs::write(&pass, plugin_that_faults_after(u32::MAX)).unwrap();
    let b_cfg = cache_config(&dir, "user: nobody\n", port, &pass, "");
    let (guard, _, _) = run_once(&b_cfg, &cache, port);
    assert_eq!(guard["verdicts"]["drop"], 0, "B passes: {guard}");
    let b_entry: Vec<_> = entries(&cache).into_iter().filter(|p| *p != a_entry).collect();
    assert_eq!(b_entry.len(), 1, "{b_entry:?}");

    // The forgery, as nobody could write it: A's header, B's compiled code and its SHA-256.
    let (a_data, b_data) = (std::fs::read(&a_entry).unwrap(), std::fs::read(&b_entry[0]).unwrap());
    let b_payload = &b_data[80..];
    let mut forged = a_data[..48].to_vec();
    forged.extend_from_slice(&hex_bytes(&sha256_hex(b_payload)));
    forged.extend_from_slice(b_payload);
    std::fs::write(&a_entry, &forged).unwrap();
    std::os::unix::fs::chown(&a_entry, Some(65534), Some(65534)).unwrap();

    // B's run wrote its config where A's was: A's again.
    let a_cfg = cache_config(&dir, "user: nobody\n", port, &acl, "default deny");
    let (guard, metrics, log) = run_once(&a_cfg, &cache, port);
    assert_eq!(guard["component_sha256"], sha256_hex(&std::fs::read(&acl).unwrap()).as_str(), "{guard}");
    assert_eq!(guard["verdicts"]["pass"], 0, "A's verdicts, not B's: {guard}");
    assert!(guard["verdicts"]["drop"].as_u64().unwrap() > 100, "A's verdicts, not B's: {guard}");
    assert_eq!(series(&metrics, "wasmswitch_plugin_cache_discarded_total{reason=\"bad_mac\"}"), Some(1.0), "{log}");
    assert_eq!(series(&metrics, "wasmswitch_plugin_compiles_total"), Some(1.0));
    assert!(log.contains("its MAC does not match") && log.contains(&a_entry.display().to_string()), "{log}");
    let rewritten = std::fs::read(&a_entry).unwrap();
    assert!(rewritten != forged && rewritten[..48] == a_data[..48], "the entry was written again");

    // The key: root's, 0600, so nobody cannot read it.
    let key = std::fs::metadata(cache.join("cache.key")).unwrap();
    assert_eq!((key.uid(), key.mode() & 0o7777, key.len()), (0, 0o600, 32));
    // A restart loads the entry it wrote: no compile.
    let (guard, metrics, log) = run_once(&a_cfg, &cache, port);
    assert!(guard["verdicts"]["drop"].as_u64().unwrap() > 0 && guard["verdicts"]["pass"] == 0);
    assert_eq!(series(&metrics, "wasmswitch_plugin_cache_hits_total"), Some(1.0), "{log}");
    assert_eq!(series(&metrics, "wasmswitch_plugin_compiles_total"), Some(0.0), "{log}");
    assert_eq!(metric_sum(&metrics, "wasmswitch_plugin_cache_discarded_total"), 0.0, "{log}");
    assert_eq!(metric_sum(&metrics, "wasmswitch_plugin_cache_refused_total"), 0.0, "{log}");
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A cache directory others may write (0777), or that another user owns, and a key file
/// others may read or that another user owns, are refused by name, counted, and the daemon
/// starts all the same, compiling its plugins and writing no entry.
#[test]
fn a_cache_directory_or_key_file_not_the_daemons_own_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if !require_lab("a_cache_directory_or_key_file_not_the_daemons_own_is_refused") {
        return;
    }
    let dir = Scratch::new("cache-refused");
    let pass = dir.path("pass.wasm");
    std::fs::write(&pass, plugin_that_faults_after(u32::MAX)).unwrap();
    let port = free_port();
    let cfg = cache_config(&dir, "", port, &pass, "");
    let cache = dir.path("cache");
    let mode = |m: u32| std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(m)).unwrap();
    let refused = |reason: &str, says: &[&str]| {
        let (guard, metrics, log) = run_once(&cfg, &cache, port);
        assert!(guard["verdicts"]["pass"].as_u64().unwrap() > 0, "it runs: {guard}");
        let series_name = format!("wasmswitch_plugin_cache_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(series(&metrics, &series_name), Some(1.0), "{series_name}: {log}");
        assert_eq!(series(&metrics, "wasmswitch_plugin_compiles_total"), Some(1.0));
        for s in says {
            assert!(log.contains(s), "`{s}` in: {log}");
        }
        assert!(log.contains("so plugins are compiled at every start"), "{log}");
        assert!(entries(&cache).is_empty(), "nothing written to a refused cache");
    };
    let shown = cache.display().to_string();
    std::fs::create_dir(&cache).unwrap();
    mode(0o777);
    refused("directory", &[&shown, "owned by uid 0 with mode 0777", "chmod 0700"]);
    assert!(!cache.join("cache.key").exists(), "no key made in a refused directory");
    mode(0o700);
    std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
    refused("directory", &[&shown, "owned by uid 65534 with mode 0700", "daemon's user (uid 0)", "chown 0"]);
    std::os::unix::fs::chown(&cache, Some(0), Some(0)).unwrap();
    // Its own directory: the key is made, and entries are written.
    let (_, metrics, log) = run_once(&cfg, &cache, port);
    assert_eq!(metric_sum(&metrics, "wasmswitch_plugin_cache_refused_total"), 0.0, "{log}");
    assert_eq!(entries(&cache).len(), 1, "{log}");
    std::fs::remove_file(&entries(&cache)[0]).unwrap();
    let key = cache.join("cache.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused("key", &[&key.display().to_string(), "mode 0644", "refused", "remove"]);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(65534), Some(65534)).unwrap();
    refused("key", &[&key.display().to_string(), "owned by uid 65534, not by uid 0"]);
}
