//! The L2 control plane against a running daemon on the sim driver: the FDB's VLANs and static
//! entries in `/api/v1/fdb`, the `wasmswitch fdb show|add|del|flush` client, bad edits refused
//! with a reason, and VLAN, storm and mirror settings changed by a reload (applied and named)
//! with their effect on traffic.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;
use wasmswitch_core::PortId;

use common::*;
use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

fn cli(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

/// p0 generates traffic in VLANs 10 and 20 to p1's hosts; p1 is a trunk of both; p2 an access
/// port of `p2_vlan`; p3 takes nothing until a mirror sends it copies.
fn yaml(port: u16, p2_vlan: u16, extra: &str) -> String {
    format!(
        "metrics:
  listen: 127.0.0.1:{port}
fdb:
  static:
    - mac: 02:00:00:00:aa:01
      vlan: 10
      port: p1
workers:
  - idle: sleep
ports:
  - name: p0
    driver: sim
    vlan: {{ mode: trunk, allowed: [10, 20] }}
    sim:
      traffic:
        rate_pps: 2000
        src_macs: 8
        vlan: [10, 20]
        broadcast_percent: 20
        to: [p1]
  - name: p1
    driver: sim
    vlan: {{ mode: trunk, allowed: [\"10-20\"], native: 1 }}
    sim:
      traffic:
        rate_pps: 2000
        src_macs: 8
        vlan: [10, 20]
        to: [p0]
  - name: p2
    driver: sim
    vlan: {{ mode: access, vid: {p2_vlan} }}
  - name: p3
    driver: sim
{extra}"
    )
}

fn json(port: u16, method: &str, path: &str, body: &str) -> (u16, Value) {
    let r = http_with(port, method, path, &["Content-Type: application/json"], body.as_bytes()).unwrap();
    (r.status, serde_json::from_str(&r.body).unwrap_or(Value::String(r.body)))
}

fn port_tx(port: u16, name: &str) -> u64 {
    let (_, v) = json(port, "GET", "/api/v1/ports", "");
    v["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["tx_packets"].as_u64().unwrap()
}
#[test]
fn fdb_edits_vlans_and_l2_reloads_through_api_and_client() {
    let dir = Scratch::new("fdbvlan");
    let port = free_port();
    let cfg = dir.write(&yaml(port, 10, ""));
    let cfg_s = cfg.to_str().unwrap().to_string();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", &cfg_s]).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    wait_healthy(port, &mut daemon);

    // Learned entries carry their VLAN; the config's static entry is there.
    eventually("p0's hosts learned in VLANs 10 and 20", || {
        let (_, v) = json(port, "GET", "/api/v1/fdb", "");
        let e = v["entries"].as_array().unwrap().clone();
        [10, 20].iter().all(|&vl| e.iter().any(|x| x["vlan"] == vl && x["port"] == "p0" && x["static"] == false))
    });
    let (_, v) = json(port, "GET", "/api/v1/fdb", "");
    let entries = v["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["mac"] == "02:00:00:00:aa:01" && e["vlan"] == 10 && e["static"] == true), "{v}");
    // VLAN 20 floods reach no access port of VLAN 10, VLAN 10's do.
    eventually("p2 (access 10) gets VLAN 10 floods", || port_tx(port, "p2") > 0);

    // The client: add, show, delete, flush.
    let addr = format!("127.0.0.1:{port}");
    let o = cli(&["fdb", "add", "02:00:00:00:bb:01", "--vlan", "20", "--port", "p1", "--addr", &addr]);
    assert!(o.status.success(), "{o:?}");
    let o = cli(&["fdb", "show", "--addr", &addr]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["20", "02:00:00:00:bb:01", "p1", "static"]),
        "{out}"
    );
    let o = cli(&["fdb", "del", "02:00:00:00:bb:01", "--vlan", "20", "--addr", &addr]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("1 entry removed"), "{o:?}");
    let o = cli(&["fdb", "del", "02:00:00:00:bb:01", "--vlan", "20", "--addr", &addr]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success() && err.contains("no entry for 02:00:00:00:bb:01 in VLAN 20"), "{err}");

    // Bad edits: refused, saying why, nothing changed.
    for (body, code, why) in [
        (r#"{"mac":"02:00:00:00:bb:02","vlan":30,"port":"p1"}"#, 422, "does not carry VLAN 30"),
        (r#"{"mac":"02:00:00:00:bb:02","vlan":4095,"port":"p1"}"#, 422, "out of range"),
        (r#"{"mac":"02:00:00:00:bb:02","vlan":0,"port":"p1"}"#, 422, "out of range"),
        (r#"{"mac":"ff:ff:ff:ff:ff:ff","vlan":10,"port":"p1"}"#, 422, "cannot be an FDB entry"),
        (r#"{"mac":"02:00:00:00:bb:02","vlan":10,"port":"nope"}"#, 422, "not a port"),
        (r#"{"mac":"02:00:00:00:bb","vlan":10,"port":"p1"}"#, 400, "not a MAC address"),
        (r#"{"mac":"02:00:00:00:bb:02","vlan":10}"#, 400, "missing field `port`"),
        (r#"{"mac":"02:00:00:00:bb:02""#, 400, "expected"),
    ] {
        let (st, v) = json(port, "POST", "/api/v1/fdb", body);
        assert_eq!(st, code, "{body}: {v}");
        assert!(v["error"].as_str().unwrap_or_default().contains(why), "{body}: {v}");
    }
    let (st, v) = json(port, "DELETE", "/api/v1/fdb/4095/02:00:00:00:00:01", "");
    assert_eq!((st, v["status"].as_str()), (422, Some("error")), "{v}");
    let (st, _) = json(port, "POST", "/api/v1/fdb/flush", r#"{"port":"nope"}"#);
    assert_eq!(st, 422);

    // Flush a VLAN's learned entries: the static one stays. (Traffic re-learns them at once,
    // so what is checked is the count the flush answered and that the static entry is there.)
    let o = cli(&["fdb", "flush", "--vlan", "10", "--addr", &addr, "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(o.status.success() && v["removed"].as_u64().unwrap() > 0, "{v}");
    let (_, v) = json(port, "GET", "/api/v1/fdb", "");
    assert!(v["entries"].as_array().unwrap().iter().any(|e| e["mac"] == "02:00:00:00:aa:01"), "{v}");
    let (st, v) = json(port, "POST", "/api/v1/fdb/flush", r#"{"static":true}"#);
    assert_eq!(st, 200, "{v}");
    let (_, v) = json(port, "GET", "/api/v1/fdb", "");
    assert!(!v["entries"].as_array().unwrap().iter().any(|e| e["static"] == true), "{v}");

    // A reload that moves p2 to VLAN 30 and adds a mirror and storm limits: applied, named.
    let mirror = "    storm: { broadcast_pps: 0 }\nmirrors:\n  - name: tap\n    sources: [p1]\n    direction: egress\n    destination: p3\n";
    std::fs::write(&cfg, yaml(port, 30, mirror)).unwrap();
    let (st, v) = json(port, "POST", "/api/v1/reload", "");
    assert_eq!(st, 200, "{v}");
    let summary = v["summary"].as_str().unwrap();
    for p in ["p1", "p2", "p3"] {
        assert!(summary.contains(&format!("port `{p}`: VLANs, storm control and mirrors as configured")), "{summary}");
    }
    assert!(summary.contains("fdb.static") || summary.contains("mirrors"), "{summary}");
    assert!(summary.contains("port `p2`: VLANs, storm control and mirrors as configured (its learned FDB entries in the VLAN it left flushed)"), "{summary}");
    assert!(summary.contains("port `p3`: VLANs, storm control and mirrors as configured (its learned FDB entries flushed: it became a mirror's destination)"), "{summary}");
    // p2 no longer gets VLAN 10 floods; p3 gets what p1 sends.
    std::thread::sleep(Duration::from_millis(300));
    let p2 = port_tx(port, "p2");
    eventually("p3 gets copies of what p1 sends", || port_tx(port, "p3") > 50);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(port_tx(port, "p2"), p2, "p2 (now VLAN 30) gets nothing");
    let (_, metrics) = http(port, "GET", "/metrics").unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("wasmswitch_mirror_copies_total") && !l.ends_with(" 0")),
        "mirror copies counted"
    );
    // A config that breaks an L2 rule is refused by name, and nothing changes.
    std::fs::write(&cfg, yaml(port, 4095, "")).unwrap();
    let (st, v) = json(port, "POST", "/api/v1/reload", "");
    assert_eq!(st, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("vlan.vid 4095 is out of range: expected 1-4094"), "{v}");
    let o = cli(&["check", "-c", &cfg_s]);
    assert!(!o.status.success());

    sigterm(&daemon);
    assert!(daemon.wait().unwrap().success());
}

/// Two sim ports without traffic, the FDB of `capacity` with `aging` and the config's `statics`
/// (MAC, port) in VLAN 1.
fn fdb_yaml(capacity: usize, aging: u32, statics: &[(&str, &str)]) -> String {
    let mut y = format!("fdb:\n  capacity: {capacity}\n  aging_seconds: {aging}\n");
    if !statics.is_empty() {
        y.push_str("  static:\n");
        for (mac, port) in statics {
            y.push_str(&format!("    - {{ mac: \"{mac}\", vlan: 1, port: {port} }}\n"));
        }
    }
    y + "workers:\n  - idle: sleep\nports:\n  - name: p1\n    driver: sim\n  - name: p2\n    driver: sim\n"
}

#[test]
fn a_reload_whose_static_entries_do_not_fit_changes_nothing() {
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-fit");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(64, 300, &[]))).unwrap();
    let mac = |i: u64| MacAddr::from_u64(0x0200_00aa_0000 + i);
    let add = |i: u64, port: &str| sw.fdb_change(FdbChange::Add { mac: mac(i), vlan: 1, port: port.into() });
    let lookup = |i: u64| sw.dataplane.fdb.get().lookup(vid(1), mac(i));
    // API statics until one finds its bucket full of them.
    let full = (0..1000).find(|&i| add(i, "p1").is_err()).expect("a 64-entry table fills up");
    let statics =
        |sw: &wasmswitch::daemon::Switch| sw.dataplane.fdb.get().entries(0).iter().filter(|e| e.is_static).count();
    let before = statics(&sw);
    // That address as a static of the config, with another aging time: refused whole.
    let full_mac = mac(full).to_string();
    dir.write(&fdb_yaml(64, 77, &[(&full_mac, "p2")]));
    let err = sw.reload().expect_err("a static entry that does not fit").to_string();
    assert!(err.contains("nothing was changed") && err.contains(&full_mac), "{err}");
    assert_eq!(sw.config().fdb.aging_seconds.value, 300, "aging time not applied");
    assert_eq!(lookup(full), None);
    // A smaller table than the statics need: refused, and every static entry is still there.
    dir.write(&fdb_yaml(1024, 300, &[]));
    sw.reload().expect("a larger table");
    assert_eq!(statics(&sw), before, "every static entry copied into the larger table");
    for i in 1000..1100 {
        add(i, "p2").unwrap();
    }
    let before = statics(&sw);
    dir.write(&fdb_yaml(64, 300, &[]));
    let err = sw.reload().expect_err("fewer slots than static entries").to_string();
    assert!(err.contains("nothing was changed") && err.contains("does not fit a table of 64"), "{err}");
    assert_eq!((sw.dataplane.fdb.get().capacity() >= 1024, statics(&sw)), (true, before));
    // With room, the config's static comes in with its aging time.
    dir.write(&fdb_yaml(1024, 77, &[(&full_mac, "p2")]));
    sw.reload().expect("it fits now");
    assert_eq!((lookup(full), sw.config().fdb.aging_seconds.value), (Some(PortId(1)), 77));
    // Dropping it from the config takes only the config's entry: after the API moved the
    // address to p1, that entry stays.
    sw.fdb_change(FdbChange::Remove { mac: mac(full), vlan: 1 }).unwrap();
    add(full, "p1").unwrap();
    dir.write(&fdb_yaml(1024, 77, &[]));
    sw.reload().expect("the config's static removed");
    assert_eq!(lookup(full), Some(PortId(0)), "the API's entry on p1 is left alone");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_reopened_port_keeps_its_static_entries_and_a_removed_one_frees_their_room() {
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-reopen");
    let cfg_mac = "02:00:00:00:00:aa";
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(1024, 300, &[(cfg_mac, "p2")]))).unwrap();
    let api_mac = MacAddr::from_u64(0x0200_0000_00bb);
    sw.fdb_change(FdbChange::Add { mac: api_mac, vlan: 1, port: "p2".into() }).unwrap();
    let lookup = |m: MacAddr| sw.dataplane.fdb.get().lookup(vid(1), m);
    let cfg_mac: MacAddr = cfg_mac.parse().unwrap();
    assert_eq!((lookup(cfg_mac), lookup(api_mac)), (Some(PortId(1)), Some(PortId(1))));
    // A new ring size reopens p2 (new queues, same name and id): both statics stay.
    let reopened = fdb_yaml(1024, 300, &[("02:00:00:00:00:aa", "p2")])
        .replace("  - name: p2\n    driver: sim\n", "  - name: p2\n    driver: sim\n    sim:\n      ring_size: 512\n");
    dir.write(&reopened);
    let applied = sw.reload().expect("p2 reopened");
    assert!(applied.contains("port `p2` reopened"), "{applied}");
    assert_eq!(
        (lookup(cfg_mac), lookup(api_mac)),
        (Some(PortId(1)), Some(PortId(1))),
        "statics kept across the reopen"
    );
    sw.dataplane.stop_shared().expect("every frame back");

    // API statics on p2 until a bucket is full; a reload that removes p2 and puts that address
    // on p1 fits, as p2's statics go with it.
    let dir = Scratch::new("fdb-removed");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(64, 300, &[]))).unwrap();
    let mac = |i: u64| MacAddr::from_u64(0x0200_00cc_0000 + i);
    let full = (0..1000)
        .find(|&i| sw.fdb_change(FdbChange::Add { mac: mac(i), vlan: 1, port: "p2".into() }).is_err())
        .expect("a 64-entry table fills up");
    let full_mac = mac(full).to_string();
    dir.write(&fdb_yaml(64, 300, &[(&full_mac, "p1")]).replace("  - name: p2\n    driver: sim\n", ""));
    let applied = sw.reload().expect("p2's statics leave with it");
    assert!(applied.contains("port `p2` removed"), "{applied}");
    assert_eq!(sw.dataplane.fdb.get().lookup(vid(1), mac(full)), Some(PortId(0)));
    assert_eq!(sw.dataplane.fdb.get().lookup(vid(1), mac(0)), None, "p2's statics are gone");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn the_files_static_entries_follow_the_file_and_the_apis_are_never_replaced_unseen() {
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-truth");
    let x = "02:00:00:00:cc:01";
    let with_x = fdb_yaml(64, 300, &[(x, "p1")]);
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&with_x)).unwrap();
    let mac: MacAddr = x.parse().unwrap();
    let id = |name: &str| sw.dataplane.ports.id_of(name).unwrap();
    let statics = || -> Vec<PortId> {
        sw.dataplane.fdb.get().entries(0).into_iter().filter(|e| e.mac == mac && e.is_static).map(|e| e.port).collect()
    };
    let api = |change: FdbChange| sw.fdb_change(change).unwrap();
    let delete = || api(FdbChange::Remove { mac, vlan: 1 });

    // The file's entry, deleted through the API or flushed, comes back with a reload of the
    // same file, and the answer says so.
    delete();
    assert!(statics().is_empty());
    let r = sw.reload().unwrap();
    assert!(r.contains(&format!("fdb.static {x} in VLAN 1 on `p1` restored")), "{r}");
    assert_eq!(statics(), [id("p1")]);
    api(FdbChange::Flush { port: None, vlan: None, statics: true });
    assert!(sw.reload().unwrap().contains("restored"));
    assert_eq!(statics(), [id("p1")]);

    // The API puts the address on p2 (replacing the file's entry): reloads of the same file
    // leave it there.
    api(FdbChange::Add { mac, vlan: 1, port: "p2".into() });
    let r = sw.reload().unwrap();
    assert!(!r.contains("restored") && !r.contains("added"), "{r}");
    assert_eq!(statics(), [id("p2")]);
    // The entry leaves the file: the API's stays, and the answer does not claim a removal.
    dir.write(&fdb_yaml(64, 300, &[]));
    let r = sw.reload().unwrap();
    assert!(
        r.contains(&format!("fdb.static {x} in VLAN 1 on `p1` left the config (the table no longer had it there)")),
        "{r}"
    );
    assert_eq!(statics(), [id("p2")]);

    // A file that adds it again on p1 would replace the API's entry unseen: refused by name,
    // nothing changed. Once the API's entry is deleted, the same reload applies.
    dir.write(&with_x);
    let e = sw.reload().unwrap_err().to_string();
    assert!(
        e.contains("nothing was changed") && e.contains("a static entry for it on `p2`, added through the API"),
        "{e}"
    );
    assert_eq!(statics(), [id("p2")]);
    delete();
    let r = sw.reload().unwrap();
    assert!(r.contains(&format!("fdb.static {x} in VLAN 1 on `p1` added")), "{r}");
    assert_eq!(statics(), [id("p1")]);
    // Moved within the file from p1 to p2: no conflict with its own old entry.
    dir.write(&fdb_yaml(64, 300, &[(x, "p2")]));
    let r = sw.reload().unwrap();
    assert!(r.contains("on `p1` removed") && r.contains("on `p2` added"), "{r}");
    assert_eq!(statics(), [id("p2")]);

    // An entry the API made, then written into the file on the same port: the file's now.
    let y = "02:00:00:00:cc:02";
    let ymac: MacAddr = y.parse().unwrap();
    api(FdbChange::Add { mac: ymac, vlan: 1, port: "p1".into() });
    dir.write(&fdb_yaml(64, 300, &[(x, "p2"), (y, "p1")]));
    let r = sw.reload().unwrap();
    assert!(
        r.contains(&format!("fdb.static {y} in VLAN 1 on `p1` added (the API's entry there, now the file's)")),
        "{r}"
    );
    // A port removed with a file entry on it: said so.
    dir.write(&fdb_yaml(64, 300, &[(x, "p2")]).replace("  - name: p1\n    driver: sim\n", ""));
    let r = sw.reload().unwrap();
    assert!(r.contains(&format!("fdb.static {y} in VLAN 1 on `p1` removed with its port")), "{r}");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn api_edits_made_while_a_reload_resizes_the_table_are_kept() {
    // A reload that changes fdb.capacity copies the table into a new one. An API edit landing
    // on the old table after its entries were copied would be lost: an add gone, a delete
    // undone. In each of 12 reloads flipping the capacity, an editor adds new addresses and
    // deletes old ones for as long as the reload runs; every edit answered must hold.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let (small, large) = (262_144, 524_288);
    let dir = Scratch::new("fdb-resize-edits");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(small, 300, &[]))).unwrap();
    let mac = |i: u64| MacAddr::from_u64(0x0200_0300_0000 + i);
    // Old addresses to delete, then new ones to add (each used once).
    const OLD: u64 = 30_000;
    for i in 0..OLD {
        sw.fdb_change(FdbChange::Add { mac: mac(i), vlan: 1, port: "p1".into() }).unwrap();
    }
    let next = AtomicU64::new(0);
    let (mut added, mut deleted) = (Vec::new(), Vec::new());
    for round in 0..12 {
        let capacity = if round % 2 == 0 { large } else { small };
        dir.write(&fdb_yaml(capacity, 300, &[]));
        let done = AtomicBool::new(false);
        let (a, d) = std::thread::scope(|s| {
            let editor = s.spawn(|| {
                let (mut a, mut d) = (Vec::new(), Vec::new());
                while !done.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= OLD {
                        break;
                    }
                    if sw.fdb_change(FdbChange::Add { mac: mac(OLD + n), vlan: 1, port: "p2".into() }).is_ok() {
                        a.push(OLD + n);
                    }
                    if sw.fdb_change(FdbChange::Remove { mac: mac(n), vlan: 1 }).is_ok() {
                        d.push(n);
                    }
                }
                (a, d)
            });
            let r = sw.reload().unwrap();
            done.store(true, Ordering::Relaxed);
            assert!(r.contains(&format!("fdb.capacity = {capacity}")), "{r}");
            editor.join().unwrap()
        });
        added.extend(a);
        deleted.extend(d);
    }
    let fdb = sw.dataplane.fdb.get();
    let lost = added.iter().filter(|&&i| fdb.lookup(vid(1), mac(i)).is_none()).count();
    let back = deleted.iter().filter(|&&i| fdb.lookup(vid(1), mac(i)).is_some()).count();
    eprintln!("{} adds and {} deletes during 12 resizes", added.len(), deleted.len());
    assert!(added.len() > 100 && deleted.len() > 100, "edits ran alongside the reloads");
    assert_eq!((lost, back), (0, 0), "(added entries lost, deleted ones back)");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_reload_to_a_smaller_table_says_how_many_learned_entries_it_dropped_and_counts_them() {
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-shrink");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(1024, 300, &[]))).unwrap();
    let fdb = sw.dataplane.fdb.get();
    for i in 0..500u64 {
        fdb.learn(vid(1), MacAddr::from_u64(0x0200_0500_0000 + i), PortId::from_index((i % 2) as usize), 0);
    }
    let had = fdb.len();
    dir.write(&fdb_yaml(64, 300, &[]));
    let r = sw.reload().unwrap();
    let kept = sw.dataplane.fdb.get().len();
    assert!(kept <= 64 && had == 500, "{had} → {kept}");
    let said = format!("fdb.capacity = 64 (a table of 64 entries, {kept} in it; {} learned entries", had - kept);
    assert!(r.contains(&said), "{r}");
    let metrics = wasmswitch::metrics::Metrics::new(sw.collector()).render();
    let line = format!("wasmswitch_fdb_resize_dropped_total {}", had - kept);
    assert!(metrics.lines().any(|l| l == line), "{line} not in the metrics");
    // Back to a larger table: nothing lost, said so.
    dir.write(&fdb_yaml(1024, 300, &[]));
    assert!(sw.reload().unwrap().contains(&format!("{kept} in it; every entry copied over")));
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn an_api_add_racing_a_reload_that_removes_its_vlan_is_checked_against_the_new_one() {
    // A reload takes p1 out of VLAN 10 and resizes the table. An editor waits for the new
    // table (the reload has checked the static entries by then, and has yet to put its config
    // in place) and adds a static entry in VLAN 10 on p1. Checked against the old VLANs, that
    // add was answered ok and left an entry outside p1's VLANs (a black hole) that refused
    // every later reload; now it waits for the reload and is refused.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-vlan-race");
    let yaml = |allowed: &str, capacity: usize| {
        format!(
            "fdb:\n  capacity: {capacity}\nworkers:\n  - idle: sleep\nports:\n  - name: p1\n    driver: sim\n    vlan: {{ mode: trunk, allowed: [{allowed}] }}\n  - name: p2\n    driver: sim\n"
        )
    };
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&yaml("1, 10", 1024))).unwrap();
    let mac = MacAddr::from_u64(0x0200_0400_0001);
    let mut in_window = 0;
    for round in 0..20 {
        let capacity = if round % 2 == 0 { 2048 } else { 1024 };
        dir.write(&yaml("1", capacity));
        let before = sw.dataplane.fdb.get();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let editor = s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    if !Arc::ptr_eq(&sw.dataplane.fdb.get(), &before) {
                        let r = sw.fdb_change(FdbChange::Add { mac, vlan: 10, port: "p1".into() });
                        return Some(r);
                    }
                    std::hint::spin_loop();
                }
                None
            });
            sw.reload().expect("applied");
            done.store(true, Ordering::Relaxed);
            if let Some(r) = editor.join().unwrap() {
                in_window += 1;
                let e = r.expect_err("an add in VLAN 10 on p1 while the reload takes VLAN 10 off p1");
                assert!(e.contains("does not carry VLAN 10"), "{e}");
            }
        });
        let outside: Vec<_> = sw.dataplane.fdb.get().entries(0).into_iter().filter(|e| e.vlan == vid(10)).collect();
        assert!(outside.is_empty(), "p1 carries only VLAN 1 now, yet the table has {outside:?}");
        dir.write(&yaml("1, 10", capacity));
        sw.reload().expect("VLAN 10 back");
    }
    // The editor must see the new table before the reload ends (a worker round or so): on a
    // busy machine it may miss some rounds, never all twenty.
    assert!(in_window >= 1, "none of 20 adds was made inside the reload");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_reload_that_would_leave_a_static_entry_outside_its_vlan_is_refused_by_name() {
    use wasmswitch::api::FdbChange;
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-vlan-gone");
    let yaml = |vid: u16| {
        format!(
            "workers:\n  - idle: sleep\nports:\n  - name: p1\n    driver: sim\n    vlan: {{ mode: access, vid: {vid} }}\n  - name: p2\n    driver: sim\n"
        )
    };
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&yaml(10))).unwrap();
    let mac = MacAddr::from_u64(0x0200_0000_00dd);
    sw.fdb_change(FdbChange::Add { mac, vlan: 10, port: "p1".into() }).unwrap();
    // p1 moves to VLAN 20: the API's entry in VLAN 10 would be a black hole.
    dir.write(&yaml(20));
    let err = sw.reload().expect_err("refused").to_string();
    assert!(err.contains("nothing was changed") && err.contains(&format!("{mac} in VLAN 10 on `p1`")), "{err}");
    assert_eq!(sw.dataplane.fdb.get().lookup(vid(10), mac), Some(PortId(0)), "the entry is still there");
    // Deleted first, the reload goes through.
    sw.fdb_change(FdbChange::Remove { mac, vlan: 10 }).unwrap();
    sw.reload().expect("nothing left outside");
    sw.dataplane.stop_shared().expect("every frame back");
}

#[test]
fn a_reload_that_changes_a_ports_vlans_flushes_what_it_learned_there() {
    // As the bridge does when a VLAN leaves a port: entries in a VLAN the port no longer
    // carries would otherwise send frames for those hosts nowhere until they aged out.
    let dir = Scratch::new("fdb-vlan-move");
    let yaml = |vlan: &str| {
        format!(
            "workers:\n  - idle: sleep\nports:\n  - name: p1\n    driver: sim\n{vlan}    sim:\n      traffic:\n        rate_pps: 2000\n        src_macs: 8\n        to: [p2]\n  - name: p2\n    driver: sim\n"
        )
    };
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&yaml(""))).unwrap();
    let p1 = sw.dataplane.ports.id_of("p1").unwrap();
    let on_p1 =
        |vlan: u16| sw.dataplane.fdb.get().entries(0).iter().filter(|e| e.port == p1 && e.vlan == vid(vlan)).count();
    eventually("p1's hosts learned in VLAN 1", || on_p1(1) == 8);
    dir.write(&yaml("    vlan: { mode: access, vid: 10 }\n"));
    let r = sw.reload().unwrap();
    assert!(
        r.contains("port `p1`: VLANs, storm control and mirrors as configured (its learned FDB entries in the VLAN it left flushed)"),
        "{r}"
    );
    assert_eq!(on_p1(1), 0, "nothing left in the VLAN p1 left");
    eventually("p1's hosts learned again, in VLAN 10", || on_p1(10) == 8);
    assert_eq!(on_p1(1), 0);
    sw.dataplane.stop_shared().expect("every frame is back");
}

#[test]
fn a_reload_flushes_a_ports_entries_only_in_the_vlans_it_left() {
    // As the bridge: a VLAN added, or the native VLAN changed, flushes nothing; a VLAN taken
    // away flushes the port's entries in it and no others. Flushing them all turned known
    // unicast in the VLANs the port kept into floods (to its other members, storm-limited).
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-vlan-left");
    let yaml = |vlan: &str| {
        format!("workers:\n  - idle: sleep\nports:\n  - name: p1\n    driver: sim\n    vlan: {vlan}\n  - name: p2\n    driver: sim\n")
    };
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&yaml("{ mode: trunk, allowed: [10, 20, 40] }"))).unwrap();
    let p1 = sw.dataplane.ports.id_of("p1").unwrap();
    let fdb = || sw.dataplane.fdb.get();
    let (m10, m20, m40) =
        (MacAddr::from_u64(0x0200_0700_0010), MacAddr::from_u64(0x0200_0700_0020), MacAddr::from_u64(0x0200_0700_0040));
    for (vlan, mac) in [(10, m10), (20, m20), (40, m40)] {
        fdb().learn(vid(vlan), mac, p1, 0);
    }
    let on_p1 = || [(10, m10), (20, m20), (40, m40)].map(|(v, m)| fdb().lookup(vid(v), m) == Some(p1));
    for (vlan, what) in [
        ("{ mode: trunk, allowed: [10, 20, 30, 40] }", "VLAN 30 added"),
        ("{ mode: trunk, allowed: [10, 20, 30, 40], native: 20 }", "a native VLAN"),
    ] {
        dir.write(&yaml(vlan));
        let r = sw.reload().unwrap();
        assert!(
            r.contains("port `p1`: VLANs, storm control and mirrors as configured") && !r.contains("flushed"),
            "{what}: {r}"
        );
        assert_eq!(on_p1(), [true; 3], "{what}: nothing flushed");
    }
    dir.write(&yaml("{ mode: trunk, allowed: [20], native: 20 }"));
    let r = sw.reload().unwrap();
    assert!(r.contains("(its learned FDB entries in the 3 VLANs it left flushed)"), "{r}");
    assert_eq!(on_p1(), [false, true, false], "only the entries in VLANs 10 and 40 went");
    sw.dataplane.stop_shared().expect("every frame is back");
}

#[test]
fn the_aging_sweep_waits_while_a_reload_holds_the_table() {
    // A sweep of the old table while a reload copies it into a new one counted its aged entries
    // where the copy no longer looks: `fdb_aged_total` went back by them.
    use wasmswitch_core::wire::MacAddr;
    let dir = Scratch::new("fdb-aging-held");
    let sw = wasmswitch::daemon::Switch::start(&dir.write(&fdb_yaml(1024, 1, &[]))).unwrap();
    let fdb = sw.dataplane.fdb.get();
    fdb.learn(vid(1), MacAddr::from_u64(0x0200_0600_0001), PortId(0), 0);
    let held = sw.dataplane.fdb.edits().write().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!((fdb.len(), fdb.stats.aged.get()), (1, 0), "no sweep while a reload holds the table");
    drop(held);
    let t = std::time::Instant::now();
    while fdb.len() == 1 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!((fdb.len(), fdb.stats.aged.get()), (0, 1), "aged once the reload let go");
    sw.dataplane.stop_shared().expect("every frame back");
}

/// The static budget and a port's limit on learned entries, through the daemon: API statics
/// until the table's budget refuses one with 422 and the reason, learning still working at
/// that budget; `ports[].fdb.max_macs` holding a generated MAC flood to its limit, counted in
/// the metrics, and changed live by a reload that names it.
#[test]
fn statics_have_a_budget_and_a_ports_learned_macs_a_limit_changed_live() {
    let dir = Scratch::new("fdb-budget");
    let port = free_port();
    let yaml = |fdb: &str| {
        format!(
            "metrics:
  listen: 127.0.0.1:{port}
fdb:
  capacity: 256
workers:
  - idle: sleep
ports:
  - name: p0
    driver: sim
    sim:
      traffic:
        rate_pps: 4000
        src_macs: 40
        to: [p1]
{fdb}  - name: p1
    driver: sim
"
        )
    };
    let cfg = dir.write(&yaml("    fdb: { max_macs: 10 }\n"));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c", cfg.to_str().unwrap()]).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    wait_healthy(port, &mut daemon);
    let metric = |s: &str| series(&http(port, "GET", "/metrics").unwrap().1, s).unwrap_or(-1.0);
    let learned_p0 = || metric("wasmswitch_port_fdb_learned{port=\"p0\"}");
    let learned_p0_listed = || {
        let (_, v) = json(port, "GET", "/api/v1/fdb", "");
        v["entries"].as_array().unwrap().iter().filter(|e| e["port"] == "p0" && e["static"] == false).count()
    };
    eventually("p0 at its limit, the rest of its 40 sources refused", || {
        learned_p0() == 10.0
            && metric_sum(&http(port, "GET", "/metrics").unwrap().1, "wasmswitch_port_fdb_learn_refused_total") > 30.0
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!((learned_p0(), learned_p0_listed()), (10.0, 10), "10 and no more");

    // API statics until the table's budget refuses one: 422 with the reason. A bucket's own
    // budget may refuse some first (also 422, its reason).
    let max = wasmswitch_core::fdb::max_statics(256);
    let mut added = 0;
    let refusal = (0..1000u32)
        .find_map(|i| {
            let body = format!(r#"{{"mac":"02:00:00:0b:{:02x}:{:02x}","vlan":1,"port":"p1"}}"#, i / 256, i % 256);
            let (st, v) = json(port, "POST", "/api/v1/fdb", &body);
            let why = v["error"].as_str().unwrap_or_default().to_string();
            match st {
                200 => added += 1,
                422 if why.contains("its hash bucket already holds 6 static entries") => {}
                _ => return Some((st, why)),
            }
            None
        })
        .expect("a refusal");
    assert_eq!(refusal.0, 422, "{refusal:?}");
    assert!(
        refusal.1.contains(&format!("the table already holds {max} static entries, the most a table of 256 may")),
        "{refusal:?}"
    );
    assert_eq!((added, metric("wasmswitch_fdb_statics")), (max, max as f64));
    // Learning at the static budget: flushed, p0's sources come back (to its limit).
    let (st, _) = json(port, "POST", "/api/v1/fdb/flush", "{}");
    assert_eq!(st, 200);
    eventually("p0's sources learned again beside the statics", || learned_p0_listed() == 10);

    // A reload raises the limit, live and named; another takes it off.
    std::fs::write(&cfg, yaml("    fdb: { max_macs: 20 }\n")).unwrap();
    let (st, v) = json(port, "POST", "/api/v1/reload", "");
    assert_eq!(st, 200, "{v}");
    assert!(v["summary"].as_str().unwrap().contains("port `p0`: fdb.max_macs = 20"), "{v}");
    eventually("p0 at its new limit", || learned_p0() == 20.0 && learned_p0_listed() == 20);
    std::fs::write(&cfg, yaml("")).unwrap();
    let (st, v) = json(port, "POST", "/api/v1/reload", "");
    assert_eq!(st, 200, "{v}");
    assert!(v["summary"].as_str().unwrap().contains("port `p0`: fdb.max_macs off"), "{v}");
    eventually("p0 learns past 20", || learned_p0() > 20.0);
    // Out of range: refused by name, nothing changed.
    std::fs::write(&cfg, yaml("    fdb: { max_macs: 257 }\n")).unwrap();
    let (st, v) = json(port, "POST", "/api/v1/reload", "");
    assert_eq!(st, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("fdb.max_macs 257 is out of range: expected 0-256"), "{v}");

    sigterm(&daemon);
    assert!(daemon.wait().unwrap().success());
}

/// VLAN `v` (a valid VID in every test here).
fn vid(v: u16) -> wasmswitch_core::vlan::Vid {
    wasmswitch_core::vlan::Vid::new(v).unwrap()
}
