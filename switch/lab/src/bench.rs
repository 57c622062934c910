//! `wasmswitch bench`: drives the sim datapath on one worker (or `--workers N`) and measures it.
//!
//! Every scenario is measured in the same process, one after the other, so ratios between
//! them are meaningful even on a noisy machine.
//!
//! `l2+native` runs a plugin's logic compiled natively, which needs the plugin crates linked
//! in: this crate must not depend on the example plugins, so that scenario takes a
//! [`NativeFactory`] from the binary that has them (`wasmswitch-bench-native`, in
//! `benches/native`), through [`run_with`].

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;
use wasmswitch_core::counter::cycles;
use wasmswitch_core::pipeline::Pipeline;
use wasmswitch_core::pool::{check_no_leak, AllocMode};
use wasmswitch_core::stats::WorkerStats;
use wasmswitch_core::verdict::VerdictStage;
use wasmswitch_core::PortId;

use wasmswitch_daemon::config::Config;
use wasmswitch_daemon::dataplane::{build, Built};

/// A scenario: name, forwarding mode, datapath variant, ingress stage.
struct Scenario {
    name: &'static str,
    mode: &'static str,
    variant: Variant,
    stage: Stage,
    /// RX batch (`switch.batch`): `None` for the run's `--batch`.
    batch: Option<usize>,
    about: &'static str,
}

/// What runs as every port's ingress verdict stage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    None,
    /// `--plugin FILE` through wasmtime.
    Wasm,
    /// The same, with another instance of it as the port's shadow chain.
    WasmShadow,
    /// `Wasm` compiled without the epoch checks that enforce the CPU-time deadline: what
    /// the deadline costs. Never what the daemon runs.
    WasmNoDeadline,
    /// The same plugin's logic compiled natively (by the [`NativeFactory`]), through the same
    /// batch encoding: what the Wasm boundary and codegen add.
    Native,
    /// Not the pipeline at all: the least-work loop ([`floor`]).
    Floor,
}

/// What the daemon runs, which most scenarios measure.
/// Datapath variants the benchmark compares with each other (the daemon runs [`DEFAULT`]),
/// set on the built pipelines ([`Pipeline::set_variant`]).
#[derive(Clone, Copy, Debug)]
struct Variant {
    alloc: AllocMode,
    /// See [`wasmswitch_core::pipeline::PipelineOptions::bulk_return`].
    bulk_return: bool,
    /// See [`wasmswitch_core::pipeline::PipelineOptions::parse_all`].
    parse_all: bool,
}

/// What the daemon runs.
const DEFAULT: Variant = Variant { alloc: AllocMode::Recycling, bulk_return: true, parse_all: false };

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "floor",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::Floor,
        batch: None,
        about: "least work: template copy, two MACs, FxHashMap learn + lookup, batch 64; no rings, parse or counters",
    },
    Scenario {
        name: "passthrough",
        mode: "passthrough",
        variant: DEFAULT,
        stage: Stage::None,
        batch: None,
        about: "RX -> TX on the same port, no parsing or lookup (the ceiling)",
    },
    Scenario {
        name: "l2",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::None,
        batch: None,
        about: "learning switch, 4 ports, 1024 source MACs, 5% broadcast",
    },
    Scenario {
        name: "l2-batch256",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::None,
        batch: Some(256),
        about: "l2 taking up to 256 packets per RX burst (switch.batch: 256) instead of --batch",
    },
    Scenario {
        name: "l2-parse-all",
        mode: "l2",
        variant: Variant { parse_all: true, ..DEFAULT },
        stage: Stage::None,
        batch: None,
        about: "l2 parsing every frame down to L4, as a port with plugins does (l2 stops after the tags)",
    },
    Scenario {
        name: "l2-vlan",
        mode: "l2-vlan",
        variant: DEFAULT,
        stage: Stage::None,
        batch: None,
        about: "l2 with 4 trunk ports carrying VLANs 10-13, every frame tagged, learning per VLAN",
    },
    Scenario {
        name: "l2-two-umem",
        mode: "l2-two-umem",
        variant: DEFAULT,
        stage: Stage::None,
        batch: None,
        about: "l2 with ports p2, p3 in a second UMEM group: frames between the groups are copied",
    },
    Scenario {
        name: "l2-single-return",
        mode: "l2",
        variant: Variant { bulk_return: false, ..DEFAULT },
        stage: Stage::None,
        batch: None,
        about: "l2, TX completions returned one at a time",
    },
    Scenario {
        name: "l2-no-recycle",
        mode: "l2",
        variant: Variant { alloc: AllocMode::SharedLocked, ..DEFAULT },
        stage: Stage::None,
        batch: None,
        about: "l2, every frame from/to a shared locked allocator, no per-worker cache",
    },
    Scenario {
        name: "l2+plugin",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::Wasm,
        batch: None,
        about: "l2 with --plugin on every port's ingress, through wasmtime",
    },
    Scenario {
        name: "l2+plugin-batch256",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::Wasm,
        batch: Some(256),
        about: "l2+plugin with batches of up to 256 packets: a quarter of the plugin calls",
    },
    Scenario {
        name: "l2+plugin+shadow",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::WasmShadow,
        batch: None,
        about: "l2+plugin with a second instance of --plugin in shadow on every port (verdicts compared, not applied)",
    },
    Scenario {
        name: "l2+plugin-no-deadline",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::WasmNoDeadline,
        batch: None,
        about:
            "l2+plugin compiled without the epoch checks of the CPU-time deadline (what they cost; never the daemon's)",
    },
    Scenario {
        name: "l2+native",
        mode: "l2",
        variant: DEFAULT,
        stage: Stage::Native,
        batch: None,
        about: "l2 with the same plugin's logic compiled natively (example plugins only)",
    },
];

/// Builds one `l2+native` stage: the plugin `name` (the `--plugin` file's stem) compiled
/// natively, initialised with `config`, seeing `header_bytes` of each packet. An error for a
/// plugin it has no native build of.
pub type NativeFactory = fn(name: &str, config: &str, header_bytes: u16) -> Result<Box<dyn VerdictStage>>;

/// Why `l2+native` does not run without a [`NativeFactory`].
const NO_NATIVE: &str = "scenario `l2+native` needs the example plugins compiled natively, which `wasmswitch` \
                         does not link: run it with `wasmswitch-bench-native` (same options; built by \
                         `cargo build --release -p wasmswitch-bench-native`)";

/// `--plugin`: the component, its config text, its header bytes.
pub struct PluginBench {
    /// The component file; its stem names the plugin (and picks its native build).
    pub path: std::path::PathBuf,
    /// The text handed to `init` (the `--plugin-config` file's; empty without one).
    pub config: String,
    /// Leading bytes of each packet the plugin sees.
    pub header_bytes: u16,
    /// Compiled on first use, then shared by every round of `l2+plugin` (and of
    /// `l2+plugin+shadow`).
    compiled: std::cell::OnceCell<std::sync::Arc<wasmswitch_plugin_host::PluginFactory>>,
    /// The same for `l2+plugin-no-deadline`, by an engine without deadline checks.
    compiled_unchecked: std::cell::OnceCell<std::sync::Arc<wasmswitch_plugin_host::PluginFactory>>,
    /// The counters of the instances the last [`PluginBench::stages`] made: a scenario whose
    /// plugin faulted measured its `on_error` policy, not the plugin.
    seen: std::cell::RefCell<Vec<std::sync::Arc<wasmswitch_plugin_host::PluginStats>>>,
}

impl PluginBench {
    /// The plugin, not compiled yet: the first scenario that runs it compiles it.
    pub fn new(path: std::path::PathBuf, config: String, header_bytes: u16) -> Self {
        Self {
            path,
            config,
            header_bytes,
            compiled: Default::default(),
            compiled_unchecked: Default::default(),
            seen: Default::default(),
        }
    }

    /// An error naming the faults of the instances of the last scenario, if they had any.
    fn faulted(&self, scenario: &str) -> Result<()> {
        let seen = self.seen.borrow();
        let faults: u64 = seen.iter().map(|s| s.faults_total()).sum();
        if faults == 0 {
            return Ok(());
        }
        let reasons: Vec<String> = wasmswitch_plugin_host::FaultReason::ALL
            .iter()
            .filter_map(|&r| {
                let n: u64 = seen.iter().map(|s| s.faults(r).get()).sum();
                (n > 0).then(|| format!("{} {n}", r.as_str()))
            })
            .collect();
        bail!(
            "scenario `{scenario}`: the plugin faulted {faults} times ({}), so the figures would measure its on_error \
             policy, not the plugin; `wasmswitch check` runs it on test frames and names the fault",
            reasons.join(", ")
        )
    }

    fn name(&self) -> String {
        self.path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin").to_string()
    }

    /// One stage per port (each port gets its own instance, as in the daemon).
    fn stages(&self, kind: Stage, ports: usize, native: Option<NativeFactory>) -> Result<Vec<Box<dyn VerdictStage>>> {
        match kind {
            Stage::None | Stage::Floor => Ok(Vec::new()),
            Stage::Native => {
                let make = native.ok_or_else(|| anyhow::anyhow!(NO_NATIVE))?;
                (0..ports).map(|_| make(&self.name(), &self.config, self.header_bytes)).collect()
            }
            Stage::Wasm | Stage::WasmShadow | Stage::WasmNoDeadline => {
                let checked = kind != Stage::WasmNoDeadline;
                let cell = if checked { &self.compiled } else { &self.compiled_unchecked };
                if cell.get().is_none() {
                    let mut spec = wasmswitch_plugin_host::PluginSpec::new(self.name(), &self.path);
                    spec.config = self.config.clone();
                    spec.header_bytes = self.header_bytes;
                    let opts = wasmswitch_plugin_host::EngineOptions { deadline_checks: checked, ..Default::default() };
                    let engine = wasmswitch_plugin_host::PluginEngine::new(opts).map_err(|m| anyhow::anyhow!(m))?;
                    let _ = cell.set(engine.compile(&spec)?);
                }
                let factory = cell.get().expect("compiled above");
                let mut seen = self.seen.borrow_mut();
                seen.clear();
                (0..ports)
                    .map(|_| {
                        let stage = factory.instantiate(0)?;
                        seen.push(stage.stats().clone());
                        Ok(if kind == Stage::WasmShadow {
                            let shadow = factory.instantiate(0)?;
                            seen.push(shadow.stats().clone());
                            Box::new(wasmswitch_daemon::plugins::ChainStage::new("bench", vec![stage], vec![shadow]))
                                as Box<dyn VerdictStage>
                        } else {
                            Box::new(stage)
                        })
                    })
                    .collect()
            }
        }
    }
}

/// Every scenario's name, in the order a run without `--scenario` takes them.
pub fn scenario_names() -> Vec<&'static str> {
    SCENARIOS.iter().map(|s| s.name).collect()
}

/// One line of results.
#[derive(Serialize, Debug, Clone)]
pub struct BenchResult {
    /// The scenario's name.
    pub scenario: String,
    /// Millions of packets per second (all workers together).
    pub mpps: f64,
    /// Nanoseconds per packet of the whole switch (1000 / `mpps`).
    pub ns_per_pkt: f64,
    /// TSC cycles (nanoseconds off x86_64) per packet: the workers' busy cycles over all
    /// their packets.
    pub cycles_per_pkt: f64,
    /// Packets received and processed in the measured time.
    pub packets: u64,
    /// Packets sent, all ports together (a flooded packet once per port it left by).
    pub tx_packets: u64,
    /// Packets dropped, all ports and reasons together.
    pub drops: u64,
    /// `drops` as a percentage of `packets`.
    pub loss_pct: f64,
    /// Seconds measured (the longest worker's), warm-up excluded.
    pub seconds: f64,
    /// Frame size in bytes.
    pub frame_size: usize,
    /// Frames not back in their pool after the run: 0 unless frames leak.
    pub frames_leaked: usize,
    /// Mpps of every round of this scenario (the row reports the best).
    pub rounds_mpps: Vec<f64>,
    /// Workers that ran it (their sum is the row).
    pub workers: usize,
    /// Frames copied from one UMEM group into another (`l2-two-umem`).
    pub umem_copies: u64,
}

/// Rounds of one scenario that disagree by more than this ((max - min) / median) mark the
/// run as too noisy to compare: on a busy 2-core machine one round can lose half its speed.
pub const SPREAD_LIMIT_PCT: f64 = 10.0;

impl BenchResult {
    /// (max - min) / median of the rounds, in percent; 0 for a single round.
    pub fn spread_pct(&self) -> f64 {
        let mut v = self.rounds_mpps.clone();
        if v.len() < 2 {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        100.0 * (v[v.len() - 1] - v[0]) / median.max(f64::MIN_POSITIVE)
    }
}

/// The options of `wasmswitch bench`; `wasmswitch-bench-native` parses the same ones.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// One JSON object per scenario per line.
    #[arg(long)]
    pub json: bool,
    /// Scenario(s) to run (default: all that the other options allow): floor (with --workers
    /// N, N copies of the loop that share nothing), passthrough, l2, l2-batch256,
    /// l2-parse-all, l2-vlan, l2-two-umem, l2-single-return, l2-no-recycle, l2+plugin (needs
    /// --plugin), l2+plugin-batch256 (needs --plugin), l2+plugin+shadow (needs --plugin),
    /// l2+plugin-no-deadline (needs --plugin; by name only), l2+native (needs --plugin; only
    /// in wasmswitch-bench-native).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
    /// Measured seconds per scenario (after a 0.2 s warm-up).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Frame size in bytes.
    #[arg(long, default_value_t = 64)]
    pub frame_size: usize,
    /// Run the scenarios this many times, interleaved, and report each one's best run (the
    /// ratios then compare runs made close together on a noisy machine).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// A plugin component: adds `l2+plugin` (l2 with it on every port's ingress) and, in
    /// wasmswitch-bench-native for the example plugins, `l2+native` (the same logic compiled
    /// natively).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// File whose text is the plugin's config (handed to `init`).
    #[arg(long, requires = "plugin")]
    pub plugin_config: Option<PathBuf>,
    /// Header bytes the plugin sees per packet.
    #[arg(long, default_value_t = 64)]
    pub header_bytes: u16,
    /// Workers, each on its own thread pinned to CPU 0, 1, ... (wrapping around the CPUs
    /// there are), polling its own queue of every port; the rows are their sums.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Most packets per RX burst, i.e. per batch and plugin call (`switch.batch`), 1-256, for
    /// every scenario but those named `-batch256`.
    #[arg(long, default_value_t = wasmswitch_core::DEFAULT_BATCH)]
    pub batch: usize,
}

impl BenchArgs {
    /// The options [`run_with`] takes: reads the `--plugin-config` file.
    pub fn options(self) -> Result<BenchOptions> {
        let BenchArgs {
            json,
            scenarios,
            seconds,
            frame_size,
            rounds,
            plugin,
            plugin_config,
            header_bytes,
            workers,
            batch,
        } = self;
        let plugin = match plugin {
            Some(path) => {
                let config = match plugin_config {
                    Some(f) => std::fs::read_to_string(&f)
                        .map_err(|e| anyhow::anyhow!("--plugin-config {}: {e}", f.display()))?,
                    None => String::new(),
                };
                Some(PluginBench::new(path, config, header_bytes))
            }
            None => None,
        };
        Ok(BenchOptions { json, scenarios, seconds, frame_size, rounds, plugin, workers, batch })
    }
}

/// What [`run_with`] runs: the options of [`BenchArgs`], the plugin's config read.
pub struct BenchOptions {
    /// One JSON object per scenario per line instead of the table.
    pub json: bool,
    /// Names of the scenarios to run; empty: all that the other options allow.
    pub scenarios: Vec<String>,
    /// Measured seconds per scenario (after a 0.2 s warm-up).
    pub seconds: f64,
    /// Frame size in bytes (60-1792).
    pub frame_size: usize,
    /// Passes over the scenarios, interleaved; each scenario reports its best pass.
    pub rounds: u32,
    /// The `--plugin` component, which the plugin scenarios need.
    pub plugin: Option<PluginBench>,
    /// Pinned workers per scenario (see [`BenchArgs::workers`]).
    pub workers: usize,
    /// RX batch of the scenarios without their own (see [`BenchArgs::batch`]).
    pub batch: usize,
}

/// Most `--workers`.
pub const MAX_WORKERS: usize = 64;

/// The YAML of the benchmark topology: 4 sim ports, 256 source MACs each (1024 in all), one
/// queue per port per worker. Mode `l2-vlan` is `l2` with every port a trunk of VLANs 10-13 and
/// the traffic spread over them; mode `l2-two-umem` is `l2` with p2 and p3 in a second UMEM
/// group.
pub fn topology_yaml(mode: &str, frame_size: usize, workers: usize, batch: usize) -> String {
    let two_umem = mode == "l2-two-umem";
    let (mode, vlan) = match mode {
        "l2-vlan" => ("l2", "        vlan: [\"10-13\"]\n    vlan: { mode: trunk, allowed: [\"10-13\"] }\n"),
        "l2-two-umem" => ("l2", ""),
        m => (m, ""),
    };
    let second = |p: usize| if two_umem && p >= 2 { "    umem: second\n" } else { "" };
    let frames = 16384 * workers;
    let mut y = format!("switch:\n  mode: {mode}\n  batch: {batch}\npool:\n  frames: {frames}\nworkers:\n");
    for _ in 0..workers {
        y += "  - idle: poll\n";
    }
    y += "ports:\n";
    for p in 0..4 {
        y += &format!(
            "  - name: p{p}\n    driver: sim\n    sim:\n      queues: {workers}\n      ring_size: 1024\n      traffic:\n        src_macs: 256\n        frame_sizes: [{frame_size}]\n        broadcast_percent: 5\n        flows: 1024\n{vlan}{}",
            second(p)
        );
    }
    y
}

struct Snapshot {
    packets: u64,
    tx: u64,
    drops: u64,
    cycles: u64,
    umem_copies: u64,
}

fn snapshot(s: &WorkerStats) -> Snapshot {
    Snapshot {
        umem_copies: s.umem_copies.get(),
        packets: s.packets.get(),
        tx: s.ports.iter().map(|p| p.tx_packets.get()).sum(),
        drops: s.ports.iter().map(|p| p.drops_total()).sum(),
        cycles: s.busy_cycles.get(),
    }
}

/// Runs `step` on `state` for 200 ms, untimed.
fn warm_up<S: ?Sized>(state: &mut S, mut step: impl FnMut(&mut S)) {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(200) {
        step(state);
    }
}

/// Runs `step` on `state` for `seconds`, calling `progress` about every 250 ms; returns the
/// seconds it ran (the clock is read once per step, so a step should be a few batches).
/// Never inlined: `benches/count.sh` counts instructions inside this one frame (callgrind's
/// `--toggle-collect`), so the warm-up and the set-up stay out of its figures.
#[inline(never)]
fn timed<S: ?Sized>(state: &mut S, seconds: f64, progress: &mut dyn FnMut(f64), mut step: impl FnMut(&mut S)) -> f64 {
    let start = Instant::now();
    let limit = Duration::from_secs_f64(seconds);
    let mut last_progress = Instant::now();
    loop {
        step(state);
        let el = start.elapsed();
        if el >= limit {
            return el.as_secs_f64();
        }
        if last_progress.elapsed() > Duration::from_millis(250) {
            progress(el.as_secs_f64());
            last_progress = Instant::now();
        }
    }
}

/// Runs `pipe` for `seconds` (after a warm-up) and measures it.
pub fn measure(
    name: &str,
    pipe: &mut Pipeline,
    seconds: f64,
    frame_size: usize,
    mut progress: impl FnMut(f64),
) -> BenchResult {
    warm_up(pipe, |p| {
        p.poll();
    });
    let before = snapshot(pipe.stats());
    let secs = timed(pipe, seconds, &mut progress, |p| {
        for _ in 0..16 {
            p.poll();
        }
    });
    let after = snapshot(pipe.stats());
    let packets = after.packets - before.packets;
    let drops = after.drops - before.drops;
    BenchResult {
        scenario: name.to_string(),
        mpps: packets as f64 / secs / 1e6,
        ns_per_pkt: secs * 1e9 / packets.max(1) as f64,
        cycles_per_pkt: (after.cycles - before.cycles) as f64 / packets.max(1) as f64,
        packets,
        tx_packets: after.tx - before.tx,
        drops,
        loss_pct: 100.0 * drops as f64 / packets.max(1) as f64,
        seconds: secs,
        frame_size,
        frames_leaked: 0,
        rounds_mpps: Vec::new(),
        workers: 1,
        umem_copies: after.umem_copies - before.umem_copies,
    }
}

/// Runs every pipeline of `pipes` on a thread of its own (see [`pinned`]) and sums them.
pub fn measure_workers(
    name: &str,
    pipes: &mut [Pipeline],
    seconds: f64,
    frame_size: usize,
    progress: impl FnMut(f64),
) -> BenchResult {
    if let [pipe] = pipes {
        return measure(name, pipe, seconds, frame_size, progress);
    }
    summed(name, frame_size, pinned(pipes.iter_mut(), |pipe| measure(name, pipe, seconds, frame_size, |_| {})))
}

/// Runs `run` on every item, each on a thread of its own pinned to CPU w (w = its index,
/// wrapping around the CPUs), started together.
fn pinned<T: Send>(items: impl IntoIterator<Item = T>, run: impl Fn(T) -> BenchResult + Sync) -> Vec<BenchResult> {
    let items: Vec<T> = items.into_iter().collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = std::sync::Barrier::new(items.len());
    std::thread::scope(|scope| {
        let (run, start) = (&run, &start);
        let threads: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(w, item)| {
                scope.spawn(move || {
                    if let Err(e) = wasmswitch_sys::pin_to_cpu(w % cpus) {
                        eprintln!("bench worker {w}: cannot pin to cpu {}: {e}", w % cpus);
                    }
                    start.wait();
                    run(item)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a bench worker panicked")).collect()
    })
}

/// The workers' rows as one: Mpps add up, ns/packet is the switch's (1 / Mpps), cycles/packet
/// is all workers' cycles over all packets.
fn summed(name: &str, frame_size: usize, rows: Vec<BenchResult>) -> BenchResult {
    let packets: u64 = rows.iter().map(|r| r.packets).sum();
    let cycles: f64 = rows.iter().map(|r| r.cycles_per_pkt * r.packets as f64).sum();
    let mpps: f64 = rows.iter().map(|r| r.mpps).sum();
    let drops: u64 = rows.iter().map(|r| r.drops).sum();
    BenchResult {
        scenario: name.to_string(),
        mpps,
        ns_per_pkt: 1e3 / mpps.max(f64::MIN_POSITIVE),
        cycles_per_pkt: cycles / packets.max(1) as f64,
        packets,
        tx_packets: rows.iter().map(|r| r.tx_packets).sum(),
        drops,
        loss_pct: 100.0 * drops as f64 / packets.max(1) as f64,
        seconds: rows.iter().map(|r| r.seconds).fold(0.0, f64::max),
        frame_size,
        frames_leaked: rows.iter().map(|r| r.frames_leaked).sum(),
        rounds_mpps: Vec::new(),
        workers: rows.len(),
        umem_copies: rows.iter().map(|r| r.umem_copies).sum(),
    }
}

/// Builds the topology with `workers` pipelines, puts `stages[w * 4 + p]` as port p's ingress
/// stage on worker w, hands the pipelines to `run` and checks for leaks after.
fn with_stages(
    mode: &str,
    frame_size: usize,
    variant: Variant,
    workers: usize,
    batch: usize,
    stages: Vec<Box<dyn VerdictStage>>,
    run: impl FnOnce(&mut [Pipeline]) -> BenchResult,
) -> Result<BenchResult> {
    let cfg = Config::parse(&topology_yaml(mode, frame_size, workers, batch), Path::new("<bench>"))?;
    let Built { groups, mut pipelines, .. } = build(&cfg)?;
    for pipe in &mut pipelines {
        pipe.set_variant(variant.alloc, variant.bulk_return, variant.parse_all);
    }
    let mut stages = stages.into_iter();
    for pipe in &mut pipelines {
        for p in 0..4 {
            if let Some(stage) = stages.next() {
                pipe.set_ingress(PortId(p), Some(stage));
            }
        }
    }
    let mut r = run(&mut pipelines);
    for mut pipe in pipelines {
        pipe.shutdown();
    }
    for g in &groups {
        if let Err(e) = check_no_leak(&g.pool, &[]) {
            eprintln!("{} (UMEM group `{}`): {e}", r.scenario, g.name);
            r.frames_leaked += g.pool.total_frames().saturating_sub(g.pool.frames_at_rest()).max(1);
        }
    }
    Ok(r)
}

/// Runs the benchmark without `l2+native`.
pub fn run(opts: &BenchOptions) -> Result<Vec<BenchResult>> {
    run_with(opts, None)
}

/// Runs the benchmark; `native` makes the `l2+native` scenario available.
pub fn run_with(opts: &BenchOptions, native: Option<NativeFactory>) -> Result<Vec<BenchResult>> {
    let chosen: Vec<&Scenario> = if opts.scenarios.is_empty() {
        SCENARIOS
            .iter()
            .filter(|s| match s.stage {
                Stage::None | Stage::Floor => true,
                Stage::Wasm | Stage::WasmShadow => opts.plugin.is_some(),
                // A diagnostic, run by name only.
                Stage::WasmNoDeadline => false,
                Stage::Native => opts.plugin.is_some() && native.is_some(),
            })
            .collect()
    } else {
        opts.scenarios
            .iter()
            .map(|n| {
                SCENARIOS.iter().find(|s| s.name == n).ok_or_else(|| {
                    anyhow::anyhow!("unknown scenario `{n}`: expected one of {}", scenario_names().join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    // Before the --plugin check: without a factory, --plugin would not help.
    if native.is_none() && chosen.iter().any(|s| s.stage == Stage::Native) {
        bail!(NO_NATIVE);
    }
    if let Some(s) = chosen.iter().find(|s| {
        matches!(s.stage, Stage::Wasm | Stage::WasmShadow | Stage::WasmNoDeadline | Stage::Native)
            && opts.plugin.is_none()
    }) {
        bail!("scenario `{}` needs --plugin FILE", s.name);
    }
    if !(60..=1792).contains(&opts.frame_size) {
        bail!("--frame-size {} is out of range: expected 60-1792", opts.frame_size);
    }
    if opts.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let (lo, hi) = wasmswitch_daemon::config::range::BATCH;
    if !(lo..=hi).contains(&opts.batch) {
        bail!("--batch {} is out of range: expected {lo}-{hi}", opts.batch);
    }
    if !(1..=MAX_WORKERS).contains(&opts.workers) {
        bail!("--workers {} is out of range: expected 1-{MAX_WORKERS}", opts.workers);
    }
    // results[i]: the best pass so far of chosen[i].
    let mut results: Vec<Option<BenchResult>> = chosen.iter().map(|_| None).collect();
    let (total, rounds) = (chosen.len(), opts.rounds);
    for round in 1..=rounds {
        for (i, s) in chosen.iter().enumerate() {
            let stages = match &opts.plugin {
                Some(p) => p.stages(s.stage, 4 * opts.workers, native)?,
                None => Vec::new(),
            };
            // A terminal gets a line redrawn in place; a pipe or file one line per scenario.
            let tty = !opts.json && std::io::stderr().is_terminal();
            if !opts.json && !tty {
                eprintln!("[round {round}/{rounds}, {}/{total}] {} for {:.1}s", i + 1, s.name, opts.seconds);
            }
            let progress = |t: f64| {
                if tty {
                    eprint!(
                        "\r[round {round}/{rounds}, {}/{total}] {:<21} {t:4.1}s / {:.1}s",
                        i + 1,
                        s.name,
                        opts.seconds
                    );
                    let _ = std::io::stderr().flush();
                }
            };
            let r = if s.stage == Stage::Floor && opts.workers == 1 {
                floor(opts.seconds, opts.frame_size, progress)
            } else if s.stage == Stage::Floor {
                let (seconds, frame_size) = (opts.seconds, opts.frame_size);
                // Shared-nothing copies: what this machine's cores give the least-work loop,
                // the ceiling for any switch's scaling here.
                summed("floor", frame_size, pinned(0..opts.workers, |_| floor(seconds, frame_size, |_| {})))
            } else {
                with_stages(
                    s.mode,
                    opts.frame_size,
                    s.variant,
                    opts.workers,
                    s.batch.unwrap_or(opts.batch),
                    stages,
                    |pipes| measure_workers(s.name, pipes, opts.seconds, opts.frame_size, progress),
                )?
            };
            if let (Some(p), Stage::Wasm | Stage::WasmShadow | Stage::WasmNoDeadline) = (&opts.plugin, s.stage) {
                p.faulted(s.name)?;
            }
            if opts.json {
                println!("{}", serde_json::to_string(&r)?);
            } else if tty {
                eprint!("\r{:70}\r", "");
            }
            let mut seen = results[i].as_ref().map(|b| b.rounds_mpps.clone()).unwrap_or_default();
            seen.push(r.mpps);
            if results[i].as_ref().is_none_or(|best| r.mpps > best.mpps) {
                results[i] = Some(r);
            }
            if let Some(best) = results[i].as_mut() {
                best.rounds_mpps = seen;
            }
        }
    }
    let results: Vec<BenchResult> = results.into_iter().flatten().collect();
    if !opts.json {
        print_table(&results, opts.plugin.as_ref().map(|p| p.name()).as_deref());
        if opts.workers > 1 {
            println!(
                "({} workers on their own threads, pinned to CPUs 0, 1, ... of {}; each row is their sum)",
                opts.workers,
                std::thread::available_parallelism().map_or(1, |n| n.get())
            );
        }
        if rounds > 1 {
            println!(
                "(each row: the best of {rounds} interleaved rounds; spread = (max - min) / median of its rounds)"
            );
            for r in results.iter().filter(|r| r.spread_pct() > SPREAD_LIMIT_PCT) {
                println!(
                    "WARNING: {}'s rounds disagree by {:.0}% (over {SPREAD_LIMIT_PCT}%): the machine was busy; do not compare figures of this run",
                    r.scenario,
                    r.spread_pct()
                );
            }
        }
    }
    Ok(results)
}

/// The least work a switch can do per packet, as a yardstick for the pipeline: copy a 64-byte
/// template into a frame taken from a free stack, read the two MACs, learn the source and look
/// up the destination in an FxHashMap of 1024 MACs, give the frame back; batches of 64. No
/// rings, no parse, no counters (the same traffic shape as the sim scenarios: 1024 MACs).
fn floor(seconds: f64, frame_size: usize, mut progress: impl FnMut(f64)) -> BenchResult {
    const FRAME: usize = 2048;
    const FRAMES: usize = 4096;
    let mut mem = vec![0u8; FRAME * FRAMES];
    let mut free: Vec<u32> = (0..FRAMES as u32).collect();
    let templates: Vec<[u8; 64]> = (0..1024u64)
        .map(|i| {
            let mut t = [0u8; 64];
            let mac = |n: u64| (0x0200_0000_0000u64 | n).to_be_bytes();
            t[0..6].copy_from_slice(&mac((i * 7 + 3) % 1024)[2..]);
            t[6..12].copy_from_slice(&mac(i)[2..]);
            t[12..14].copy_from_slice(&[0x08, 0x00]);
            t
        })
        .collect();
    let mut fdb: rustc_hash::FxHashMap<u64, u16> = rustc_hash::FxHashMap::default();
    fdb.reserve(1024);
    let mac_at = |b: &[u8]| u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]]);
    let mut batch = [0u32; 64];
    let mut n: usize = 0;
    let mut found: u64 = 0;
    let mut round = |n: &mut usize| {
        for slot in batch.iter_mut() {
            let f = free.pop().expect("the batch returns every frame");
            let off = f as usize * FRAME;
            let t = &templates[*n % 1024];
            mem[off..off + 64].copy_from_slice(t);
            let frame = &mem[off..off + 64];
            let (dst, src) = (mac_at(&frame[0..6]), mac_at(&frame[6..12]));
            fdb.insert(src, (*n % 4) as u16);
            found += fdb.get(&dst).map_or(0, |&p| u64::from(p) + 1);
            *slot = f;
            *n += 1;
        }
        free.extend_from_slice(&batch);
    };
    warm_up(&mut n, &mut round);
    let (c0, n0) = (cycles(), n);
    let secs = timed(&mut n, seconds, &mut progress, |n| {
        for _ in 0..64 {
            round(n);
        }
    });
    let spent = cycles().wrapping_sub(c0);
    // Keeps the lookups from being optimised away.
    std::hint::black_box(found);
    let packets = (n - n0) as u64;
    BenchResult {
        scenario: "floor".into(),
        mpps: packets as f64 / secs / 1e6,
        ns_per_pkt: secs * 1e9 / packets.max(1) as f64,
        cycles_per_pkt: spent as f64 / packets.max(1) as f64,
        packets,
        tx_packets: packets,
        drops: 0,
        loss_pct: 0.0,
        seconds: secs,
        frame_size,
        frames_leaked: FRAMES - free.len(),
        rounds_mpps: Vec::new(),
        workers: 1,
        umem_copies: 0,
    }
}

fn print_table(results: &[BenchResult], plugin: Option<&str>) {
    println!(
        "{:<21} {:>8} {:>10} {:>12} {:>12} {:>8} {:>7} {:>8}",
        "scenario", "Mpps", "ns/pkt", "cycles/pkt", "packets", "loss %", "leaked", "spread"
    );
    for r in results {
        let spread = if r.rounds_mpps.len() > 1 { format!("{:.1}%", r.spread_pct()) } else { "-".into() };
        println!(
            "{:<21} {:>8.2} {:>10.1} {:>12.1} {:>12} {:>8.3} {:>7} {:>8}",
            r.scenario, r.mpps, r.ns_per_pkt, r.cycles_per_pkt, r.packets, r.loss_pct, r.frames_leaked, spread
        );
    }
    let get = |n: &str| results.iter().find(|r| r.scenario == n).map(|r| r.mpps);
    if let (Some(l2), Some(f)) = (get("l2"), get("floor")) {
        println!("l2 / floor                = {:.2}", l2 / f);
    }
    if let (Some(l2), Some(v)) = (get("l2"), get("l2-vlan")) {
        println!("l2-vlan / l2              = {:.2}", v / l2);
    }
    if let (Some(l2), Some(pt)) = (get("l2"), get("passthrough")) {
        println!("l2 / passthrough          = {:.2}", l2 / pt);
    }
    if let (Some(l2), Some(r)) = (get("l2"), results.iter().find(|r| r.scenario == "l2-two-umem")) {
        let copied = r.umem_copies as f64 / r.packets.max(1) as f64;
        let l2_ns = results.iter().find(|r| r.scenario == "l2").map_or(0.0, |r| r.ns_per_pkt);
        println!(
            "l2-two-umem / l2          = {:.2}   ({:.0}% of frames copied across: {:+.1} ns per copy)",
            r.mpps / l2,
            copied * 100.0,
            (r.ns_per_pkt - l2_ns) / copied.max(f64::MIN_POSITIVE)
        );
    }
    if let (Some(l2), Some(b)) = (get("l2"), get("l2-batch256")) {
        println!("batch 256 gain, l2        = {:+.1}%", (b / l2 - 1.0) * 100.0);
    }
    if let (Some(w), Some(b)) = (get("l2+plugin"), get("l2+plugin-batch256")) {
        println!("batch 256 gain, l2+plugin = {:+.1}%", (b / w - 1.0) * 100.0);
    }
    if let (Some(l2), Some(s)) = (get("l2"), get("l2-single-return")) {
        println!("bulk return gain          = {:+.1}%", (l2 / s - 1.0) * 100.0);
    }
    if let (Some(l2), Some(s)) = (get("l2"), get("l2-parse-all")) {
        println!("lazy parse gain           = {:+.1}%", (l2 / s - 1.0) * 100.0);
    }
    if let (Some(l2), Some(s)) = (get("l2"), get("l2-no-recycle")) {
        println!("recycling gain            = {:+.1}%", (l2 / s - 1.0) * 100.0);
    }
    let ns = |n: &str| results.iter().find(|r| r.scenario == n).map(|r| r.ns_per_pkt);
    if let (Some(l2), Some(w)) = (get("l2"), get("l2+plugin")) {
        println!(
            "l2+plugin / l2            = {:.2}   ({} adds {:.1} ns/pkt)",
            w / l2,
            plugin.unwrap_or("plugin"),
            ns("l2+plugin").unwrap_or(0.0) - ns("l2").unwrap_or(0.0)
        );
    }
    if let (Some(w), Some(sh)) = (get("l2+plugin"), get("l2+plugin+shadow")) {
        println!(
            "l2+plugin+shadow / l2+plugin = {:.2}   (the shadow chain adds {:.1} ns/pkt)",
            sh / w,
            ns("l2+plugin+shadow").unwrap_or(0.0) - ns("l2+plugin").unwrap_or(0.0)
        );
    }
    if let (Some(w), Some(n)) = (ns("l2+plugin"), ns("l2+native")) {
        println!("wasm - native             = {:.1} ns/pkt (the Wasm boundary and codegen)", w - n);
    }
    if let (Some(w), Some(u)) = (ns("l2+plugin"), ns("l2+plugin-no-deadline")) {
        println!("deadline checks           = {:.1} ns/pkt (the epoch checks in the plugin's code)", w - u);
    }
    for s in SCENARIOS {
        if results.iter().any(|r| r.scenario == s.name) {
            println!("  {:<21} {}", s.name, s.about);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(rounds: &[f64]) -> BenchResult {
        BenchResult {
            scenario: "l2".into(),
            mpps: 0.0,
            ns_per_pkt: 0.0,
            cycles_per_pkt: 0.0,
            packets: 0,
            tx_packets: 0,
            drops: 0,
            loss_pct: 0.0,
            seconds: 0.0,
            frame_size: 64,
            frames_leaked: 0,
            rounds_mpps: rounds.to_vec(),
            workers: 1,
            umem_copies: 0,
        }
    }

    #[test]
    fn the_help_names_every_scenario() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        let help = Cli::command().render_long_help().to_string().replace('\n', " ");
        for name in scenario_names() {
            assert!(help.contains(&format!(" {name}")), "`bench --help` does not name {name}");
        }
    }

    #[test]
    fn spread_is_range_over_median() {
        assert_eq!(result(&[20.0]).spread_pct(), 0.0);
        assert!((result(&[18.0, 20.0, 22.0]).spread_pct() - 20.0).abs() < 1e-9);
        assert!(result(&[10.0, 20.0, 21.0]).spread_pct() > SPREAD_LIMIT_PCT, "one slow round flags the run");
        assert!(result(&[20.0, 20.5, 20.9]).spread_pct() < SPREAD_LIMIT_PCT);
    }
}
