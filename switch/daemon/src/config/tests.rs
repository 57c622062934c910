use std::path::{Path, PathBuf};

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
    assert_eq!(c.switch.batch.value, 64);
    // Bigger batches flood more copies at once: the pool check counts room for them.
    let big = parse(&format!("switch:\n  batch: 256\n{GOOD}")).unwrap();
    assert_eq!(big.frames_needed() - c.frames_needed(), 256 * 16 - 1024);
}

/// Each broken config: (what, yaml, expected line:col, a fragment of the message).
const BROKEN: &[(&str, &str, &str, &str)] = &[
    (
        "empty plugin name",
        "ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: \"\"\n        path: a.wasm\n",
        "5:15",
        "port `p0`: plugin name \"\" is not valid: expected 1-32 letters",
    ),
    (
        "plugin name with a quote and a newline",
        "ports:\n  - name: p0\n    driver: sim\n    shadow:\n      - name: \"a\\\"b\\nc\"\n        path: a.wasm\n",
        "5:15",
        "plugin name \"a\\\"b\\nc\" is not valid",
    ),
    ("unknown key", "ports:\n  - name: p0\n    driver: sim\n    colour: blue\n", "4:5", "unknown field `colour`"),
    ("unknown top-level key", "portz: []\nports:\n  - name: p0\n    driver: sim\n", "1:1", "unknown field `portz`"),
    (
        "wrong type",
        "pool:\n  frames: lots\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "wrong type for `frames`: expected a non-negative integer",
    ),
    (
        "a whole number too large for its type",
        "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic: { dst_port: 65536 }\n",
        "5:28",
        "`dst_port` 65536 is out of range: expected 0-65535",
    ),
    (
        "a number too large for its type quotes the key's own range",
        "pool:\n  frames: 99999999999\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "pool.frames 99999999999 is out of range: expected 1024-1048576",
    ),
    (
        "a number too large for a 64-bit key quotes the key's own range",
        "switch:\n  batch: 99999999999999999999\nports:\n  - name: p0\n    driver: sim\n",
        "2:10",
        "switch.batch 99999999999999999999 is out of range: expected 1-256",
    ),
    (
        "two YAML documents",
        "ports:\n  - name: p0\n    driver: sim\n---\nports: []\n",
        "5:1",
        "a second YAML document (after a `---` line) starts here: a config is one document",
    ),
    (
        "wrong type in an inline mapping",
        "ports:\n  - name: p0\n    driver: sim\n    sim: { ring_size: 1024, queues: -1 }\n",
        "4:37",
        "wrong type for `queues`: expected a non-negative integer",
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
    ("empty umem", "ports:\n  - name: p0\n    driver: sim\n    umem: ''\n", "4:11", "umem `` is not valid"),
    (
        "umem name too long",
        "ports:\n  - name: p0\n    driver: sim\n    umem: abcdefghijklmnopqrstuvwxyz0123456\n",
        "4:11",
        "umem `abcdefghijklmnopqrstuvwxyz0123456` is not valid: expected 1-32",
    ),
    ("umem name with a space", "ports:\n  - name: p0\n    driver: sim\n    umem: a b\n", "4:11", "umem `a b` is not valid"),
    (
        "one umem group too many",
        "ports:\n  - {name: p0, driver: sim, umem: a}\n  - {name: p1, driver: sim, umem: b}\n  - {name: p2, driver: sim, umem: c}\n  - {name: p3, driver: sim, umem: d}\n  - {name: p4, driver: sim, umem: a}\n  - {name: p5, driver: sim, umem: e}\n",
        "7:35",
        "umem `e` is one named UMEM group too many: at most 4",
    ),
    (
        "bad frame size",
        "pool:\n  frame_size: 3000\nports:\n  - name: p0\n    driver: sim\n",
        "2:15",
        "expected 2048 or 4096",
    ),
    ("pool too small", "pool:\n  frames: 1024\nports:\n  - name: p0\n    driver: sim\n", "2:11", "too small"),
    (
        "pool.cache from the issue",
        "pool:\n  cache: 18446744073709551599\nports:\n  - name: p0\n    driver: sim\n",
        "2:10",
        "pool.cache 18446744073709551599 is out of range: expected 16-4096",
    ),
    (
        "a batch of none",
        "switch:\n  batch: 0\nports:\n  - name: p0\n    driver: sim\n",
        "2:10",
        "switch.batch 0 is out of range: expected 1-256",
    ),
    ("a batch past the arrays", "switch:\n  batch: 257\nports:\n  - name: p0\n    driver: sim\n", "2:10", "expected 1-256"),
    (
        "pool.ring from the issue",
        "pool:\n  ring: 4611686018427387904\nports:\n  - name: p0\n    driver: sim\n",
        "2:9",
        "pool.ring 4611686018427387904 is out of range",
    ),
    (
        "fdb.capacity from the issue",
        "fdb:\n  capacity: 1099511627776\nports:\n  - name: p0\n    driver: sim\n",
        "2:13",
        "fdb.capacity 1099511627776 is out of range: expected 64-16777216",
    ),
    (
        "mtu above what a 2048-byte frame holds",
        "ports:\n  - name: p0\n    driver: sim\n    mtu: 9000\n",
        "4:10",
        "mtu 9000 is out of range: expected 68-1770",
    ),
    (
        "a host mtu whose frames could fill the TAP read (one cut short would pass)",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: t0\n  mtu: 1770\n",
        "6:8",
        "host.mtu 1770 is out of range: expected 68-1769",
    ),
    (
        "mtu above what a 4096-byte frame holds",
        "pool:\n  frame_size: 4096\nports:\n  - name: p0\n    driver: sim\n    mtu: 3819\n",
        "6:10",
        "expected 68-3818",
    ),
    (
        "a deadline that would stall the worker for a second",
        "ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: x\n        path: /dev/null\n        deadline_us: 1000000\n",
        "7:22",
        "deadline_us 1000000 is out of range: expected 10-10000",
    ),
    (
        "max_faults without bound",
        "ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: x\n        path: /dev/null\n        max_faults: 4000000000\n",
        "7:21",
        "max_faults 4000000000 is out of range: expected 1-100",
    ),
    (
        "sim traffic src_macs 0",
        "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        src_macs: 0\n",
        "6:19",
        "src_macs 0 is out of range",
    ),
    (
        "bad listen address",
        "metrics:\n  listen: localhost\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "not an address",
    ),
    (
        "host MAC that is not a MAC",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: t0\n  mac: 02:zz:00:00:00:01\n",
        "6:8",
        "is not a MAC address",
    ),
    (
        "host MAC that is multicast",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: t0\n  mac: 01:00:5e:00:00:01\n",
        "6:8",
        "must be unicast",
    ),
    (
        "TAP name with a slash",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: \"t/0\"\n",
        "5:8",
        "contains '/', ':', '%', whitespace or NUL",
    ),
    (
        "TAP name that is a kernel pattern",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: \"t%d\"\n",
        "5:8",
        "contains '/', ':', '%', whitespace or NUL",
    ),
    (
        "static entry for the host's address on another port",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: t0\n  mac: 02:ee:00:00:00:07\nfdb:\n  static:\n    - { mac: \"02:ee:00:00:00:07\", port: p0 }\n",
        "9:14",
        "is the host port's own address (host.mac): it is on `host`",
    ),
    (
        "listen port 0",
        "metrics:\n  listen: 127.0.0.1:0\nports:\n  - name: p0\n    driver: sim\n",
        "2:11",
        "port 0 would listen on a port the kernel picks",
    ),
    (
        "TAP name that is a path element",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: \"..\"\n",
        "5:8",
        "'.' and '..' are not interface names",
    ),
    (
        "TAP name too long",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: t0123456789abcdef\n",
        "5:8",
        "longer than 15 bytes",
    ),
    (
        // `lo` exists everywhere, with one queue.
        "a queue the interface does not have",
        "ports:\n  - name: p0\n    driver: afxdp\n    afxdp: { interface: lo, allow_control_interface: true, queues: [5] }\n",
        "4:68",
        "interface lo: queue 5 does not exist, the interface has 1 queue(s)",
    ),
    (
        "an empty key and value",
        "ports:\n  - name: p0\n    driver: sim\n  - : :\n",
        "4:5",
        "a key or value is missing here: expected text",
    ),
    (
        "a name left empty",
        "ports:\n  - name:\n    driver: sim\n",
        "2:9",
        "`name` has no value: expected text",
    ),
    (
        "a key twice",
        "ports:\n  - name: p0\n    driver: sim\n    driver: sim\n",
        "4:5",
        "duplicate key `driver`: each key may appear once in a mapping",
    ),
    (
        "two ports on one interface",
        "ports:\n  - name: p0\n    driver: afxdp\n    afxdp: { interface: wsnone0 }\n  - name: p1\n    driver: afxdp\n    afxdp: { interface: wsnone0 }\n",
        "7:25",
        "interface wsnone0 is already port `p0`'s (line 4)",
    ),
    (
        "the TAP named as a port's interface",
        "ports:\n  - name: p0\n    driver: afxdp\n    afxdp: { interface: wsnone0 }\nhost:\n  tap: wsnone0\n",
        "6:8",
        "host.tap `wsnone0` is port `p0`'s interface",
    ),
    (
        // `lo` exists everywhere and is no TAP: `run` could never create the TAP.
        "TAP name of an existing interface",
        "ports:\n  - name: p0\n    driver: sim\nhost:\n  tap: lo\n",
        "5:8",
        "interface name \"lo\" is already taken by another interface",
    ),
    (
        "the loopback interface",
        "ports:\n  - name: p0\n    driver: afxdp\n    afxdp:\n      interface: lo\n",
        "5:18",
        "interface lo carries the host's loopback traffic",
    ),
    ("access without vid", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: access }\n", "4:19", "needs `vid:`"),
    ("vid 0", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: access, vid: 0 }\n", "4:32", "vlan.vid 0 is out of range: expected 1-4094"),
    ("vid 4095", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: access, vid: 4095 }\n", "4:32", "vlan.vid 4095 is out of range"),
    ("backwards range", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [\"30-20\"] }\n", "4:35", "range 30-20 is backwards"),
    ("range past 4094", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [\"4000-4095\"] }\n", "4:35", "VLAN id 4095 is out of range"),
    ("vid past u64", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [10, 18446744073709551616] }\n", "4:40", "VLAN id 18446744073709552000 is out of range: expected 1-4094"),
    ("allowed of the wrong type, inline", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: true }\n", "4:26", "wrong type for `allowed`: got boolean `true`, expected a list of VLAN ids"),
    ("vid with a leading zero", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [010] }\n", "4:36", "a VLAN id is a plain whole number: write 10 without a leading zero"),
    ("vid with an exponent", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [1e1] }\n", "4:36", "write 10 without a leading zero, exponent or decimal point"),
    ("vid past 4094 with an exponent", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [1e4] }\n", "4:36", "VLAN id 10000 is out of range: expected 1-4094"),
    ("one range alone, not in a list, past 4094", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: \"4000-4095\" }\n", "4:35", "VLAN id 4095 is out of range"),
    ("vid with a fraction", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [1.5] }\n", "4:36", "1.5 is not a VLAN id: expected a whole number"),
    ("not a vid", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, allowed: [ten] }\n", "4:36", "`ten` is not a VLAN id"),
    ("trunk with vid", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: trunk, vid: 3, allowed: [3] }\n", "4:19", "not `vid:`"),
    ("unknown mode", "ports:\n  - name: p0\n    driver: sim\n    vlan: { mode: hybrid, vid: 3 }\n", "4:19", "unknown variant `hybrid`"),
    ("max_macs over the capacity", "fdb:\n  capacity: 1024\nports:\n  - name: p0\n    driver: sim\n    fdb: { max_macs: 1025 }\n", "6:22", "port `p0`: fdb.max_macs 1025 is out of range: expected 0-1024 (0: no limit; at most fdb.capacity)"),
    ("storm over the range", "ports:\n  - name: p0\n    driver: sim\n    storm: { broadcast_pps: 1000000001 }\n", "4:29", "storm.broadcast_pps 1000000001 is out of range"),
    ("mirror to itself", "ports:\n  - name: p0\n    driver: sim\nmirrors:\n  - { name: m, sources: [p0], destination: p0 }\n", "5:25", "cannot mirror to itself"),
    ("mirror of a destination", "ports:\n  - name: p0\n    driver: sim\n  - name: p1\n    driver: sim\n  - name: p2\n    driver: sim\nmirrors:\n  - { name: a, sources: [p0], destination: p1 }\n  - { name: b, sources: [p1], destination: p2 }\n", "9:44", "is a source of mirror `b`"),
    ("mirror to no port", "ports:\n  - name: p0\n    driver: sim\nmirrors:\n  - { name: m, sources: [p0], destination: px }\n", "5:44", "destination `px` is not a port"),
    ("static entry outside the port's VLANs", "fdb:\n  static:\n    - { mac: 02:00:00:00:00:01, vlan: 20, port: p0 }\nports:\n  - name: p0\n    driver: sim\n", "3:49", "port `p0` does not carry VLAN 20"),
    ("static group address", "fdb:\n  static:\n    - { mac: 01:00:5e:00:00:01, port: p0 }\nports:\n  - name: p0\n    driver: sim\n", "3:14", "is a group or all-zero address"),
    ("host name", "host:\n  tap: wsx0\n  name: 'h\"x/y'\nports:\n  - name: p0\n    driver: sim\n", "3:9", "host port name `h\"x/y` is not valid"),
    ("static zero address", "fdb:\n  static:\n    - { mac: 00:00:00:00:00:00, port: p0 }\nports:\n  - name: p0\n    driver: sim\n", "3:14", "is a group or all-zero address"),
    ("static twice", "fdb:\n  static:\n    - { mac: 02:00:00:00:00:01, port: p0 }\n    - { mac: 02:00:00:00:00:01, port: p0 }\nports:\n  - name: p0\n    driver: sim\n", "4:14", "already defined at line 3"),
    ("IP version 5", "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic: { ip: 5 }\n", "5:22", "ip 5 is not an IP version: expected 4 or 6"),
    ("TCP flags on UDP", "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic: { tcp_flags: S }\n", "5:29", "tcp_flags needs proto: tcp"),
    ("a letter that is no flag", "ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic: { proto: tcp, tcp_flags: SX }\n", "5:41", "`X` is not a flag"),
    ("not YAML", "ports: [unclosed\n  - : :\n", "2:5", "illegal placement"),
    ("no ports", "ports: []\n", "", "at least one port"),
    ("missing ports key", "workers:\n  - cpu: 0\n", "1:1", "missing field `ports`"),
];

/// The static budget holds for the config's entries as for the API's: `check` (and so `run`
/// and a reload) refuses the first one beyond it, at its line, saying why.
#[test]
fn static_entries_beyond_the_fdb_budget_are_refused_at_their_line() {
    let yaml = |n: usize| {
        let mut y = "fdb:\n  capacity: 64\n  static:\n".to_string();
        for i in 0..n {
            y += &format!("    - {{ mac: \"02:00:00:00:{:02x}:{:02x}\", port: p0 }}\n", i / 256, i % 256);
        }
        y + "ports:\n  - name: p0\n    driver: sim\n"
    };
    let fits = (1..=64).take_while(|&n| parse(&yaml(n)).is_ok()).last().unwrap_or(0);
    let max = wasmswitch_core::fdb::max_statics(64);
    assert!((wasmswitch_core::fdb::MAX_STATICS_PER_BUCKET..=max).contains(&fits), "{fits} of {max} fit");
    let e = parse(&yaml(fits + 1)).unwrap_err();
    assert_eq!(e.line as usize, 4 + fits, "{e}");
    assert!(e.message.contains("fdb.static: ") && e.message.contains("static entries, the most"), "{e}");
}

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

/// Eleven plugins at 10 ms each: more than the 100 ms a round may spend in plugins.
#[test]
fn the_sum_of_plugin_deadlines_is_bounded() {
    let mut yaml = String::from("ports:\n");
    for p in 0..2 {
        yaml += &format!("  - name: p{p}\n    driver: sim\n    plugins:\n");
        for i in 0..6 {
            let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
            yaml += &format!("      - name: x{i}\n        path: {file}\n        deadline_us: 10000\n");
        }
    }
    let e = parse(&yaml).unwrap_err();
    assert!(e.to_string().contains("add up to more than 100000"), "{e}");
    assert!(e.line > 0, "{e}");
    // Each counted as the 1 ms epoch clock enforces it: 10 µs holds a spinning call as long as
    // 1 ms does (2 ms to the first firing), so 50 such plugins fit and 51 do not.
    let tiny = |n: usize| {
        let mut yaml = String::from("ports:\n");
        for p in 0..n.div_ceil(8) {
            yaml += &format!("  - name: p{p}\n    driver: sim\n    plugins:\n");
            for i in 0..(n - 8 * p).min(8) {
                let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
                yaml += &format!("      - name: x{i}\n        path: {file}\n        deadline_us: 10\n");
            }
        }
        parse(&yaml)
    };
    assert!(tiny(50).is_ok(), "{:?}", tiny(50).err());
    let e = tiny(51).unwrap_err();
    assert!(e.to_string().contains("as the 1 ms epoch clock enforces it"), "{e}");
}

#[test]
fn a_trunks_allowed_may_be_one_id_or_range_alone_as_a_number_or_a_string() {
    let allowed = |a: &str| {
        let c = parse(&format!("ports:\n  - name: p0\n    driver: sim\n    vlan: {{ mode: trunk, allowed: {a} }}\n"))
            .unwrap();
        let v = c.ports[0].vlan.as_ref().unwrap();
        v.allowed.as_ref().unwrap().value.expand("allowed").unwrap().iter().map(|v| v.get()).collect::<Vec<_>>()
    };
    assert_eq!(allowed("10"), [10]);
    assert_eq!(allowed("\"10\""), [10]);
    assert_eq!(allowed("\"20-22\""), [20, 21, 22]);
    assert_eq!(allowed("[10, \"20-21\"]"), [10, 20, 21]);
}

#[test]
fn generated_traffic_a_ports_vlans_would_drop_is_warned_of() {
    let warned = |vlan: &str, traffic: &str| {
        parse(&format!(
            "ports:\n  - name: p0\n    driver: sim\n    vlan: {vlan}\n    sim:\n      traffic: {{ {traffic} }}\n  - name: p1\n    driver: sim\n"
        ))
        .unwrap()
        .traffic_filtered_warnings()
    };
    assert_eq!(
        warned("{ mode: trunk, allowed: [10] }", "vlan: [10, 30]"),
        ["port `p0`: its generated frames tagged 30 would all be dropped as vlan_filtered: its VLANs do not admit them"]
    );
    assert_eq!(
        warned("{ mode: trunk, allowed: [10] }", "rate_pps: 10"),
        ["port `p0`: its generated frames untagged would all be dropped as vlan_filtered: its VLANs do not admit them"]
    );
    assert!(warned("{ mode: trunk, allowed: [10], native: 20 }", "rate_pps: 10").is_empty());
    assert!(warned("{ mode: access, vid: 20 }", "vlan: 20").is_empty(), "a tag of the PVID is admitted");
    assert!(warned("{ mode: trunk, allowed: [10, 30] }", "vlan: [10, 30]").is_empty());
}

#[test]
fn cross_mode_parses() {
    let c = parse(&format!("switch:\n  mode: cross\n{GOOD}")).unwrap();
    assert_eq!(c.switch.mode, Mode::Cross);
}

/// Outside `l2` the pipeline neither parses nor looks up, so what only the L2 stage applies is
/// refused by name where it is written, not accepted and ignored (an ACL that looked enforced).
#[test]
fn what_only_l2_applies_is_refused_in_the_other_modes() {
    let port = "ports:\n  - name: p0\n    driver: sim\n";
    let cases = [
        ("    plugins:\n      - name: acl\n        path: acl.wasm\n", "5:15", "port `p0`: plugin `acl`"),
        ("    shadow:\n      - name: new\n        path: acl.wasm\n", "5:15", "port `p0`: plugin `new`"),
        ("    vlan: { mode: access, vid: 10 }\n", "2:11", "port `p0`: `vlan`"),
        ("    storm: { broadcast_pps: 100 }\n", "2:11", "port `p0`: `storm`"),
        ("    fdb: { max_macs: 100 }\n", "2:11", "port `p0`: `fdb`"),
        (
            "  - name: p1\n    driver: sim\nmirrors:\n  - name: m\n    sources: [p0]\n    destination: p1\n",
            "7:11",
            "mirror `m`",
        ),
        (
            "fdb:\n  static:\n    - { mac: \"02:00:00:00:00:01\", port: p0 }\n",
            "6:14",
            "the static FDB entry 02:00:00:00:00:01",
        ),
        ("host:\n  tap: wsx0\n", "5:8", "the host port"),
    ];
    for mode in ["passthrough", "cross"] {
        for (extra, at, what) in cases {
            let yaml = format!("{port}{extra}switch:\n  mode: {mode}\n");
            let e = parse(&yaml).unwrap_err();
            assert_eq!(format!("{}:{}", e.line, e.column), at, "{mode}, {what}: {e}");
            assert_eq!(
                e.message,
                format!("{what} needs switch.mode l2: `{mode}` sends frames on unparsed, so it would be ignored"),
                "{yaml}"
            );
            // The same file in l2 passes this check (it may fail a later one, never this one).
            let l2 = parse(&yaml.replace(&format!("mode: {mode}"), "mode: l2"));
            assert!(l2.as_ref().err().is_none_or(|e| !e.message.contains("needs switch.mode l2")), "{l2:?}");
        }
    }
}

/// A token of the shortest length accepted ([`super::MIN_TOKEN_BYTES`]).
const TOKEN: &str = "0123456789abcdef";

/// A folder of token files for one test, removed when the test ends (also when it fails).
struct TokenDir(PathBuf);

impl TokenDir {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("wasmswitch-config-tests-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TokenDir(dir)
    }

    /// A token file with `mode` holding `text`.
    fn file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }
}

impl Drop for TokenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_token_is_read_trimmed_and_never_shown() {
    let dir = TokenDir::new("trimmed");
    let f = dir.file("good", "  s3cret-token-0123456789==\n", 0o600);
    let c = parse(&format!("control:\n  token_file: {}\n{GOOD}", f.display())).unwrap();
    assert_eq!(c.control.token.as_ref().unwrap().as_bytes(), b"s3cret-token-0123456789==");
    assert!(!format!("{c:?}").contains("s3cret"), "Debug shows the token");
    assert!(!serde_json::to_string(&c).unwrap().contains("s3cret"), "the served config shows the token");
    // Another token file is applied by a reload.
    let g = dir.file("other", "another-token-0123456789", 0o600);
    let d = parse(&format!("control:\n  token_file: {}\n{GOOD}", g.display())).unwrap();
    let plan = diff::plan(&c, &d);
    assert!(plan.restart.is_empty() && plan.live.len() == 1, "{plan:?}");
    // The shortest token accepted, whitespace around it not counted.
    assert_eq!(TOKEN.len(), MIN_TOKEN_BYTES);
    let e = dir.file("edge", &format!(" {TOKEN}\n"), 0o600);
    let c = parse(&format!("control:\n  token_file: {}\n{GOOD}", e.display())).unwrap();
    assert_eq!(c.control.token.as_ref().unwrap().as_bytes(), TOKEN.as_bytes());
    assert_eq!((plan.live[0].key.as_str(), plan.live[0].at.as_str()), ("control.token_file", "test.yaml:2:15"));
}

#[test]
fn a_token_file_that_is_not_private_small_and_filled_is_refused_at_its_key() {
    let dir = TokenDir::new("refused");
    let big = "x".repeat(5000);
    let cases = [
        (dir.file("group", TOKEN, 0o640), "mode 0640", "chmod 600"),
        (dir.file("world", TOKEN, 0o604), "mode 0604", "chmod 600"),
        (dir.file("empty", " \n", 0o600), "is empty", ""),
        (dir.file("big", &big, 0o600), "5000 bytes: at most 4096", ""),
        (dir.file("spaces", "two words", 0o600), "printable ASCII", ""),
        // One byte short of the minimum, whitespace around it not counted.
        (
            dir.file("short", " 0123456789abcde\n", 0o600),
            "a token of 15 bytes: at least 16",
            "head -c 24 /dev/urandom | base64",
        ),
        (dir.file("one", "x", 0o600), "a token of 1 bytes: at least 16", "head -c 24 /dev/urandom | base64"),
        (PathBuf::from("/dev/null"), "not a regular file", ""),
        (PathBuf::from("/nonexistent/token"), "cannot read /nonexistent/token", ""),
    ];
    for (f, fragment, hint) in cases {
        let e = parse(&format!("{GOOD}control:\n  token_file: {}\n", f.display())).unwrap_err();
        assert_eq!((e.line, e.column), (8, 15), "{e}");
        let shown = e.to_string();
        assert!(shown.starts_with("test.yaml:8:15: control.token_file: "), "{shown}");
        assert!(shown.contains(fragment) && shown.contains(hint), "expected `{fragment}` in {shown}");
    }
}

#[test]
fn a_plugin_path_that_cannot_be_resolved_is_refused_at_its_key_naming_the_errno() {
    // All of these were "no such file ... (build plugins with plugins/build.sh)".
    let dir = TokenDir::new("plugin-errno");
    let link = dir.0.join("loop.wasm");
    std::os::unix::fs::symlink(&link, &link).unwrap();
    let regular = dir.file("regular", "x", 0o600);
    let cases = [
        (link, "cannot read", "Too many levels of symbolic links (os error 40)"),
        (regular.join("acl.wasm"), "cannot read", "Not a directory (os error 20)"),
        (dir.0.join("absent.wasm"), "no such file", "plugins/build.sh"),
    ];
    for (path, what, why) in cases {
        let yaml = format!(
            "ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: acl\n        path: {}\n",
            path.display()
        );
        let shown = parse(&yaml).unwrap_err().to_string();
        assert!(shown.starts_with("test.yaml:6:15: "), "at the plugin's path: {shown}");
        let said = format!("plugin `acl`: {what} {}", path.display());
        assert!(shown.contains(&said) && shown.contains(why), "expected `{said}` and `{why}`: {shown}");
    }
}

#[test]
fn a_non_loopback_listen_needs_a_token() {
    let dir = TokenDir::new("listen");
    let yaml = format!("metrics:\n  listen: 0.0.0.0:9187\n{GOOD}");
    let e = parse(&yaml).unwrap_err();
    assert_eq!((e.line, e.column), (2, 11), "{e}");
    assert!(e.message.contains("metrics.listen 0.0.0.0:9187 is not a loopback address"), "{e}");
    assert!(e.message.contains("control.token_file"), "{e}");
    let f = dir.file("remote", TOKEN, 0o400);
    parse(&format!("{yaml}control:\n  token_file: {}\n", f.display())).unwrap();
    parse(&format!("metrics:\n  listen: \"[::1]:9187\"\n{GOOD}")).unwrap();
}

/// Every key written out, none left to a default.
/// Its token file is written into `dir`, the calling test's own.
fn full_yaml(dir: &TokenDir) -> String {
    let plugin = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let token = dir.file("full", TOKEN, 0o600);
    let token = token.display();
    format!(
        "switch:
  mode: l2
metrics:
  listen: 127.0.0.1:9300
control:
  token_file: {token}
pool:
  frames: 65536
  frame_size: 2048
  cache: 128
  ring: 2048
fdb:
  capacity: 16384
  aging_seconds: 300
  static:
    - mac: 02:00:00:00:00:99
      vlan: 10
      port: p1
workers:
  - cpu: 0
    idle: poll
  - idle: sleep
ports:
  - name: p0
    driver: sim
    mtu: 1500
    sim:
      queues: 2
      ring_size: 1024
      traffic:
        rate_pps: 1000
        src_macs: 16
        frame_sizes: [64, 128]
        broadcast_percent: 5
        flows: 64
        vlan: [10, \"20-21\"]
        to: [p1]
    vlan:
      mode: trunk
      allowed: [10, \"20-22\"]
      native: 1
    storm:
      broadcast_pps: 1000
      multicast_pps: 500
      unknown_unicast_pps: 200
    fdb:
      max_macs: 100
    plugins:
      - name: a
        path: {plugin}
        config: rules
        header_bytes: 64
        on_error: drop
        deadline_us: 2000
        memory_limit_kib: 1024
        max_faults: 3
    shadow:
      - name: a
        path: {plugin}
        config: rules v2
        max_faults: 2
  - name: p1
    driver: afxdp
    afxdp:
      interface: veth0
      mode: native
      bind: copy
      queues: [0, 1]
      ring_size: 512
    vlan:
      mode: access
      vid: 10
mirrors:
  - name: m0
    sources: [p0]
    direction: both
    destination: host
host:
  name: host
  tap: wss0
  mac: 02:ee:00:00:00:01
  mtu: 1500
  workers: 1
  ring_size: 1024
  bulk: 8
  vlan:
    mode: trunk
    allowed: [10]
    native: 1
"
    )
}

/// Leaf paths of a JSON value, in `plan`'s notation.
fn leaves(v: &serde_json::Value, path: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                leaves(x, if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out)
            }
        }
        serde_json::Value::Array(a) => {
            // The list itself (grown by one) and each item.
            out.push(path.clone());
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{path}[{i}]"), out)
            }
        }
        _ => out.push(path),
    }
}

fn get_mut<'a>(v: &'a mut serde_json::Value, path: &str) -> &'a mut serde_json::Value {
    let mut v = v;
    for part in path.split('.') {
        let (name, idx) = part.split_once('[').map_or((part, ""), |(n, i)| (n, i));
        v = &mut v[name];
        for i in idx.split(['[', ']']).filter(|s| !s.is_empty()) {
            v = &mut v[i.parse::<usize>().unwrap()];
        }
    }
    v
}

/// Another valid value for the key (or as close as a generic rule gets).
fn mutate(path: &str, v: &serde_json::Value) -> serde_json::Value {
    use serde_json::{json, Value};
    let last = path.rsplit('.').next().unwrap();
    match v {
        Value::Array(a) => {
            let mut a = a.clone();
            a.push(a.last().cloned().unwrap_or(Value::Null));
            if last.starts_with("workers") {
                // A second worker on cpu 0 would be refused for that, not for the count.
                a.last_mut().unwrap()["cpu"] = Value::Null;
            }
            Value::Array(a)
        }
        Value::Bool(b) => json!(!b),
        Value::Number(n) if n.is_f64() => json!(n.as_f64().unwrap() + 1.0),
        Value::Number(n) => {
            let n = n.as_u64().unwrap();
            match last {
                "frame_size" => json!(4096),
                "cpu" => json!(1 - n.min(1)),
                _ if n.is_power_of_two() && n > 2 => json!(n / 2),
                _ => json!(n + 1),
            }
        }
        Value::String(s) => json!(match s.as_str() {
            "l2" => "cross".to_string(),
            "poll" => "sleep".into(),
            "sleep" => "poll".into(),
            "drop" => "pass".into(),
            "native" => "generic".into(),
            "copy" => "zerocopy".into(),
            "sim" => "afxdp".into(),
            "afxdp" => "sim".into(),
            "127.0.0.1:9300" => "127.0.0.1:9301".into(),
            "02:ee:00:00:00:01" => "02:ee:00:00:00:02".into(),
            _ => format!("{s}x"),
        }),
        // An absent option: give it a value (refused where it makes no sense, e.g. `afxdp:`
        // on a sim port).
        _ => json!(1),
    }
}

/// Every key of the config, changed on its own: the reload plan names it (as live or as
/// needing a restart) with its line in the new file, or the new file is refused with a
/// position. Never a silent success.
#[test]
fn every_key_changed_in_a_reload_is_named() {
    let dir = TokenDir::new("every-key");
    let base = parse(&full_yaml(&dir)).unwrap();
    let value = serde_json::to_value(&base).unwrap();
    let mut keys = Vec::new();
    leaves(&value, String::new(), &mut keys);
    assert!(keys.len() > 50, "walked {} keys", keys.len());
    let (mut live, mut restart, mut refused) = (0, 0, 0);
    for key in &keys {
        let mut v = value.clone();
        let slot = get_mut(&mut v, key);
        let new = mutate(key, slot);
        assert_ne!(*slot, new, "{key}: the mutation must change something");
        *slot = new;
        let text = serde_json::to_string_pretty(&v).unwrap();
        match Config::parse(&text, Path::new("test.yaml")) {
            Err(e) => {
                assert!(e.line > 0 || e.message.contains(key.rsplit('.').next().unwrap()), "{key}: {e}");
                refused += 1;
            }
            Ok(c) => {
                let plan = diff::plan(&base, &c);
                if let Some(port) = key.strip_suffix(".name").filter(|k| k.starts_with("ports[") && !k.contains(".")) {
                    // Ports are matched by name: a renamed port is one removed and one added.
                    let whole: Vec<String> = plan
                        .live
                        .iter()
                        .chain(&plan.restart)
                        .filter(|ch| ch.key == port)
                        .map(|ch| ch.to_string())
                        .collect();
                    assert_eq!(whole.len(), 2, "{key}: {plan:?}");
                    assert!(
                        whole.iter().any(|w| w.ends_with("removed)")) && whole.iter().any(|w| w.ends_with("added)"))
                    );
                    restart += 1;
                    continue;
                }
                let named: Vec<&diff::Change> =
                    plan.live.iter().chain(&plan.restart).filter(|ch| &ch.key == key).collect();
                assert_eq!(named.len(), 1, "{key}: not named by the plan: {plan:?}");
                let at = &named[0].at;
                let pos = at.strip_prefix("test.yaml:").unwrap_or_else(|| panic!("{key}: located at {at}"));
                let line: u64 = pos.split(':').next().unwrap().parse().unwrap();
                assert!(line > 1, "{key}: at {at}");
                if plan.live.iter().any(|ch| &ch.key == key) {
                    assert!(diff::applies_live(named[0]));
                    live += 1;
                } else {
                    restart += 1;
                }
            }
        }
    }
    eprintln!("{} keys: {live} applied live, {restart} need a restart, {refused} made the file invalid", keys.len());
    // Renaming the host port breaks the mirror that names it: fewer restart keys than live ones.
    assert!(live >= 30 && restart >= 18, "{live} live, {restart} restart");
}

#[test]
fn the_plan_sorts_keys_into_live_and_restart() {
    let dir = TokenDir::new("plan");
    let base = parse(&full_yaml(&dir)).unwrap();
    let text = full_yaml(&dir).replace("    idle: poll", "    idle: sleep").replace("cache: 128", "cache: 256");
    let plan = diff::plan(&base, &parse(&text).unwrap());
    let keys = |v: &[diff::Change]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&plan.live), ["workers[0].idle"]);
    assert_eq!(keys(&plan.restart), ["pool.cache"]);
    assert_eq!(plan.restart[0].at, "test.yaml:10:10");
    assert_eq!(plan.restart[0].to_string(), "test.yaml:10:10: pool.cache (128 -> 256)");
    // Writing a default out is not a change.
    let plan = diff::plan(&parse(GOOD).unwrap(), &parse(&format!("fdb:\n  capacity: 16384\n{GOOD}")).unwrap());
    assert!(plan.live.is_empty() && plan.restart.is_empty(), "{plan:?}");
    // So is a port's `vlan:` written out as the access port of VLAN 1 it is without one; another
    // VID is a change of `vid`, named where it is.
    let with_vlan = |vid: u16| {
        GOOD.replace(
            "    driver: sim\n  - name: p1",
            &format!("    driver: sim\n    vlan: {{ mode: access, vid: {vid} }}\n  - name: p1"),
        )
    };
    let plan = diff::plan(&parse(GOOD).unwrap(), &parse(&with_vlan(1)).unwrap());
    assert!(plan.live.is_empty() && plan.restart.is_empty(), "{plan:?}");
    let plan = diff::plan(&parse(GOOD).unwrap(), &parse(&with_vlan(10)).unwrap());
    assert_eq!(
        plan.live.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        ["test.yaml:5:32: ports[0].vlan.vid (1 -> 10)"]
    );
    // The RX batch applies live (each worker takes it between two rounds), named where it is.
    let plan = diff::plan(&parse(GOOD).unwrap(), &parse(&format!("switch:\n  batch: 256\n{GOOD}")).unwrap());
    assert_eq!(
        plan.live.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        ["test.yaml:2:10: switch.batch (64 -> 256)"]
    );
    assert!(plan.restart.is_empty(), "{plan:?}");
}

#[test]
fn a_plugin_path_that_is_not_a_regular_file_is_refused_without_opening_it() {
    let e = parse("ports:\n  - name: p0\n    driver: sim\n    plugins:\n      - name: x\n        path: /dev/null\n")
        .unwrap_err();
    assert_eq!((e.line, e.column), (6, 15), "{e}");
    assert!(e.message.contains("/dev/null is not a regular file"), "{e}");
}

#[test]
fn a_config_that_is_not_a_regular_file_is_refused() {
    let e = Config::load(Path::new("/dev/zero")).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn the_control_interface_can_be_allowed_explicitly() {
    let yaml = "ports:\n  - name: p0\n    driver: afxdp\n    afxdp:\n      interface: lo\n      allow_control_interface: true\n";
    parse(yaml).unwrap();
    // An interface that carries metrics.listen's address is refused as `lo` is.
    let e = parse("metrics:\n  listen: 127.0.0.1:9300\nports:\n  - name: p0\n    driver: afxdp\n    afxdp:\n      interface: lo\n").unwrap_err();
    assert!(e.message.contains("the control API's included") && e.message.contains("allow_control_interface"), "{e}");
}

/// A file of thousands of numbers too large for their keys is refused on a thread with a
/// reload's stack: naming the first one's documented range parses the file again once, not
/// once more per number (that nested a parse per line and overflowed the stack, which aborts
/// the daemon).
#[test]
fn thousands_of_too_large_numbers_are_refused_on_a_small_stack() {
    let mut yaml =
        String::from("ports:\n  - name: p0\n    driver: sim\n    sim:\n      traffic:\n        frame_sizes:\n");
    for _ in 0..3000 {
        yaml += "          - 99999999999999999999999\n";
    }
    let e = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || parse(&yaml).unwrap_err())
        .unwrap()
        .join()
        .expect("the parse overflowed a 256 KiB stack");
    assert_eq!(e.line, 7, "{e}");
    assert!(e.message.contains("99999999999999999999999"), "{e}");
}

/// A worker's cpu outside what this process may run on is refused (the worker would run
/// unpinned while the config, and a reload's answer, said it was pinned).
#[test]
fn a_cpu_outside_the_process_affinity_is_refused() {
    let yaml = |cpu: usize| format!("workers:\n  - cpu: {cpu}\nports:\n  - name: p0\n    driver: sim\n");
    // On a thread of its own, narrowed to CPU 0 as a cpuset or taskset would.
    let (zero, one) = std::thread::spawn(move || {
        wasmswitch_sys::pin_to_cpu(0).unwrap();
        (parse(&yaml(0)).map(|_| ()), parse(&yaml(1)).map(|_| ()))
    })
    .join()
    .unwrap();
    zero.expect("cpu 0 is the thread's own");
    let e = one.unwrap_err();
    if online_cpus() < 2 {
        assert!(e.message.contains("cpu 1 does not exist"), "{e}");
    } else {
        assert_eq!((e.line, e.column), (2, 10), "{e}");
        assert!(
            e.message.starts_with("cpu 1 is not one this process may run on") && e.message.ends_with(" is 0)"),
            "{e}"
        );
    }
}

#[test]
fn afxdp_modes_are_the_librarys_enums_read_by_word_with_auto_for_the_profile() {
    use crate::schema::Auto;
    let port =
        |extra: &str| format!("ports:\n  - name: p0\n    driver: afxdp\n    afxdp: {{ interface: nosuch0{extra} }}\n");
    let a = |c: &Config| c.ports[0].afxdp.as_ref().unwrap().value.clone();
    let c = parse(&port("")).unwrap();
    assert_eq!((a(&c).mode, a(&c).bind), (Auto::Auto, Auto::Auto), "auto when left out");
    assert_eq!((a(&c).spec().overrides.attach, a(&c).spec().overrides.bind), (None, None));
    let c = parse(&port(", mode: generic, bind: zerocopy")).unwrap();
    assert_eq!(a(&c).mode, Auto::Set(AttachMode::Generic));
    assert_eq!(a(&c).spec().overrides.bind, Some(BindMode::ZeroCopy));
    // Written out as the file writes them (the reload's diff compares these).
    let json = serde_json::to_value(a(&c)).unwrap();
    assert_eq!((json["mode"].as_str(), json["bind"].as_str()), (Some("generic"), Some("zerocopy")));
    assert_eq!(serde_json::to_value(a(&parse(&port(", mode: auto")).unwrap())).unwrap()["mode"], "auto");
    let e = parse(&port(", mode: bogus")).unwrap_err();
    assert!(e.message.contains("unknown variant `bogus`, expected one of auto, native, generic"), "{e}");
    assert_eq!(e.line, 4, "{e}");
    let e = parse(&port(", bind: ZeroCopy")).unwrap_err();
    assert!(e.message.contains("expected one of auto, copy, zerocopy"), "{e}");
}
