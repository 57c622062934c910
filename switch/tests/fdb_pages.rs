//! `GET /api/v1/fdb` on a table filled to capacity by a MAC flood (sim traffic from a million
//! source MACs into a table of 512 Ki entries): answered in pages of bounded size, so full
//! listings grow the daemon's memory by a bounded amount and `/healthz` answers while several
//! run; the pages together list the whole table once; filters, bounds and a cursor from a
//! resized table; and `wasmswitch fdb show` following the cursor.

mod common;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch")
}

const CAPACITY: usize = 1 << 19;
const PORTS: usize = 16;

/// Sim ports flooding each other with `rate` frames per second per queue. A sim queue cycles
/// through 1,024 frames, each from a random one of its port's million source MACs: 16 ports of
/// 64 queues send from about a million MACs, twice what the table holds, so every bucket fills.
fn yaml(port: u16, rate: u64, capacity: usize) -> String {
    let mut y = format!(
        "metrics:
  listen: 127.0.0.1:{port}
pool:
  frames: 196608
fdb:
  capacity: {capacity}
workers:
  - idle: poll
ports:
"
    );
    for p in 0..PORTS {
        y += &format!(
            "  - name: p{p}
    driver: sim
    sim:
      queues: 64
      ring_size: 64
      traffic:
        rate_pps: {rate}
        src_macs: 1048576
        broadcast_percent: 0
        to: [p{}]
",
            (p + 1) % PORTS
        );
    }
    y
}

/// A page: `GET path`, asked again while the daemon's queue of pages is full (503).
fn page(port: u16, path: &str) -> Value {
    for _ in 0..100 {
        let r = http_with(port, "GET", path, &[], b"").unwrap();
        match r.status {
            200 => {
                let len =
                    r.head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ")?.parse().ok());
                assert_eq!(len, Some(r.body.len()), "{path}: a page says its length");
                return serde_json::from_str(&r.body).unwrap();
            }
            503 => std::thread::sleep(Duration::from_millis(50)),
            st => panic!("{path}: {st} {}", r.body),
        }
    }
    panic!("{path}: 503 a hundred times");
}

/// Every page of a listing with the query `filters`: (entries, pages).
fn listing(port: u16, filters: &str) -> (Vec<Value>, usize) {
    let (mut all, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let after = cursor.as_deref().map(|c| format!("&cursor={c}")).unwrap_or_default();
        let p = page(port, &format!("/api/v1/fdb?limit=10000{filters}{after}"));
        let entries = p["entries"].as_array().unwrap();
        assert!(entries.len() <= 10_000);
        all.extend(entries.iter().cloned());
        pages += 1;
        match p["next"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return (all, pages),
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_table_filled_to_capacity_is_listed_in_bounded_pages_while_healthz_answers() {
    let dir = Scratch::new("fdbpages");
    let port = free_port();
    let cfg = dir.write(&yaml(port, 1_000_000_000, CAPACITY));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&cfg).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut daemon = cmd.spawn().unwrap();
    wait_healthy(port, &mut daemon);

    // The flood fills the table (the count is the aging sweep's, every 100 ms).
    let t = Instant::now();
    let counted = || page(port, "/api/v1/fdb?limit=1")["table_entries"].as_u64().unwrap() as usize;
    while counted() < CAPACITY * 99 / 100 {
        assert!(t.elapsed() < Duration::from_secs(120), "the flood filled {} of {CAPACITY} slots", counted());
        std::thread::sleep(Duration::from_millis(200));
    }
    let fill = t.elapsed();
    // Then it slows to a trickle (a rate is live on reload), so the table all but holds still
    // while it is listed: about 500 evictions a second, of 1,024 frames a second from sources
    // half of which the table has no room for.
    std::fs::write(&cfg, yaml(port, 1, CAPACITY)).unwrap();
    let (st, body) = http_within(port, "POST", "/api/v1/reload", Duration::from_secs(30)).unwrap();
    assert_eq!(st, 200, "{body}");
    std::thread::sleep(Duration::from_millis(300));
    let full = counted();
    eprintln!("filled {full} of {CAPACITY} slots in {fill:?}");

    // The old answer, the whole table at once, is gone: a bare GET is the first page.
    let r = http_with(port, "GET", "/api/v1/fdb", &[], b"").unwrap();
    let first: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(first["entries"].as_array().unwrap().len(), 1000, "the default limit");
    assert!(first["next"].is_string() && r.body.len() < 200_000, "one page of {} bytes", r.body.len());
    assert_eq!(first["capacity"], CAPACITY);
    let r = http_with(port, "GET", "/api/v1/fdb?limit=10001", &[], b"").unwrap();
    assert!(r.status == 400 && r.body.contains("expected 1-10000"), "{r:?}");

    // One full listing: every entry once, all of the table.
    let pid = daemon.id();
    let rss_before = rss_kib(pid);
    let t = Instant::now();
    let (all, pages) = listing(port, "");
    let one = t.elapsed();
    let keys: HashSet<(u64, String)> =
        all.iter().map(|e| (e["vlan"].as_u64().unwrap(), e["mac"].as_str().unwrap().to_string())).collect();
    // An entry evicted and learned again during the listing may be listed twice (in another
    // slot of its bucket, if the listing is in that bucket between two pages): rare.
    assert!(all.len() - keys.len() < 10, "{} entries listed twice", all.len() - keys.len());
    assert!(all.len().abs_diff(full) < CAPACITY / 100, "listed {}, the sweep counted {full}", all.len());
    eprintln!("one full listing: {} entries in {pages} pages of 10000, {one:?}", all.len());

    // Four full listings at once while /healthz is asked every 20 ms.
    let listers: Vec<_> = (0..4).map(|_| std::thread::spawn(move || listing(port, "").0.len())).collect();
    let mut worst = Duration::ZERO;
    let mut asked = 0;
    while !listers.iter().all(|l| l.is_finished()) {
        let t = Instant::now();
        let (st, _) = http_within(port, "GET", "/healthz", Duration::from_secs(10)).unwrap();
        assert_eq!(st, 200);
        worst = worst.max(t.elapsed());
        asked += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    for l in listers {
        assert!(l.join().unwrap().abs_diff(full) < CAPACITY / 100);
    }
    let rss_after = rss_kib(pid);
    let grown = rss_after.saturating_sub(rss_before);
    eprintln!(
        "five full listings: daemon RSS {rss_before} -> {rss_after} KiB (+{grown} KiB); /healthz asked {asked} times during four at once, slowest {worst:?}"
    );
    assert!(worst < Duration::from_secs(1), "/healthz took {worst:?} during the listings");
    // A page is under 1 MB and made one at a time; what stays is the allocator's keep of a few.
    // The whole table as one answer grew it by gigabytes.
    assert!(grown < 64 << 10, "RSS grew {grown} KiB over five full listings");

    // Filters: a port's entries, a MAC prefix, and a VLAN with none, whose pages are empty but
    // each bounded (one for this table: 512 Ki slots looked at per page).
    let (p0, _) = listing(port, "&port=p0");
    let want = all.iter().filter(|e| e["port"] == "p0").count();
    assert!(p0.iter().all(|e| e["port"] == "p0"));
    assert!(p0.len().abs_diff(want) < want / 20 && want > 0, "{} of p0 listed, {want} in the full listing", p0.len());
    let (none, pages) = listing(port, "&vlan=4094");
    assert_eq!((none.len(), pages), (0, CAPACITY.div_ceil(1 << 19)));
    // Four bytes: 02:00, the sim port, then the top byte of the host's index (1 in 256).
    let prefix = all[0]["mac"].as_str().unwrap()[..11].to_string();
    let (some, _) = listing(port, &format!("&mac={prefix}"));
    let want = all.iter().filter(|e| e["mac"].as_str().unwrap().starts_with(&prefix)).count();
    assert!(some.iter().all(|e| e["mac"].as_str().unwrap().starts_with(&prefix)), "{prefix}");
    assert!(some.len().abs_diff(want) < 100 && want > 0, "{prefix}: {} listed, {want} in the full listing", some.len());
    let r = http_with(port, "GET", "/api/v1/fdb?port=nope", &[], b"").unwrap();
    assert!(r.status == 400 && r.body.contains("`nope` is not a port"), "{r:?}");

    // The client follows the cursor and prints every entry, a line each.
    let t = Instant::now();
    let o = Command::new(bin()).args(["fdb", "show", "--addr", &format!("127.0.0.1:{port}")]).output().unwrap();
    let cli = t.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    let rows = out.lines().filter(|l| l.contains(':')).count();
    assert!(rows.abs_diff(full) < CAPACITY / 100, "the client printed {rows} entries");
    assert!(out.trim_end().ends_with(&format!("entries (capacity {CAPACITY})")), "{}", &out[out.len() - 200..]);
    eprintln!("`wasmswitch fdb show` of the full table: {rows} rows in {cli:?}");

    // A cursor of a table a reload resized is refused, saying to start again.
    let next = first["next"].as_str().unwrap().to_string();
    std::fs::write(&cfg, yaml(port, 1, CAPACITY * 2)).unwrap();
    let (st, body) = http_within(port, "POST", "/api/v1/reload", Duration::from_secs(60)).unwrap();
    assert_eq!(st, 200, "{body}");
    let r = http_with(port, "GET", &format!("/api/v1/fdb?cursor={next}"), &[], b"").unwrap();
    assert!(r.status == 409 && r.body.contains("start the listing again"), "{r:?}");

    sigterm(&daemon);
    daemon.wait().unwrap();
}
