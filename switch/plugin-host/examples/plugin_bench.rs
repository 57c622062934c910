//! Micro benchmark: ns/packet of the plugin stage for the `acl` example, through Wasm (the real
//! host: encode + one component call + decode) and natively (the same Rust logic compiled for
//! the host, through the same encode/decode), at batch sizes 1, 16, 64 and 256.
//!
//!     plugins/build.sh acl c-portdeny
//!     cargo run --release -p wasmswitch-plugin-host --example plugin_bench \
//!         [-- path/to/acl.wasm [path/to/c-portdeny.wasm]]
//!
//! When the C example `c-portdeny` is there (built by `plugins/build.sh`, bindings from
//! `wit-bindgen c`), a second table runs one policy written twice: drop TCP/UDP packets to a
//! list of destination ports, as `c-portdeny` (C, a port bitmap) and as the Rust `acl` with one
//! `deny dport=...` rule per list entry, on traffic where half the packets match.
//!
//! Also reports a "floor" row: a plugin whose `process` only returns all-pass verdicts
//! (hand-written WAT), i.e. the cost of the call and the copies with no logic at all; and a
//! last table with the two ways a plugin's counters can reach the host (host calls, or
//! records in the result's trailer), measured on that floor plugin.

use std::path::PathBuf;
use std::time::Instant;

use wasmswitch_core::batch::Desc;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::{wire, PortId, Umem};
use wasmswitch_plugin_host::{EngineOptions, NativeStage, PluginEngine, PluginSpec};
use wasmswitch_plugin_sdk::harness;

const ACL: &str = "
default allow
deny proto=tcp dst=10.0.0.0/8 dport=22
deny proto=tcp dst=10.0.0.0/8 dport=23
deny proto=udp src=192.168.0.0/16 dport=161-162
allow proto=udp dst=172.16.0.0/12 dport=53
deny src=2001:db8::/32
deny proto=tcp sport=0-1023 dport=0-1023
deny dst=203.0.113.0/24
";

/// The port list of the two-languages table, for `c-portdeny` and as `acl` rules.
const PORTS: &[&str] = &["22", "23", "53", "123", "161-162", "445", "3389"];

const FLOOR: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "init") (param i32 i32) (result i32) (i32.store8 (i32.const 16) (i32.const 0)) (i32.const 16))
  (func (export "process") (param $p i32) (param $len i32) (result i32)
    (local $n i32)
    (local.set $n (i32.mul (i32.load16_u offset=2 (local.get $p)) (i32.const 4)))
    (memory.fill (i32.const 49152) (i32.const 0) (local.get $n))
    (i32.store (i32.const 32) (i32.const 49152))
    (i32.store (i32.const 36) (local.get $n))
    (i32.const 32)))"#;

/// How a plugin's counters reach the host, measured on the floor plugin: two `counter-add`
/// host calls per batch (what `wasmswitch:plugin@0.1.0` plugins did) against two counter-delta
/// records in the result's trailer (0.2.0).
fn floor_counting(calls: bool) -> String {
    let (import, count) = if calls {
        (
            r#"(import "wasmswitch:plugin/host@0.2.0" "counter-add" (func $add (param i32 i64)))"#,
            "(call $add (i32.const 0) (i64.const 1)) (call $add (i32.const 1) (i64.const 1))",
        )
    } else {
        // Two 12-byte records (id 0 and 1, delta 1) after the verdicts.
        ("", "(i64.store (i32.add (i32.const 49152) (local.get $n)) (i64.const 0x100000000)) (i64.store offset=8 (i32.add (i32.const 49152) (local.get $n)) (i64.const 0x100000000)) (i64.store offset=16 (i32.add (i32.const 49152) (local.get $n)) (i64.const 1)) (local.set $n (i32.add (local.get $n) (i32.const 24)))")
    };
    FLOOR.replacen("(module", &format!("(module {import}"), 1).replace(
        "(i32.store (i32.const 32) (i32.const 49152))",
        &format!("{count} (i32.store (i32.const 32) (i32.const 49152))"),
    )
}

/// Passes everything: run natively it measures the encode/decode around any plugin.
struct Nop;

impl wasmswitch_plugin_sdk::Plugin for Nop {
    fn init(_: &str) -> Result<Self, String> {
        Ok(Nop)
    }
}

fn floor_component(repo: &std::path::Path, wat: &str) -> Vec<u8> {
    let mut resolve = wit_parser::Resolve::default();
    let pkg = resolve.push_dir(repo.join("wit")).unwrap().0;
    let world = resolve.select_world(&[pkg], None).unwrap();
    let mut m = wat::parse_str(wat).unwrap();
    wit_component::embed_component_metadata(&mut m, &resolve, world, wit_component::StringEncoding::UTF8).unwrap();
    wit_component::ComponentEncoder::default().module(&m).unwrap().validate(true).encode().unwrap()
}

struct Frames {
    umem: Umem,
    descs: Vec<Desc>,
    meta: Vec<wire::PacketMeta>,
}

fn frames(n: usize) -> Frames {
    frames_to(n, |_| 80)
}

/// `n` UDP frames, frame `i` to destination port `dport(i)`.
fn frames_to(n: usize, dport: impl Fn(usize) -> u16) -> Frames {
    let umem = Umem::new(n as u32, 2048).unwrap();
    let (mut descs, mut meta) = (Vec::new(), Vec::new());
    for i in 0..n {
        let f = harness::udp4([10, 1, (i >> 8) as u8, i as u8], [10, 2, 0, (i % 7) as u8], 1024 + i as u16, dport(i));
        let addr = i as u64 * 2048 + 256;
        // SAFETY: the benchmark owns the UMEM; each frame lives alone in its slot.
        unsafe { umem.bytes_mut(addr, f.len()) }.copy_from_slice(&f);
        descs.push(Desc { addr, len: f.len() as u32, options: 0 });
        meta.push(wire::parse(&f, 1522).unwrap());
    }
    Frames { umem, descs, meta }
}

fn ns_per_packet(stage: &mut dyn VerdictStage, f: &Frames, batch: usize) -> f64 {
    let view =
        BatchView { in_port: PortId(0), queue: 0, umem: &f.umem, descs: &f.descs[..batch], meta: &f.meta[..batch] };
    let mut v = vec![Verdict::Pass; batch];
    let iters = (4_000_000 / batch).max(20_000);
    for _ in 0..iters / 10 {
        stage.run(&view, &mut v);
    }
    // Best of 5 runs: this machine is noisy.
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                v.fill(Verdict::Pass);
                stage.run(&view, &mut v);
            }
            t.elapsed().as_nanos() as f64 / (iters * batch) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let acl_path = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| repo.join("plugins/out/acl.wasm"));
    if !acl_path.exists() {
        eprintln!("{} not found: run plugins/build.sh acl first", acl_path.display());
        std::process::exit(1);
    }
    let engine = PluginEngine::new(EngineOptions::default()).unwrap();
    let mut spec = PluginSpec::new("acl", &acl_path);
    spec.config = ACL.into();
    spec.header_bytes = 64;
    let acl = engine.compile(&spec).unwrap();
    let floor_plugin = |name: &str, wat: &str| {
        let path = std::env::temp_dir().join(format!("wasmswitch-{name}.wasm"));
        std::fs::write(&path, floor_component(&repo, wat)).unwrap();
        let mut spec = PluginSpec::new(name, &path);
        spec.header_bytes = 64;
        engine.compile(&spec).unwrap()
    };
    let floor = floor_plugin("floor", FLOOR);
    let (by_calls, by_trailer) =
        (floor_plugin("floor-calls", &floor_counting(true)), floor_plugin("floor-trailer", &floor_counting(false)));
    let f = frames(256);

    println!(
        "acl ({} rules, every packet walks them all to the default), header_bytes 64; ns/packet, best of 5",
        ACL.lines().filter(|l| l.contains('=')).count()
    );
    println!(
        "columns: acl through wasm; acl native; their difference; a no-logic wasm plugin; a no-logic native plugin;"
    );
    println!("         call = floor - nop (the boundary: realloc call, copy in, export call, lift);");
    println!("         logic = extra time the acl logic itself takes as wasm code = (wasm - floor) - (native - nop)");
    println!(
        "{:>6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "batch", "wasm", "native", "overhead", "floor", "nop", "call", "logic"
    );
    let mut counting = Vec::new();
    for batch in [1usize, 16, 64, 256] {
        let mut w = acl.instantiate(0).unwrap();
        let mut n = NativeStage::<acl::Acl>::new(ACL, 64).unwrap();
        let mut fl = floor.instantiate(0).unwrap();
        // Check they agree before timing.
        let view =
            BatchView { in_port: PortId(0), queue: 0, umem: &f.umem, descs: &f.descs[..batch], meta: &f.meta[..batch] };
        let (mut a, mut b) = (vec![Verdict::Pass; batch], vec![Verdict::Pass; batch]);
        w.run(&view, &mut a);
        n.run(&view, &mut b);
        assert_eq!(a, b, "wasm and native disagree");
        let tw = ns_per_packet(&mut w, &f, batch);
        let tn = ns_per_packet(&mut n, &f, batch);
        let tf = ns_per_packet(&mut fl, &f, batch);
        let mut nop = NativeStage::<Nop>::new("", 64).unwrap();
        let t0 = ns_per_packet(&mut nop, &f, batch);
        println!(
            "{batch:>6} {tw:>8.1} {tn:>8.1} {:>9.1} {tf:>8.1} {t0:>8.1} {:>8.1} {:>8.1}",
            tw - tn,
            tf - t0,
            (tw - tf) - (tn - t0)
        );
        counting.push((
            batch,
            tf,
            ns_per_packet(&mut by_calls.instantiate(0).unwrap(), &f, batch),
            ns_per_packet(&mut by_trailer.instantiate(0).unwrap(), &f, batch),
        ));
        let faults: Vec<_> = wasmswitch_plugin_host::FaultReason::ALL
            .iter()
            .map(|r| (r.as_str(), w.stats().faults(*r).get()))
            .filter(|f| f.1 > 0)
            .collect();
        assert!(faults.is_empty(), "the wasm plugin faulted: {faults:?}");
    }
    if let Some(c_path) = std::env::args()
        .nth(2)
        .map(PathBuf::from)
        .or_else(|| Some(repo.join("plugins/out/c-portdeny.wasm")).filter(|p| p.exists()))
    {
        two_languages(&engine, &acl_path, &c_path, &floor);
    }
    println!();
    println!("two counters per batch on the floor plugin: by two counter-add host calls, or as two records in the result's trailer; ns/packet");
    println!("{:>6} {:>8} {:>8} {:>8} {:>8} {:>8}", "batch", "floor", "calls", "trailer", "+calls", "+trailer");
    for (batch, tf, tc, tt) in counting {
        println!("{batch:>6} {tf:>8.1} {tc:>8.1} {tt:>8.1} {:>8.1} {:>8.1}", tc - tf, tt - tf);
    }
}

/// One policy in two languages: `c-portdeny` (C) against `acl` (Rust) configured the same.
fn two_languages(
    engine: &std::sync::Arc<PluginEngine>,
    acl_path: &std::path::Path,
    c_path: &std::path::Path,
    floor: &std::sync::Arc<wasmswitch_plugin_host::PluginFactory>,
) {
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let compile = |name: &str, path: &std::path::Path, config: String| {
        let mut spec = PluginSpec::new(name, path);
        spec.config = config;
        spec.header_bytes = 64;
        engine.compile(&spec).unwrap()
    };
    let c = compile("c-portdeny", c_path, PORTS.join(" "));
    let rules: Vec<String> = PORTS.iter().map(|p| format!("deny dport={p}")).collect();
    let rust = compile("acl", acl_path, rules.join("\n"));
    // Every other packet goes to a listed port.
    let f = frames_to(256, |i| [80, 53, 443, 3389][i % 4]);
    println!();
    println!(
        "one policy, two languages: drop TCP/UDP to destination ports {} (half the packets match); ns/packet, best of 5",
        PORTS.join(",")
    );
    println!(
        "columns: c-portdeny (C, wit-bindgen c + clang-19, {} bytes); acl (Rust SDK, {} rules, {} bytes); floor (no logic)",
        size(c_path),
        rules.len(),
        size(acl_path)
    );
    println!("{:>6} {:>8} {:>8} {:>8} {:>8} {:>8}", "batch", "c", "rust", "c-rust", "floor", "c-floor");
    for batch in [1usize, 16, 64, 256] {
        let (mut cs, mut rs, mut fl) =
            (c.instantiate(0).unwrap(), rust.instantiate(0).unwrap(), floor.instantiate(0).unwrap());
        let view =
            BatchView { in_port: PortId(0), queue: 0, umem: &f.umem, descs: &f.descs[..batch], meta: &f.meta[..batch] };
        let (mut a, mut b) = (vec![Verdict::Pass; batch], vec![Verdict::Pass; batch]);
        cs.run(&view, &mut a);
        rs.run(&view, &mut b);
        assert_eq!(a, b, "c-portdeny and acl disagree");
        assert_eq!(a.iter().filter(|v| **v == Verdict::Drop).count(), batch / 2, "half match");
        let (tc, tr, tf) =
            (ns_per_packet(&mut cs, &f, batch), ns_per_packet(&mut rs, &f, batch), ns_per_packet(&mut fl, &f, batch));
        println!("{batch:>6} {tc:>8.1} {tr:>8.1} {:>8.1} {tf:>8.1} {:>8.1}", tc - tr, tc - tf);
        assert_eq!(cs.stats().faults_total() + rs.stats().faults_total(), 0, "a plugin faulted");
    }
}
