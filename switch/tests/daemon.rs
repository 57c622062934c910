//! The daemon end to end on the sim driver: run, scrape, control API, reload, drain.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn sim_config(port: u16) -> tempfile_path::TempPath {
    let text = std::fs::read_to_string(repo("configs/sim.yaml"))
        .unwrap()
        .replace("127.0.0.1:9187", &format!("127.0.0.1:{port}"));
    tempfile_path::write(&text)
}

/// A tiny self-deleting temp file (no dependency needed for this).
mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    pub fn write(text: &str) -> TempPath {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("wasmswitch-test-{}-{n}.yaml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        TempPath(p)
    }
}

#[test]
fn run_scrape_reload_and_drain() {
    let port = free_port();
    let cfg = sim_config(port);
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg.0).stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);

    let (st, m1) = http(port, "GET", "/metrics").unwrap();
    assert_eq!(st, 200);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, m2) = http(port, "GET", "/metrics").unwrap();
    for name in [
        "wasmswitch_port_rx_packets_total",
        "wasmswitch_port_drops_total",
        "wasmswitch_pool_alloc_fast_total",
        "wasmswitch_pool_recycle_cached_total",
        "wasmswitch_fdb_entries",
        "wasmswitch_worker_busy_cycles_total",
    ] {
        assert!(m2.contains(&format!("# TYPE {name}")), "{name} missing from /metrics");
    }
    let (r1, r2) =
        (metric_sum(&m1, "wasmswitch_port_rx_packets_total"), metric_sum(&m2, "wasmswitch_port_rx_packets_total"));
    assert!(r2 > r1, "traffic flows: rx {r1} -> {r2}");
    assert!(metric_sum(&m2, "wasmswitch_fdb_entries") > 0.0, "MACs were learned");

    assert_promtool_accepts(&m2);

    let (st, ports) = http(port, "GET", "/api/v1/ports").unwrap();
    assert_eq!(st, 200);
    assert!(ports.contains("\"p0\"") && ports.contains("\"p2\""), "{ports}");
    let (st, fdb) = http(port, "GET", "/api/v1/fdb").unwrap();
    assert_eq!(st, 200);
    assert!(fdb.contains("02:00:00:"), "learned MACs listed: {fdb}");
    let (st, body) = http(port, "POST", "/api/v1/reload").unwrap();
    assert_eq!(st, 200, "{body}");

    // A broken config on reload is refused and the switch keeps running.
    std::fs::write(&cfg.0, "ports: [").unwrap();
    let (st, body) = http(port, "POST", "/api/v1/reload").unwrap();
    assert_eq!(st, 422, "{body}");
    assert!(body.contains("reload refused"), "{body}");
    signal(&child, libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP with a broken config does not kill the daemon");
    assert_eq!(http(port, "GET", "/healthz").unwrap().0, 200);

    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit 0 after SIGTERM: {log}");
    assert!(log.contains("all 16384 frames are back in the pool"), "{log}");
}

#[test]
fn sighup_while_starting_reloads_once_running() {
    // SIGHUP's default action ends a process. One that comes while the daemon starts (here
    // while it compiles a plugin into an empty cache) must not kill it: it reloads once the
    // switch runs.
    let Some(acl) = example_plugin("acl") else { return };
    let port = free_port();
    let scratch = Scratch::new("sighup-start");
    let text = std::fs::read_to_string(repo("configs/acl.yaml"))
        .unwrap()
        .replace("127.0.0.1:9188", &format!("127.0.0.1:{port}"))
        .replace("../plugins/out/acl.wasm", acl.to_str().unwrap());
    let cfg = tempfile_path::write(&text);
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg.0).env("WASMSWITCH_CACHE_DIR", &scratch.0).stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    // The daemon's first line (privileges dropped) comes before any plugin is compiled.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    std::io::BufRead::read_line(&mut err, &mut log).unwrap();
    signal(&child, libc::SIGHUP);
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).unwrap();
        s
    });
    wait_healthy(port, &mut child);
    sigterm(&child);
    let status = child.wait().unwrap();
    log += &rest.join().unwrap();
    assert!(status.success(), "SIGHUP while starting, then SIGTERM: exit 0 ({status}): {log}");
    let (hup, loaded) = (log.find("SIGHUP: reloading"), log.find("plugins loaded"));
    assert!(hup.is_some() && loaded.is_some(), "the early SIGHUP reloads once running: {log}");
}

/// The sample of `name` whose labels include every one of `labels` (`k="v"`), if any.
fn sample(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn two_umem_groups_forward_by_copy_report_per_group_and_drain_each() {
    // p1 in a UMEM group of its own: p0's and p2's traffic to it crosses by copy.
    let port = free_port();
    let text = std::fs::read_to_string(repo("configs/sim.yaml"))
        .unwrap()
        .replace("127.0.0.1:9187", &format!("127.0.0.1:{port}"))
        .replace("  - name: p1\n", "  - name: p1\n    umem: second\n");
    let cfg = tempfile_path::write(&text);
    let check = Command::new(bin()).args(["check", "-c"]).arg(&cfg.0).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg.0).stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, m) = http(port, "GET", "/metrics").unwrap();
    for group in ["copy", "second"] {
        let umem = format!("umem=\"{group}\"");
        assert_eq!(sample(&m, "wasmswitch_pool_frames", &[&umem]), Some(16384.0), "{group}'s pool: {m}");
        assert!(sample(&m, "wasmswitch_pool_frames_at_rest", &[&umem]).is_some(), "{group} at rest");
        assert!(sample(&m, "wasmswitch_pool_cache_frames", &[&umem, "worker=\"0\""]).is_some(), "{group} cache");
    }
    assert!(sample(&m, "wasmswitch_port_info", &["port=\"p1\"", "umem=\"second\""]).is_some(), "{m}");
    assert!(sample(&m, "wasmswitch_port_info", &["port=\"p0\"", "umem=\"copy\""]).is_some(), "{m}");
    assert!(metric_sum(&m, "wasmswitch_umem_copies_total") > 1000.0, "frames crossed by copy: {m}");
    assert!(metric_sum(&m, "wasmswitch_port_tx_packets_total") > 10_000.0);
    let (_, ports) = http(port, "GET", "/api/v1/ports").unwrap();
    assert!(ports.contains("\"umem\":\"second\""), "{ports}");
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit 0 after SIGTERM: {log}");
    assert!(log.contains("2 UMEM groups (copy, second)"), "{log}");
    // 16,384 frames in each group, every one back in its own pool (a frame of one group in the
    // other's would fail the shutdown check).
    assert!(log.contains("all 32768 frames are back in the pool"), "{log}");
}

#[test]
fn check_accepts_every_shipped_config() {
    for entry in std::fs::read_dir(repo("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let out = Command::new(bin()).args(["check", "-c"]).arg(&path).output().unwrap();
            assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        }
    }
}

#[test]
fn check_rejects_broken_configs_with_nonzero_exit() {
    let cases = [
        ("ports:\n  - name: p0\n    driver: sim\n    colour: blue\n", ":4:5: unknown field `colour`"),
        ("ports:\n  - name: p0\n    driver: sim\n  - name: p0\n    driver: sim\n", ":4:11: duplicate port name `p0`"),
        ("ports: [unclosed\n  - : :\n", ":2:5:"),
    ];
    for (yaml, want) in cases {
        let f = tempfile_path::write(yaml);
        let out = Command::new(bin()).args(["check", "-c"]).arg(&f.0).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{yaml}");
        assert!(err.contains(want), "expected `{want}` in `{err}`");
    }
    let out = Command::new(bin()).args(["check", "-c", "/nonexistent.yaml"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml: cannot read the config file"));
}

#[test]
fn bench_rounds_interleave_and_report_the_best_of_each() {
    let args =
        ["bench", "--json", "--seconds", "0.1", "--rounds", "2", "--scenario", "l2", "--scenario", "passthrough"];
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let order: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["scenario"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(order, ["l2", "passthrough", "l2", "passthrough"], "one JSON line per pass, scenarios interleaved");
    let out =
        Command::new(bin()).args(["bench", "--seconds", "0.1", "--rounds", "2", "--scenario", "l2"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("the best of 2 interleaved rounds"), "{text}");
    assert!(text.lines().next().is_some_and(|h| h.trim_end().ends_with("spread")), "a spread column: {text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("l2 ")).count(), 1, "one row per scenario: {text}");
    // Progress into a pipe: a line per scenario and round, nothing redrawn.
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.contains("[round 2/2, 1/1] l2 for 0.1s") && !progress.contains('\r'), "{progress}");
    let out = Command::new(bin()).args(["bench", "--rounds", "0", "--scenario", "l2"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--rounds must be at least 1"));
}

#[test]
fn bench_json_prints_one_line_per_scenario() {
    let out = Command::new(bin())
        .args(["bench", "--json", "--seconds", "0.2", "--scenario", "l2", "--scenario", "passthrough"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert!(l["mpps"].as_f64().unwrap() > 0.0);
        assert!(l["ns_per_pkt"].as_f64().unwrap() > 0.0);
        assert!(l["packets"].as_u64().unwrap() > 0);
        assert_eq!(l["frames_leaked"], 0);
    }
    assert_eq!(lines[0]["scenario"], "l2");
}

#[test]
fn bench_workers_each_forward_and_add_up() {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(bin()).args(["bench", "--json", "--seconds", "0.3"]).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let two = json(&["--scenario", "l2", "--workers", "2"]);
    assert_eq!(two["workers"], 2);
    assert_eq!(two["frames_leaked"], 0, "every frame of both workers back: {two}");
    assert!(two["packets"].as_u64().unwrap() > 0 && two["mpps"].as_f64().unwrap() > 0.0, "{two}");
    // ns/packet is the switch's, over both workers.
    let (mpps, ns) = (two["mpps"].as_f64().unwrap(), two["ns_per_pkt"].as_f64().unwrap());
    assert!((mpps * ns - 1e3).abs() < 1.0, "{two}");
    // The least-work loop runs as shared-nothing copies: the machine's own scaling.
    let floor = json(&["--scenario", "floor", "--workers", "2"]);
    assert_eq!((floor["workers"].clone(), floor["frames_leaked"].clone()), (2.into(), 0.into()), "{floor}");
    assert!(floor["packets"].as_u64().unwrap() > 0, "{floor}");
    if let Some(acl) = example_plugin("acl") {
        let p = json(&["--scenario", "l2+plugin+shadow", "--workers", "2", "--plugin", acl.to_str().unwrap()]);
        assert_eq!((p["workers"].clone(), p["frames_leaked"].clone()), (2.into(), 0.into()), "{p}");
        let p = json(&["--scenario", "l2+plugin-no-deadline", "--plugin", acl.to_str().unwrap()]);
        assert_eq!(
            (p["scenario"].clone(), p["frames_leaked"].clone()),
            ("l2+plugin-no-deadline".into(), 0.into()),
            "{p}"
        );
        assert!(p["packets"].as_u64().unwrap() > 0, "{p}");
    }
    for (args, want) in [
        (&["--workers", "0"][..], "--workers 0 is out of range: expected 1-64"),
        (&["--workers", "65"][..], "--workers 65 is out of range"),
    ] {
        let out = Command::new(bin()).args(["bench", "--seconds", "0.1"]).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn bench_batch_sizes_run_clean_and_their_range_is_checked() {
    let run = |args: &[&str]| Command::new(bin()).args(["bench", "--seconds", "0.1"]).args(args).output().unwrap();
    // Batches of one (--batch 1) beside batches of 256, every frame back.
    let out = run(&["--json", "--batch", "1", "--scenario", "l2", "--scenario", "l2-batch256"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(r["packets"].as_u64().unwrap() > 0 && r["frames_leaked"] == 0, "{r}");
    }
    let out = run(&["--scenario", "l2", "--scenario", "l2-batch256"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("batch 256 gain, l2  "), "{text}");
    if let Some(acl) = example_plugin("acl") {
        let out =
            run(&["--scenario", "l2+plugin", "--scenario", "l2+plugin-batch256", "--plugin", acl.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("batch 256 gain, l2+plugin"), "{text}");
    }
    for (arg, want) in [("0", "--batch 0 is out of range: expected 1-256"), ("257", "--batch 257 is out of range")] {
        let out = run(&["--batch", arg, "--scenario", "l2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "--batch {arg}: {err}");
    }
}

#[test]
fn bench_plugin_scenarios_say_what_they_need() {
    for s in ["l2+plugin", "l2+plugin-no-deadline"] {
        let out = Command::new(bin()).args(["bench", "--seconds", "0.2", "--scenario", s]).output().unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("scenario `{s}` needs --plugin FILE")));
    }
    // The daemon does not link the example plugins: l2+native is wasmswitch-bench-native's
    // (benches/native/tests runs it).
    let out = Command::new(bin()).args(["bench", "--seconds", "0.2", "--scenario", "l2+native"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scenario `l2+native` needs the example plugins compiled natively"), "{err}");
    assert!(err.contains("run it with `wasmswitch-bench-native`"), "{err}");
}

#[test]
fn bench_refuses_figures_of_a_plugin_that_faulted() {
    // Quarantined, it is never called: the figures would be its on_error policy's.
    let dir = Scratch::new("bench-trap");
    let trap = dir.path("trap.wasm");
    std::fs::write(&trap, plugin_with_process("")).unwrap();
    let out = Command::new(bin())
        .args(["bench", "--seconds", "0.2", "--scenario", "l2+plugin", "--plugin"])
        .arg(&trap)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("scenario `l2+plugin`: the plugin faulted") && err.contains("(trap "), "{err}");
}

#[test]
fn acl_plugin_runs_in_the_daemon_datapath() {
    let path = repo("configs/acl.yaml");
    if example_plugin("acl").is_none() {
        return;
    }
    let cfg = wasmswitch::config::Config::load(&path).unwrap();
    let m = wasmswitch::plugins::PluginMetrics::default();
    let mut dp = wasmswitch::dataplane::Dataplane::start_with_plugins(&cfg, Some(&m)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let policy = wasmswitch_core::stats::DropReason::Policy as usize;
    let dropped: u64 = dp.workers.iter().map(|w| w.stats.ports[0].drops[policy].get()).sum();
    let p1_rx: u64 = dp.workers.iter().map(|w| w.stats.ports[1].rx_packets.get()).sum();
    let p1_policy: u64 = dp.workers.iter().map(|w| w.stats.ports[1].drops[policy].get()).sum();
    assert!(dropped > 1000, "acl denies p0's UDP to 5001 ({dropped} dropped)");
    assert!(p1_rx > 1000 && p1_policy == 0, "p1 has no plugin");
    assert!(m.get().plugins.iter().all(|r| r.name() == "acl" && r.stats.batches.get() > 0));
    dp.stop().unwrap();
}

#[test]
fn plugin_hot_reload_applies_new_verdicts_without_restart() {
    let Some(wasm) = example_plugin("acl") else { return };
    let port = free_port();
    let text = std::fs::read_to_string(repo("configs/acl.yaml"))
        .unwrap()
        .replace("127.0.0.1:9188", &format!("127.0.0.1:{port}"))
        .replace("../plugins/out/acl.wasm", wasm.to_str().unwrap());
    let cfg = tempfile_path::write(&text);
    let mut child = Command::new(bin()).args(["run", "-c"]).arg(&cfg.0).stderr(Stdio::piped()).spawn().unwrap();
    wait_healthy(port, &mut child);
    let policy = |m: &str| -> f64 {
        m.lines()
            .filter(|l| {
                l.starts_with("wasmswitch_port_drops_total{")
                    && l.contains("port=\"p0\"")
                    && l.contains("reason=\"policy\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let batches = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("wasmswitch_plugin_batches_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let m1 = http(port, "GET", "/metrics").unwrap().1;
    let d1 = policy(&m1);
    assert!(d1 > 0.0, "acl drops before the reload");
    for name in [
        "wasmswitch_plugin_log_suppressed_total{",
        "wasmswitch_plugin_quarantine_lifted_total{",
        "wasmswitch_plugin_wall_overruns_total{",
        "wasmswitch_plugin_events_total{",
    ] {
        assert!(m1.contains(name), "{name} exported");
    }
    // With a plugin's own counters in it too.
    assert_promtool_accepts(&m1);
    std::fs::write(&cfg.0, text.replace("deny proto=udp dport=5001", "deny proto=tcp dport=22")).unwrap();
    let (st, body) = http(port, "POST", "/api/v1/reload").unwrap();
    assert_eq!(st, 200, "{body}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let m2 = http(port, "GET", "/metrics").unwrap().1;
    let d2 = policy(&m2);
    assert!(batches(&m2) >= batches(&m1), "plugin counters carried over the reload, not reset");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let d3 = policy(&http(port, "GET", "/metrics").unwrap().1);
    assert_eq!(d2, d3, "the new rules (no UDP deny) apply after the swap");
    let (_, plugins) = http(port, "GET", "/api/v1/plugins").unwrap();
    assert!(plugins.contains("\"acl\""), "{plugins}");
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("frames are back in the pool"));
}
