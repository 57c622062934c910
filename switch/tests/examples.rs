//! The shipped Grafana dashboard and Prometheus rules (`examples/`) name only metrics the
//! daemon exports: every `wasmswitch_*` name in their `expr` fields must be in a live
//! exposition of the daemon on configs/sim.yaml with a plugin. The AF_XDP and host-port
//! families appear only when such ports exist: as root the daemon also gets an AF_XDP port on a
//! lab veth and a host port (TAP), so every name is checked live; without root those names are
//! listed as skipped (and under CI=true the test fails instead, as the other lab tests do).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use wasmswitch::lab::Lab;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Metric names (identifiers starting `wasmswitch_`) in a PromQL expression. Quoted text
/// (label values, Grafana legends) is skipped, and a name must start at an identifier boundary,
/// so `foo_wasmswitch_x` or `job="wasmswitch_x"` name nothing.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut chars = expr.char_indices().peekable();
    let mut prev: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            // Skip to the closing quote; backslash escapes apply except in raw (`) strings.
            let mut escaped = false;
            for (_, d) in chars.by_ref() {
                if escaped {
                    escaped = false;
                } else if d == '\\' && c != '`' {
                    escaped = true;
                } else if d == c {
                    break;
                }
            }
            prev = Some(c);
            continue;
        }
        if (c.is_ascii_alphabetic() || c == '_' || c == ':') && !prev.is_some_and(ident) {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !ident(d) {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            let word = &expr[i..end];
            if word.starts_with("wasmswitch_") {
                names.insert(word.to_string());
            }
            prev = word.chars().last();
            continue;
        }
        prev = Some(c);
    }
    names
}

/// Every string under an `expr` key, anywhere in the dashboard (panels, rows, targets).
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

#[derive(serde::Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(serde::Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

#[derive(serde::Deserialize)]
struct Rule {
    expr: String,
}

fn rule_exprs(yaml: &str) -> Vec<String> {
    let f: RuleFile = serde_saphyr::from_str(yaml).expect("examples/prometheus/wasmswitch-rules.yml parses");
    f.groups.into_iter().flat_map(|g| g.rules).map(|r| r.expr).collect()
}

/// Names with at least one sample in an exposition, plus each histogram's family name (`x`
/// for samples `x_bucket`, `x_sum`, `x_count`) when it has samples. A family the exposition
/// only declares (`# TYPE` with no samples, as the AF_XDP families are without an AF_XDP port)
/// does not count: a panel on it would stay empty.
fn exposed_names(body: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut histograms = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            if let (Some(name), Some("histogram")) = (w.next(), w.next()) {
                histograms.push(name.to_string());
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                names.insert(name.to_string());
            }
        }
    }
    for h in histograms {
        if names.contains(&format!("{h}_count")) {
            names.insert(h);
        }
    }
    names
}

fn is_exposed(name: &str, exposed: &BTreeSet<String>) -> bool {
    exposed.contains(name)
}

/// Families that exist only with an AF_XDP port or a host port.
fn needs_lab(name: &str) -> bool {
    ["wasmswitch_afxdp_", "wasmswitch_port_interface_", "wasmswitch_host_", "wasmswitch_tap_"]
        .iter()
        .any(|p| name.starts_with(p))
}

#[test]
fn metric_names_are_found_outside_quotes_and_at_word_starts() {
    let e = r#"sum by (port) (rate(wasmswitch_port_rx_packets_total{instance=~"$instance", x="wasmswitch_not_me"}[$__rate_interval])) / ignoring(event) wasmswitch_fdb_entries"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        ["wasmswitch_fdb_entries", "wasmswitch_port_rx_packets_total"]
    );
    // Escaped quotes stay inside the string; raw strings have no escapes.
    assert!(metric_names(r#"up{a="x\"wasmswitch_no"} + `wasmswitch_no\` + wasmswitch_yes"#).contains("wasmswitch_yes"));
    assert_eq!(metric_names(r#"up{a="x\"wasmswitch_no"} + `c:\` + wasmswitch_yes"#).len(), 1);
    // Not at an identifier start, and recording-rule style names with colons.
    assert!(metric_names("my_wasmswitch_x + x:wasmswitch_y").is_empty());
    assert_eq!(metric_names("wasmswitch_a:rate5m").into_iter().next().unwrap(), "wasmswitch_a:rate5m");
    assert!(metric_names("up == 0 and probe_success").is_empty());

    let body = "# HELP wasmswitch_h A histogram.\n# TYPE wasmswitch_h histogram\nwasmswitch_h_bucket{le=\"1\"} 0\nwasmswitch_h_sum 0\nwasmswitch_h_count 0\nwasmswitch_up 1\n# TYPE wasmswitch_declared_total counter\n# TYPE wasmswitch_e histogram\n";
    let exposed = exposed_names(body);
    for n in ["wasmswitch_h", "wasmswitch_h_bucket", "wasmswitch_h_count", "wasmswitch_up"] {
        assert!(is_exposed(n, &exposed), "{n}");
    }
    for n in
        ["wasmswitch_gone", "wasmswitch_up_count", "wasmswitch_declared_total", "wasmswitch_e", "wasmswitch_e_count"]
    {
        assert!(!is_exposed(n, &exposed), "{n}");
    }

    // A folded multi-line expr (as the rules file writes them) and an inline one; other keys
    // of a rule are ignored.
    let rules = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: >-\n          wasmswitch_a\n            > ignoring(x) wasmswitch_c\n        for: 1m\n      - record: b\n        expr: wasmswitch_b\n";
    let exprs = rule_exprs(rules);
    assert_eq!(exprs.len(), 2, "{exprs:?}");
    let names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["wasmswitch_a", "wasmswitch_b", "wasmswitch_c"]);
}

#[test]
fn every_metric_the_dashboard_and_the_rules_use_is_exported() {
    let mut used: Vec<(String, &str)> = Vec::new();
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("examples/grafana/wasmswitch-dashboard.json")).unwrap())
            .unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard has {} expressions", exprs.len());
    used.extend(exprs.iter().flat_map(|e| metric_names(e)).map(|n| (n, "dashboard")));
    let rules = rule_exprs(&std::fs::read_to_string(repo("examples/prometheus/wasmswitch-rules.yml")).unwrap());
    assert!(rules.len() >= 6, "the rules have {} expressions", rules.len());
    used.extend(rules.iter().flat_map(|e| metric_names(e)).map(|n| (n, "rules")));

    let lab_ok = require_lab("every_metric_the_dashboard_and_the_rules_use_is_exported");
    let dir = Scratch::new("examples");
    let port = free_port();
    std::fs::write(dir.path("trap.wasm"), plugin_with_process("(unreachable)")).unwrap();
    // sim.yaml as shipped, on a free port, with a plugin on p0 (its metrics appear once a
    // plugin is loaded) and, as root, an AF_XDP port and a host port.
    let mut yaml = std::fs::read_to_string(repo("configs/sim.yaml"))
        .unwrap()
        .replace("127.0.0.1:9187", &format!("127.0.0.1:{port}"))
        .replacen(
            "  - name: p0\n    driver: sim\n",
            "  - name: p0\n    driver: sim\n    plugins:\n      - name: trap\n        path: trap.wasm\n",
            1,
        );
    assert!(yaml.contains("path: trap.wasm"), "configs/sim.yaml no longer starts p0 as expected");
    let lab = lab_ok.then(|| Lab::create(&format!("wx{}", std::process::id() % 10_000), 1, 1, 46).unwrap());
    if let Some(lab) = &lab {
        // `ports:` is the last section of sim.yaml, so the AF_XDP port joins its list.
        yaml += &format!("  - name: x0\n    driver: afxdp\n    afxdp:\n      interface: {}\n", lab.hosts[0].switch_if);
        // Rings of 1024: sim.yaml's pool of 16384 frames has no room for the default 4096.
        yaml += &format!("host:\n  tap: wxt{}\n  ring_size: 1024\n", std::process::id() % 10_000);
    }
    let cfg = dir.write(&yaml);
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg).env("WASMSWITCH_CACHE_DIR", dir.path("cache")).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    wait_healthy(port, &mut daemon);
    let (status, body) = http(port, "GET", "/metrics").unwrap();
    assert_eq!(status, 200);
    let exposed = exposed_names(&body);
    // As root this exposition has every family (the host port's histogram too).
    assert_promtool_accepts(&body);
    sigterm(&daemon);
    assert!(daemon.wait().unwrap().success(), "the daemon stops cleanly");

    let mut missing = Vec::new();
    let mut skipped = BTreeSet::new();
    for (name, from) in &used {
        if is_exposed(name, &exposed) {
            continue;
        }
        if lab.is_none() && needs_lab(name) {
            skipped.insert(name.clone());
        } else {
            missing.push(format!("{name} (in the {from})"));
        }
    }
    if !skipped.is_empty() {
        eprintln!("not checked without an AF_XDP and a host port (needs root): {skipped:?}");
    }
    assert!(missing.is_empty(), "not in the daemon's exposition: {missing:?}");
}
