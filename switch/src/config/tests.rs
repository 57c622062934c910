use std::path::Path;

use super::*;

const GOOD: &str = "
ports:
  - name: p0
    driver: sim
  - name: p1
    driver: sim
";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("test.yaml"))
}

#[test]
fn minimal_config_gets_defaults() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.ports.len(), 2);
    assert_eq!(c.pool.frame_size.value, 2048);
    assert_eq!(c.listen_addr().to_string(), "127.0.0.1:9187");
    assert_eq!(c.workers.len(), 1);
    assert_eq!(c.switch.mode, Mode::L2);
}

/// Each broken config: (what, yaml, expected line:col, a fragment of the message).
const BROKEN: &[(&str, &str, &str, &str)] = &[
    ("unknown key", "ports:\n  - name: p0\n    driver: sim\n    colour: blue\n", "4:5", "unknown field `colour`"),
    ("unknown top-level key", "portz: []\nports:\n  - name: p0\n    driver: sim\n", "1:1", "unknown field `portz`"),
    (
        "wrong type",
        "pool:\n  frames: lots\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "wrong type for `frames`: expected a non-negative integer",
    ),
    (
        "unknown driver",
        "ports:\n  - name: p0\n    driver: dpdk\n",
        "3:13",
        "unknown variant `dpdk`, expected one of sim, afxdp",
    ),
    (
        "duplicate port",
        "ports:\n  - name: p0\n    driver: sim\n  - name: p0\n    driver: sim\n",
        "4:11",
        "duplicate port name `p0` (first defined at line 2)",
    ),
    (
        "unknown port",
        "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        to: [p9]\n",
        "6:14",
        "unknown port `p9` in traffic.to",
    ),
    ("bad cpu", "workers:\n  - cpu: 4096\nports:\n  - name: p0\n    driver: sim\n", "2:10", "cpu 4096 does not exist"),
    (
        "bad queue count",
        "ports:\n  - name: p0\n    driver: sim\n    sim:\n      queues: 0\n",
        "5:15",
        "queues 0 is out of range",
    ),
    ("afxdp without interface", "ports:\n  - name: p0\n    driver: afxdp\n", "3:13", "has no `afxdp:` section"),
    (
        "bad frame size",
        "pool:\n  frame_size: 3000\nports:\n  - name: p0\n    driver: sim\n",
        "2:15",
        "expected 2048 or 4096",
    ),
    ("pool too small", "pool:\n  frames: 64\nports:\n  - name: p0\n    driver: sim\n", "2:11", "too small"),
    (
        "bad listen address",
        "metrics:\n  listen: localhost\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "not an address",
    ),
    ("not YAML", "ports: [unclosed\n  - : :\n", "2:5", "illegal placement"),
    ("no ports", "ports: []\n", "", "at least one port"),
    ("missing ports key", "workers:\n  - cpu: 0\n", "1:1", "missing field `ports`"),
];

#[test]
fn broken_configs_give_precise_errors() {
    for (what, yaml, at, fragment) in BROKEN {
        let e = parse(yaml).expect_err(what);
        let shown = e.to_string();
        assert!(shown.starts_with("test.yaml"), "{what}: error must name the file: {shown}");
        if !at.is_empty() {
            assert_eq!(format!("{}:{}", e.line, e.column), *at, "{what}: wrong position in `{shown}`");
            assert!(shown.starts_with(&format!("test.yaml:{at}: ")), "{what}: {shown}");
        }
        assert!(shown.contains(fragment), "{what}: expected `{fragment}` in `{shown}`");
    }
}

#[test]
fn missing_file_is_reported() {
    let e = Config::load(Path::new("/nonexistent/wasmswitch.yaml")).unwrap_err();
    assert!(e.to_string().starts_with("/nonexistent/wasmswitch.yaml: cannot read the config file"), "{e}");
}

#[test]
fn cross_mode_parses() {
    let c = parse(&format!("switch:\n  mode: cross\n{GOOD}")).unwrap();
    assert_eq!(c.switch.mode, Mode::Cross);
}
