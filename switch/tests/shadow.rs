//! Shadow rollout and plugin state across reloads, against a running daemon on the sim driver:
//! a candidate chain runs next to the live one on the same batches, its verdicts counted live ×
//! shadow and never applied, its faults kept away from traffic; promote and discard through the
//! CLI and the API, refused by name when there is nothing to do; a reload keeps the instances of
//! plugins whose component and config did not change; `/api/v1/plugins` says what is loaded; a
//! redirect to a port that does not exist is dropped, counted and logged once.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

fn cli(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

const ALLOW: &str = "default allow";
const DENY_5001: &str = "default allow\n          deny proto=udp dport=5001";

/// p0 and p1 send each other UDP to port 5001 (the sim default). Both run `acl` allowing
/// everything; p0's shadow chain is an `acl` denying that traffic, p1's a plugin that traps on
/// every batch.
fn yaml(port: u16, acl: &str, trap: &str) -> String {
    let sim_port = |name: &str, shadow: &str| {
        format!(
            "  - name: {name}
    driver: sim
    sim:
      traffic:
        rate_pps: 20000
        src_macs: 16
    plugins:
      - name: acl
        path: {acl}
        config: |
          {ALLOW}
    shadow:
{shadow}"
        )
    };
    let p0 =
        sim_port("p0", &format!("      - name: acl\n        path: {acl}\n        config: |\n          {DENY_5001}\n"));
    let p1 = sim_port("p1", &format!("      - name: trap\n        path: {trap}\n        max_faults: 3\n"));
    format!("metrics:\n  listen: 127.0.0.1:{port}\nworkers:\n  - idle: sleep\nports:\n{p0}{p1}")
}

fn get(port: u16, path: &str) -> Value {
    let (st, body) = http(port, "GET", path).unwrap();
    assert_eq!(st, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The value of the one sample of `name` whose labels include all of `labels` and, unless
/// `labels` names a chain, no `chain` label (the live plugins' series).
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let shadow = labels.iter().any(|l| l.starts_with("chain="));
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|x| l.contains(x)) && (shadow || !l.contains("chain=")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .reduce(|a, b| a + b)
}

fn port_drops(metrics: &str, port: &str, reason: &str) -> f64 {
    sample(metrics, "wasmswitch_port_drops_total", &[&format!("port=\"{port}\""), &format!("reason=\"{reason}\"")])
        .unwrap_or(0.0)
}

fn shadow_of<'a>(shadow: &'a Value, port: &str) -> Option<&'a Value> {
    shadow["ports"].as_array().unwrap().iter().find(|p| p["port"] == port)
}

#[test]
fn a_shadow_chain_is_compared_never_applied_then_promoted_or_discarded() {
    let Some(acl) = example_plugin("acl") else { return };
    let dir = Scratch::new("shadow");
    std::fs::write(dir.path("trap.wasm"), plugin_with_process("")).unwrap();
    let port = free_port();
    let cfg = dir.write(&yaml(port, acl.to_str().unwrap(), "trap.wasm"));
    let c = cfg.to_str().unwrap();
    assert!(cli(&["check", "-c", c]).status.success(), "check accepts shadow chains");
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", c]).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    let metrics = || http(port, "GET", "/metrics").unwrap().1;

    // p0: the shadow acl would drop every packet; the live one passes them all.
    eventually("p0's shadow chain compared 2000 packets", || {
        shadow_of(&get(port, "/api/v1/shadow"), "p0").is_some_and(|p| p["packets"].as_u64().unwrap() > 2000)
    });
    let sh = get(port, "/api/v1/shadow");
    let p0 = shadow_of(&sh, "p0").unwrap();
    assert_eq!((p0["live"].clone(), p0["shadow"].clone()), (serde_json::json!(["acl"]), serde_json::json!(["acl"])));
    let (packets, pass_drop) = (p0["packets"].as_u64().unwrap(), p0["matrix"]["pass"]["drop"].as_u64().unwrap());
    assert!(pass_drop > 0 && pass_drop + 50 >= packets, "live pass × shadow drop: {p0}");
    assert!(p0["differ"].as_u64().unwrap() >= pass_drop, "{p0}");
    let m = metrics();
    assert_eq!(port_drops(&m, "p0", "policy"), 0.0, "a shadow verdict is never applied");
    assert!(
        sample(&m, "wasmswitch_shadow_verdicts_total", &["port=\"p0\"", "live=\"pass\"", "shadow=\"drop\""]).unwrap()
            > 0.0
    );

    // p1: the shadow plugin traps until it is quarantined; traffic does not notice.
    eventually("p1's shadow plugin quarantined", || {
        sample(&metrics(), "wasmswitch_plugin_quarantined", &["port=\"p1\"", "plugin=\"trap\"", "chain=\"shadow\""])
            == Some(1.0)
    });
    let m = metrics();
    assert!(
        sample(&m, "wasmswitch_plugin_faults_total", &["port=\"p1\"", "chain=\"shadow\"", "reason=\"trap\""]).unwrap()
            >= 3.0
    );
    assert_eq!(port_drops(&m, "p1", "policy"), 0.0);
    let p1 = shadow_of(&get(port, "/api/v1/shadow"), "p1").cloned().unwrap();
    assert_eq!(p1["differ"], 0, "on_error pass: the shadow's verdicts equal the live ones: {p1}");
    let forwarded = |m: &str| sample(m, "wasmswitch_port_tx_packets_total", &["port=\"p0\""]).unwrap_or(0.0);
    let before = forwarded(&m);
    eventually("p1's traffic still reaches p0", || forwarded(&metrics()) > before + 1000.0);

    // What is loaded: the component's hash and each config's digest.
    let plugins = get(port, "/api/v1/plugins");
    let entries = plugins["plugins"].as_array().unwrap();
    let of = |port: &str, chain: &str| entries.iter().find(|e| e["port"] == port && e["chain"] == chain).unwrap();
    let digest = |b: &[u8]| Sha256::digest(b).iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(of("p0", "live")["component_sha256"], digest(&std::fs::read(&acl).unwrap()).as_str());
    assert_eq!(of("p0", "live")["config_sha256"], digest(format!("{ALLOW}\n").as_bytes()).as_str());
    assert_ne!(of("p0", "live")["config_sha256"], of("p0", "shadow")["config_sha256"]);
    assert_eq!(of("p1", "shadow")["quarantined"], true);
    assert!(of("p0", "live")["verdicts"]["pass"].as_u64().unwrap() > 0);
    let out = String::from_utf8_lossy(&cli(&["plugins", "-c", c]).stdout).into_owned();
    let hash = &digest(&std::fs::read(&acl).unwrap())[..12];
    let row = |cells: &[&str]| out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>().starts_with(cells));
    assert!(
        row(&["p0", "live", "acl", hash]) && row(&["p0", "shadow", "acl", hash]) && row(&["p1", "shadow", "trap"]),
        "{out}"
    );
    // The verdicts, last: pass, drop, other. The live acl passes p0's traffic so far.
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[header.len() - 3..], ["pass", "drop", "other"], "{out}");
    let live = out.lines().find(|l| l.split_whitespace().take(2).eq(["p0", "live"])).unwrap();
    let cells: Vec<u64> = live.split_whitespace().rev().take(3).map(|c| c.parse().unwrap()).collect();
    assert!(cells[2] > 0, "pass, in {live}");

    // Promote p0's shadow through the CLI: its verdicts apply from the next batch on, and the
    // live series of `acl` carries on from where it was, by what p0 received since: not by
    // the packets the promoted one saw as a shadow (counted once, in the shadow series).
    let live_packets = |m: &str| sample(m, "wasmswitch_plugin_packets_total", &["port=\"p0\"", "plugin=\"acl\""]);
    let m = metrics();
    let before = live_packets(&m).unwrap();
    let as_shadow = sample(&m, "wasmswitch_plugin_packets_total", &["port=\"p0\"", "chain=\"shadow\""]).unwrap();
    let t = Instant::now();
    let out = cli(&["shadow", "promote", "p0", "-c", c]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("port p0: shadow chain [acl] promoted"), "{text}");
    assert!(text.contains("the next reload applies it again"), "{text}");
    let m = metrics();
    let after = live_packets(&m).unwrap();
    // p0 receives 20,000 packets a second; twice that, and a batch's worth more, is the most.
    let received = 40_000.0 * t.elapsed().as_secs_f64() + 1000.0;
    assert!(after >= before, "counters never go backwards");
    assert!(
        after - before <= received,
        "{after} after promoting, {before} before: at most {received} more ({as_shadow} as a shadow)"
    );
    eventually("p0's promoted acl drops", || port_drops(&metrics(), "p0", "policy") > 1000.0);
    assert!(shadow_of(&get(port, "/api/v1/shadow"), "p0").is_none());
    let config = get(port, "/api/v1/config");
    assert!(config["ports"][0]["plugins"][0]["config"].as_str().unwrap().contains("deny"), "{config}");
    assert_eq!(config["ports"][0]["shadow"], serde_json::json!([]));
    // Nothing to promote any more: refused by name.
    let out = cli(&["shadow", "promote", "p0", "-c", c]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("port `p0` has no shadow chain"));

    // p1's shadow `trap` faults every call: once quarantined, its verdicts are its on_error
    // policy's, and promoting it is refused by name.
    eventually("p1's shadow trap is quarantined", || {
        sample(&metrics(), "wasmswitch_plugin_quarantined", &["port=\"p1\"", "plugin=\"trap\"", "chain=\"shadow\""])
            == Some(1.0)
    });
    let view = String::from_utf8_lossy(&cli(&["shadow", "-c", c]).stdout).into_owned();
    assert!(view.contains("quarantined on some worker: trap"), "{view}");
    let out = cli(&["shadow", "promote", "p1", "-c", c]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("shadow plugin `trap` is quarantined on worker 0"), "{err}");

    // The API refuses what makes no sense, and discards p1's shadow.
    let (st, body) = http(port, "POST", "/api/v1/ports/p1/shadow/explode").unwrap();
    assert_eq!(st, 404, "{body}");
    let (st, body) = http(port, "POST", "/api/v1/ports/nope/shadow/promote").unwrap();
    assert!(st == 422 && body.contains("`nope` is not a port"), "{st} {body}");
    let (st, body) = http(port, "POST", "/api/v1/ports/p1/shadow/discard").unwrap();
    assert!(st == 200 && body.contains("\"discarded\":[\"trap\"]"), "{st} {body}");
    assert_eq!(get(port, "/api/v1/shadow")["ports"], serde_json::json!([]));
    let m = metrics();
    assert!(!m.contains("plugin=\"trap\""), "the discarded plugin's series are gone");
    // Each change counted by action and result: one promote applied, three refused (nothing to
    // promote, a quarantined plugin, no such port), one discard applied.
    let changes = |action: &str, result: &str| {
        sample(
            &m,
            "wasmswitch_shadow_changes_total",
            &[&format!("action=\"{action}\""), &format!("result=\"{result}\"")],
        )
    };
    assert_eq!(
        [
            changes("promote", "applied"),
            changes("promote", "refused"),
            changes("discard", "applied"),
            changes("discard", "refused")
        ],
        [Some(1.0), Some(3.0), Some(1.0), Some(0.0)],
        "{m}"
    );
    let out = cli(&["shadow", "-c", c]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no port has a shadow chain"));

    // A reload applies the file again: p1's live acl did not change, so its instance stays
    // (taken over by the worker: no fresh instance made); p0's changed back, and both shadow
    // chains are back.
    let out = cli(&["reload", "-c", c]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("plugins of port `p1` reloaded from their files (acl kept with its state; shadow: trap)"),
        "{text}"
    );
    assert!(text.contains("plugins of port `p0` reloaded from their files (acl; shadow: acl)"), "{text}");
    eventually("both shadow chains compare again", || {
        let sh = get(port, "/api/v1/shadow");
        ["p0", "p1"].iter().all(|p| shadow_of(&sh, p).is_some_and(|x| x["packets"].as_u64().unwrap() > 0))
    });
    let m = metrics();
    assert_eq!(
        sample(&m, "wasmswitch_plugin_reinstantiations_total", &["port=\"p1\"", "plugin=\"acl\""]),
        Some(0.0),
        "the kept instance was taken over, not remade"
    );
    let drops = port_drops(&m, "p0", "policy");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(port_drops(&metrics(), "p0", "policy"), drops, "p0's live acl allows all again");

    sigterm(&child);
    let status = child.wait().unwrap();
    assert!(status.success(), "the daemon stops cleanly with every frame back: {status}");
}

/// A scrape reads what calls produced (verdicts, the plugin's own counters) before the packets
/// the plugin was given, as a worker counts them the other way round: no scrape shows `acl`
/// deciding more packets than it was given, however fast they come.
#[test]
fn no_scrape_shows_a_plugin_counting_more_than_its_packets() {
    let Some(acl) = example_plugin("acl") else { return };
    let dir = Scratch::new("scrape-order");
    let port = free_port();
    let cfg = dir.write(&format!(
        "metrics:\n  listen: 127.0.0.1:{port}\nports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        src_macs: 16\n    plugins:\n      - name: acl\n        path: {}\n        config: |\n          {DENY_5001}\n  - name: p1\n    driver: sim\n",
        acl.display()
    ));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg.to_str().unwrap()]).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    let mut moving = 0;
    for _ in 0..200 {
        let m = http(port, "GET", "/metrics").unwrap().1;
        let packets = sample(&m, "wasmswitch_plugin_packets_total", &["plugin=\"acl\""]).unwrap();
        let verdicts = sample(&m, "wasmswitch_plugin_verdicts_total", &["plugin=\"acl\""]).unwrap();
        let own = sample(&m, "wasmswitch_plugin_events_total", &["counter=\"acl_allowed\""]).unwrap_or(0.0)
            + sample(&m, "wasmswitch_plugin_events_total", &["counter=\"acl_denied\""]).unwrap_or(0.0);
        assert!(verdicts <= packets && own <= packets, "{verdicts} verdicts, {own} counted, {packets} packets");
        moving += (packets > 0.0) as u32;
    }
    assert!(moving > 150, "the plugin saw traffic in {moving} scrapes of 200");
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

#[test]
fn check_refuses_a_bad_shadow_chain_by_name() {
    let Some(acl) = example_plugin("acl") else { return };
    let dir = Scratch::new("shadow-check");
    let good = yaml(free_port(), acl.to_str().unwrap(), acl.to_str().unwrap());
    // The same name twice in one shadow chain.
    let a = acl.to_str().unwrap();
    let twice = good.replace(
        &format!("      - name: trap\n        path: {a}\n"),
        &format!("      - name: x\n        path: {a}\n      - name: x\n        path: {a}\n"),
    );
    assert_ne!(twice, good);
    let out = cli(&["check", "-c", dir.write(&twice).to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("plugin `x` is already in this chain"), "{err}");
    // A shadow plugin whose init refuses its config names the chain.
    let bad = good.replace("deny proto=udp dport=5001", "deny proto=bogus");
    let out = cli(&["check", "-c", dir.write(&bad).to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("port `p0` (shadow chain)"), "{err}");
}

/// A plugin that redirects every packet to port id 9, which the switch does not have.
fn redirect_to_9() -> Vec<u8> {
    // Verdict records of 4 bytes at 40000 (kind 2 = redirect, 0, port u16 LE), then the list
    // (pointer, length) at 32 as the canonical ABI returns it. The batch's packet count is the
    // u16 at offset 2 of the input.
    plugin_with_process(
        "(local $n i32) (local $i i32)
    (local.set $n (i32.load16_u offset=2 (local.get 0)))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (i32.store (i32.add (i32.const 40000) (i32.shl (local.get $i) (i32.const 2))) (i32.const 589826))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (i32.store (i32.const 32) (i32.const 40000))
    (i32.store (i32.const 36) (i32.shl (local.get $n) (i32.const 2)))
    (return (i32.const 32))",
    )
}

#[test]
fn a_bad_redirect_is_dropped_counted_and_logged_once_per_plugin_and_port() {
    let dir = Scratch::new("bad-redirect");
    std::fs::write(dir.path("redirect.wasm"), redirect_to_9()).unwrap();
    let port = free_port();
    let cfg = dir.write(&format!(
        "metrics:
  listen: 127.0.0.1:{port}
workers:
  - idle: sleep
ports:
  - name: p0
    driver: sim
    sim:
      traffic:
        rate_pps: 20000
    plugins:
      - name: sender
        path: redirect.wasm
  - name: p1
    driver: sim
"
    ));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg.to_str().unwrap()]).stderr(Stdio::piped());
    die_with_test(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    wait_healthy(port, &mut child);
    eventually("2000 frames dropped as bad_redirect", || {
        port_drops(&http(port, "GET", "/metrics").unwrap().1, "p0", "bad_redirect") > 2000.0
    });
    let m = http(port, "GET", "/metrics").unwrap().1;
    assert_eq!(sample(&m, "wasmswitch_port_tx_packets_total", &["port=\"p1\""]).unwrap_or(0.0), 0.0, "{m}");
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("redirected a frame to port id 9")).collect();
    assert_eq!(lines.len(), 1, "one warning for thousands of bad redirects: {log}");
    assert!(lines[0].contains("plugin `sender` on port `p0` (worker 0)"), "{}", lines[0]);
}

/// A reload brings in a live plugin only if it passes `check`'s smoke run: one that traps on
/// the built-in frames is refused by name and the running one stays; one that faults only on
/// other traffic comes in (its faults are then the on_error policy's).
#[test]
fn a_reload_refuses_a_live_plugin_that_check_would_refuse() {
    let dir = Scratch::new("reload-smoke");
    std::fs::write(dir.path("pass.wasm"), plugin_that_faults_after(u32::MAX)).unwrap();
    std::fs::write(dir.path("trap.wasm"), plugin_with_process("(unreachable)")).unwrap();
    std::fs::write(dir.path("late.wasm"), plugin_that_faults_after(1000)).unwrap();
    let config = |file: &str| {
        dir.write(&format!(
            "workers:\n  - idle: sleep\nports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: pol\n        path: {}\n  - name: p1\n    driver: sim\n",
            dir.path(file).display()
        ))
    };
    let sw = wasmswitch::daemon::Switch::start(&config("pass.wasm")).unwrap();
    let path = |sw: &wasmswitch::daemon::Switch| sw.config().ports[0].plugins[0].file.clone();
    config("trap.wasm");
    let err = sw.reload().expect_err("a plugin that traps on the smoke frames").to_string();
    assert!(err.contains("nothing was changed") && err.contains("port `p0`") && err.contains("smoke run"), "{err}");
    assert_eq!(path(&sw), dir.path("pass.wasm"), "the running plugin stays");
    config("late.wasm");
    sw.reload().expect("a plugin that passes the smoke run");
    assert_eq!(path(&sw), dir.path("late.wasm"));
    sw.dataplane.stop_shared().expect("every frame back");
}
