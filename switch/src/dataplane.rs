//! Builds the datapath from a [`Config`] and runs one pinned thread per worker.
//!
//! Queue ownership: queue `q` of a port is polled by worker `q % workers`; every worker also
//! has its own TX queue on every port (its first RX queue there, or a TX-only queue when the
//! port has fewer queues than there are workers).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wasmswitch_afxdp::{AfXdpPort, Overrides, PortSpec, QueueMonitor, RingSizes, UmemRegistration};
use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::pipeline::{ForwardMode, Pipeline, PipelineOptions, PortSlot};
use wasmswitch_core::pool::{check_no_leak, AllocMode, PoolCache, SharedPool};
use wasmswitch_core::stats::WorkerStats;
use wasmswitch_core::verdict::VerdictStage;
use wasmswitch_core::{PortId, PortQueue, Umem};
use wasmswitch_sim::{SimQueue, SimRings, SimStats, Source, TrafficGen, TrafficSpec};
use wasmswitch_tap::{HostConfig, HostPort, TapConfig, TapDevice, TapStats};

use crate::config::{AfxdpSection, AttachMode, BindMode, Config, DriverKind, Idle, Mode, PartialChecksums, SimSection};

/// A change a worker applies between two rounds.
pub enum Command {
    SetIngress(PortId, Option<Box<dyn VerdictStage>>),
    SetPortUp(PortId, bool),
    SetIdle(Idle),
}

/// A worker that has not finished a round for this long is reported by `/healthz`. The worst
/// round the config permits is 2 × the sum of every plugin's `deadline_us` (at most 2 × 100
/// ms, see `config::MAX_TOTAL_DEADLINE_US`), so a healthy worker stays well inside it.
pub const STALL_BOUND: Duration = Duration::from_secs(1);

/// The mailbox of one worker. The worker reads `generation` (one relaxed load) every round and
/// looks at the stop flag and the locked command list only when it moved, so a stop or a swap
/// is seen at the next round boundary at no measurable cost.
#[derive(Default)]
pub struct WorkerControl {
    generation: AtomicU64,
    stop: AtomicBool,
    commands: Mutex<Vec<Command>>,
    /// Rounds completed, written by the worker once per round (relaxed: a liveness signal).
    heartbeat: AtomicU64,
    /// Milliseconds since the dataplane started at which `heartbeat` was last seen to move
    /// (written by the housekeeping thread, which samples the heartbeats).
    progress_ms: AtomicU64,
}

impl WorkerControl {
    pub fn send(&self, cmd: Command) {
        self.commands.lock().unwrap_or_else(|e| e.into_inner()).push(cmd);
        // Release: a worker that sees the new generation sees the command pushed before it.
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Rounds the worker has completed.
    pub fn rounds(&self) -> u64 {
        self.heartbeat.load(Ordering::Relaxed)
    }
}

/// Static facts about a port, for metrics and the API.
#[derive(Debug, Clone)]
pub struct PortInfo {
    pub name: String,
    pub driver: &'static str,
    pub queues: usize,
    /// Mode label (e.g. the AF_XDP profile's choice), for metrics.
    pub mode: String,
    /// Per-queue NIC-side counters of sim ports.
    pub sim: Vec<Arc<SimStats>>,
    /// The rates of a sim port's rate-limited generators (one per queue), which a reload sets.
    pub sim_rates: Vec<Arc<AtomicU64>>,
    /// Per-queue driver and kernel counters of AF_XDP ports.
    pub afxdp: Vec<QueueMonitor>,
    /// Whether ingress completes TCP/UDP checksums left to offload (AF_XDP profile or override).
    pub complete_partial_checksums: bool,
    /// The kernel interface behind the port (AF_XDP), watched for disappearance.
    pub interface: Option<String>,
    /// Host port (TAP) counters.
    pub tap: Option<Arc<TapStats>>,
}

pub struct WorkerHandle {
    pub stats: Arc<WorkerStats>,
    pub control: Arc<WorkerControl>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The running datapath.
pub struct Dataplane {
    pub pool: Arc<SharedPool>,
    pub fdb: Arc<Fdb>,
    pub ports: Vec<PortInfo>,
    pub workers: Vec<WorkerHandle>,
    pub start: Instant,
    housekeeping: Mutex<Option<JoinHandle<()>>>,
    stop_housekeeping: Arc<AtomicBool>,
    afxdp_ports: Mutex<Vec<AfXdpPort>>,
    host: Mutex<Option<HostPort>>,
}

/// Frames past the MTU: Ethernet header plus two VLAN tags.
pub fn max_frame(mtu: u32) -> usize {
    mtu as usize + 14 + 8
}

/// The pipelines of every worker, before they get threads (the bench drives these directly).
pub struct Built {
    pub pool: Arc<SharedPool>,
    pub fdb: Arc<Fdb>,
    pub ports: Vec<PortInfo>,
    pub pipelines: Vec<Pipeline>,
    /// Open AF_XDP ports: dropping one detaches its XDP program, so they outlive the workers.
    pub afxdp_ports: Vec<AfXdpPort>,
    /// The host port's TAP and host workers; stopped after the datapath workers.
    pub host: Option<HostPort>,
}

/// The AF_XDP driver's view of a port section.
fn afxdp_spec(a: &AfxdpSection) -> PortSpec {
    let mut spec = PortSpec::new(a.interface.value.clone());
    spec.overrides = Overrides {
        attach: match a.mode {
            AttachMode::Auto => None,
            AttachMode::Native => Some(wasmswitch_afxdp::AttachMode::Native),
            AttachMode::Generic => Some(wasmswitch_afxdp::AttachMode::Generic),
        },
        bind: match a.bind {
            BindMode::Auto => None,
            BindMode::Copy => Some(wasmswitch_afxdp::BindMode::Copy),
            BindMode::Zerocopy => Some(wasmswitch_afxdp::BindMode::ZeroCopy),
        },
        queues: a.queues.as_ref().map(|q| q.value.clone()),
        rings: a.ring_size.as_ref().map(|r| RingSizes::all(r.value)),
        complete_partial_checksums: match a.partial_checksums {
            PartialChecksums::Auto => None,
            PartialChecksums::Complete => Some(true),
            PartialChecksums::Keep => Some(false),
        },
    };
    spec
}

/// Traffic spec of sim port `p` from its YAML.
fn traffic_spec(cfg: &Config, p: usize, sim: &SimSection, queue: usize) -> Option<TrafficSpec> {
    let t = sim.traffic.as_ref()?;
    let dst_ports: Vec<u16> = match &t.to {
        Some(to) => to.iter().filter_map(|n| cfg.port_index(&n.value)).map(|i| i as u16).collect(),
        None => (0..cfg.ports.len())
            .filter(|&i| i != p && cfg.ports[i].sim.as_ref().is_some_and(|s| s.value.traffic.is_some()))
            .map(|i| i as u16)
            .collect(),
    };
    Some(TrafficSpec {
        port: p as u16,
        src_macs: t.src_macs.value,
        dst_ports,
        frame_sizes: t.frame_sizes.value.clone(),
        broadcast: t.broadcast_percent.value / 100.0,
        flows: t.flows.value,
        vlan: t.vlan.as_ref().map(|v| v.value),
        rate_pps: t.rate_pps.as_ref().map(|r| r.value),
        templates: 1024,
        seed: 0x5eed ^ queue as u64,
    })
}

/// Opens an AF_XDP port. A queue still bound right after a previous owner died (the kernel
/// releases an AF_XDP socket of a killed process asynchronously) is retried for up to 3 s.
fn open_afxdp(spec: &PortSpec, reg: &UmemRegistration) -> Result<AfXdpPort, wasmswitch_afxdp::AfXdpError> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match AfXdpPort::open(spec, reg) {
            Err(wasmswitch_afxdp::AfXdpError::QueueBusy { .. }) if Instant::now() < deadline => {
                log::info!("{}: queue still bound by a closing socket, retrying", spec.iface);
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Builds pools, FDB, drivers and one pipeline per worker.
pub fn build(cfg: &Config, alloc: AllocMode, bulk_return: bool) -> Result<Built> {
    let workers = cfg.workers.len();
    let umem = Arc::new(
        Umem::new(cfg.pool.frames.value, cfg.pool.frame_size.value).context("cannot map the frame memory (UMEM)")?,
    );
    let pool = SharedPool::new(0, umem.clone(), cfg.pool.ring.value);
    let fdb = Arc::new(Fdb::new(cfg.fdb.capacity.value, cfg.fdb.aging_seconds.value));
    let mode = match cfg.switch.mode {
        Mode::L2 => ForwardMode::L2,
        Mode::Passthrough => ForwardMode::Passthrough,
        Mode::Cross => ForwardMode::Cross,
    };
    // slots[w][p] = the queues worker w owns on port p (first one carries its TX).
    let mut slots: Vec<Vec<Vec<Box<dyn PortQueue>>>> =
        (0..workers).map(|_| (0..cfg.ports.len()).map(|_| Vec::new()).collect()).collect();
    let mut infos = Vec::new();
    let mut afxdp_ports = Vec::new();
    let mut registration: Option<UmemRegistration> = None;
    for (p, port) in cfg.ports.iter().enumerate() {
        match port.driver.value {
            DriverKind::Sim => {
                let sim = port.sim.as_ref().map(|s| s.value.clone()).unwrap_or_default();
                let queues = sim.queues.value as usize;
                let rings = SimRings { fill: sim.ring_size.value, tx: sim.ring_size.value };
                let mut stats = Vec::new();
                let mut rates = Vec::new();
                for q in 0..queues {
                    let source = match traffic_spec(cfg, p, &sim, q) {
                        Some(spec) => Source::Gen(TrafficGen::new(&spec)),
                        None => Source::Idle,
                    };
                    let queue = SimQueue::new(umem.clone(), rings, source);
                    stats.push(queue.stats().clone());
                    rates.extend(queue.rate_handle());
                    slots[q % workers][p].push(Box::new(queue));
                }
                for worker_slots in slots.iter_mut().skip(queues) {
                    // Fewer queues than workers: a TX-only queue each (a sim NIC has plenty).
                    let queue = SimQueue::new(umem.clone(), rings, Source::Idle);
                    stats.push(queue.stats().clone());
                    worker_slots[p].push(Box::new(queue));
                }
                infos.push(PortInfo {
                    name: port.name.value.clone(),
                    driver: "sim",
                    queues,
                    mode: "sim".into(),
                    sim: stats,
                    sim_rates: rates,
                    afxdp: Vec::new(),
                    complete_partial_checksums: false,
                    interface: None,
                    tap: None,
                });
            }
            DriverKind::Afxdp => {
                let a = &port.afxdp.as_ref().expect("checked by Config::check").value;
                let reg = registration.get_or_insert_with(|| UmemRegistration::new(umem.clone()));
                let mut xp = open_afxdp(&afxdp_spec(a), reg).with_context(|| format!("port `{}`", port.name.value))?;
                let d = xp.decision().clone();
                log::info!("port `{}` on {}: {d}", port.name.value, a.interface.value);
                let mut queues: Vec<_> = xp.take_queues().into_iter().map(|(_, q)| q).collect();
                let nq = queues.len();
                if nq == 0 {
                    bail!("port `{}`: interface {} has no queue to open", port.name.value, a.interface.value);
                }
                // Workers without a queue of their own share one's TX side (locked per burst).
                let shared: Vec<_> = (nq..workers).map(|w| queues[w % nq].share_tx()).collect();
                for (i, q) in queues.into_iter().enumerate() {
                    slots[i % workers][p].push(Box::new(q));
                }
                for (k, q) in shared.into_iter().enumerate() {
                    slots[nq + k][p].push(Box::new(q));
                }
                infos.push(PortInfo {
                    name: port.name.value.clone(),
                    driver: "afxdp",
                    queues: nq,
                    mode: format!("{}/{}", d.attach, d.bind),
                    complete_partial_checksums: d.complete_partial_checksums,
                    sim: Vec::new(),
                    sim_rates: Vec::new(),
                    afxdp: xp.queue_stats(),
                    interface: Some(a.interface.value.clone()),
                    tap: None,
                });
                afxdp_ports.push(xp);
            }
        }
    }
    let mut host = None;
    let mut max_frames: Vec<usize> = cfg.ports.iter().map(|p| max_frame(p.mtu.value)).collect();
    if let Some(h) = &cfg.host {
        let tap = TapDevice::create(&TapConfig {
            name: h.tap.value.clone(),
            mac: wasmswitch_tap::parse_mac(&h.mac.value)?,
            mtu: h.mtu.value,
            queues: h.workers.value,
        })
        .with_context(|| format!("host port `{}`", h.name.value))?;
        let hc = HostConfig {
            datapath_workers: workers,
            host_workers: h.workers.value,
            bulk: h.bulk.value,
            ring_size: h.ring_size.value,
            ..HostConfig::default()
        };
        let (hp, queues) = HostPort::start(tap, &pool, &hc).with_context(|| format!("host port `{}`", h.name.value))?;
        log::info!(
            "host port `{}` on TAP {} ({} host worker(s), bulk {})",
            h.name.value,
            h.tap.value,
            h.workers.value,
            h.bulk.value
        );
        for (w, q) in queues.into_iter().enumerate() {
            slots[w].push(vec![Box::new(q)]);
        }
        infos.push(PortInfo {
            name: h.name.value.clone(),
            driver: "tap",
            queues: h.workers.value,
            mode: "io_uring".into(),
            sim: Vec::new(),
            sim_rates: Vec::new(),
            afxdp: Vec::new(),
            complete_partial_checksums: false,
            interface: None,
            tap: Some(hp.stats().clone()),
        });
        max_frames.push(max_frame(h.mtu.value));
        host = Some(hp);
    }
    let host_port = cfg.host.as_ref().map(|_| cfg.ports.len() as PortId);
    let mut pipelines = Vec::new();
    for (w, worker_slots) in slots.into_iter().enumerate() {
        let cache = PoolCache::new(pool.clone(), cfg.pool.cache.value, alloc);
        let stats = Arc::new(WorkerStats::new(w, infos.len(), cache.stats().clone()));
        let ports = worker_slots
            .into_iter()
            .enumerate()
            .map(|(p, queues)| PortSlot {
                queue_index: w as u16,
                queues,
                max_frame: max_frames[p],
                ingress: None,
                up: true,
                complete_partial_checksums: infos[p].complete_partial_checksums,
            })
            .collect();
        let opts = PipelineOptions { mode, bulk_return, host_port };
        pipelines.push(Pipeline::new(ports, cache, fdb.clone(), stats, opts));
    }
    Ok(Built { pool, fdb, ports: infos, pipelines, afxdp_ports, host })
}

pub use wasmswitch_afxdp::sys::pin_to_cpu;

fn worker_loop(mut pipe: Pipeline, control: Arc<WorkerControl>, start: Instant, mut idle: Idle) {
    let mut rounds: u64 = 0;
    let mut seen = 0u64;
    loop {
        let n = pipe.poll();
        rounds += 1;
        control.heartbeat.store(rounds, Ordering::Relaxed);
        if rounds.is_multiple_of(64) {
            // The FDB clock has one-second ticks: reading the time every 64 rounds is plenty.
            pipe.set_now(start.elapsed().as_secs() as u32);
        }
        let generation = control.generation.load(Ordering::Relaxed);
        if generation != seen {
            seen = generation;
            // Pairs with the Release increment in `send`/`request_stop`.
            fence(Ordering::Acquire);
            let cmds = std::mem::take(&mut *control.commands.lock().unwrap_or_else(|e| e.into_inner()));
            for cmd in cmds {
                match cmd {
                    Command::SetIngress(p, stage) => drop(pipe.set_ingress(p, stage)),
                    Command::SetPortUp(p, up) => pipe.set_port_up(p, up),
                    Command::SetIdle(i) => idle = i,
                }
            }
            if control.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        if n == 0 {
            match idle {
                Idle::Poll => std::hint::spin_loop(),
                Idle::Sleep => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }
    // Drain: final completions, and every frame the drivers hold goes back to the pool.
    pipe.shutdown();
}

/// True when the kernel still has an interface called `name`.
fn interface_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// Ages the FDB and watches AF_XDP interfaces: one that vanishes is reported and its port
/// stopped on every worker (its FDB entries forgotten); the other ports keep forwarding.
fn housekeeping_loop(
    fdb: Arc<Fdb>,
    controls: Vec<Arc<WorkerControl>>,
    mut watched: Vec<(PortId, String)>,
    start: Instant,
    stop: Arc<AtomicBool>,
) {
    let mut last: Vec<u64> = controls.iter().map(|c| c.rounds()).collect();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        let now_ms = start.elapsed().as_millis() as u64;
        for (c, last) in controls.iter().zip(&mut last) {
            let r = c.rounds();
            if r != *last {
                *last = r;
                c.progress_ms.store(now_ms, Ordering::Relaxed);
            }
        }
        fdb.age(start.elapsed().as_secs() as u32);
        watched.retain(|(p, name)| {
            if interface_exists(name) {
                return true;
            }
            log::error!("interface {name} disappeared: port {p} stopped, the other ports keep forwarding");
            for c in &controls {
                c.send(Command::SetPortUp(*p, false));
            }
            fdb.flush_port(*p);
            false
        });
    }
}

impl Dataplane {
    /// Builds the datapath and starts its worker threads.
    pub fn start(cfg: &Config) -> Result<Dataplane> {
        Self::start_with_plugins(cfg, std::path::Path::new("."), None)
    }

    /// Starts the datapath with the ports' plugin chains (compiled here, before any traffic)
    /// installed on every worker; their counters go to `plugin_metrics`.
    pub fn start_with_plugins(
        cfg: &Config,
        file: &std::path::Path,
        plugin_metrics: Option<&crate::plugins::PluginMetrics>,
    ) -> Result<Dataplane> {
        let mut built = build(cfg, AllocMode::Recycling, true)?;
        if cfg.ports.iter().any(|p| !p.plugins.is_empty()) {
            let engine = crate::plugins::engine()?;
            let chains = crate::plugins::compile(&engine, cfg, file, built.ports.len())?;
            let names: Vec<String> = built.ports.iter().map(|p| p.name.clone()).collect();
            let mut table = Vec::new();
            for (w, pipe) in built.pipelines.iter_mut().enumerate() {
                for (p, stage) in chains.instantiate(w, &names, &mut table)?.into_iter().enumerate() {
                    if stage.is_some() {
                        pipe.set_ingress(p as PortId, stage);
                    }
                }
            }
            if let Some(m) = plugin_metrics {
                *m.table.lock().unwrap_or_else(|e| e.into_inner()) = table;
            }
            log::info!(
                "plugins loaded: {}",
                cfg.ports
                    .iter()
                    .flat_map(|p| p.plugins.iter().map(|x| x.name.value.clone()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let built = built;
        let start = Instant::now();
        let mut workers = Vec::new();
        for (w, pipe) in built.pipelines.into_iter().enumerate() {
            let control = Arc::new(WorkerControl::default());
            let stats = pipe.stats().clone();
            let cpu = cfg.workers[w].cpu.as_ref().map(|c| c.value);
            let idle = cfg.workers[w].idle.value;
            let ctl = control.clone();
            let thread = std::thread::Builder::new()
                .name(format!("worker-{w}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        if let Err(e) = pin_to_cpu(cpu) {
                            log::warn!("worker {w}: cannot pin to cpu {cpu}: {e}");
                        }
                    }
                    worker_loop(pipe, ctl, start, idle)
                })
                .context("cannot start a worker thread")?;
            workers.push(WorkerHandle { stats, control, thread: Mutex::new(Some(thread)) });
        }
        let stop_housekeeping = Arc::new(AtomicBool::new(false));
        let housekeeping = {
            let fdb = built.fdb.clone();
            let stop = stop_housekeeping.clone();
            let controls: Vec<_> = workers.iter().map(|w: &WorkerHandle| w.control.clone()).collect();
            let watched: Vec<(PortId, String)> = built
                .ports
                .iter()
                .enumerate()
                .filter_map(|(p, i)| i.interface.clone().map(|n| (p as PortId, n)))
                .collect();
            std::thread::Builder::new()
                .name("housekeeping".into())
                .spawn(move || housekeeping_loop(fdb, controls, watched, start, stop))
                .context("cannot start the housekeeping thread")?
        };
        Ok(Dataplane {
            afxdp_ports: Mutex::new(built.afxdp_ports),
            host: Mutex::new(built.host),
            pool: built.pool,
            fdb: built.fdb,
            ports: built.ports,
            workers,
            start,
            housekeeping: Mutex::new(Some(housekeeping)),
            stop_housekeeping,
        })
    }

    /// Sends `cmd_for(worker)` to every worker.
    pub fn broadcast(&self, mut cmd_for: impl FnMut(usize) -> Command) {
        for (w, h) in self.workers.iter().enumerate() {
            h.control.send(cmd_for(w));
        }
    }

    /// True while every worker thread runs and has completed a round recently.
    pub fn healthy(&self) -> bool {
        self.health().is_ok()
    }

    /// Ok, or what is wrong with which worker: its thread ended, or it has not completed a
    /// round within [`STALL_BOUND`].
    pub fn health(&self) -> Result<(), String> {
        let now_ms = self.start.elapsed().as_millis() as u64;
        let mut bad = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            let finished = w.thread.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_none_or(|t| t.is_finished());
            let since = now_ms.saturating_sub(w.control.progress_ms.load(Ordering::Relaxed));
            if finished {
                bad.push(format!("worker {i} has stopped"));
            } else if since > STALL_BOUND.as_millis() as u64 {
                bad.push(format!("worker {i} has not completed a round for {since} ms"));
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }

    /// Stops the workers, waits for them to drain, and checks that every frame came back.
    pub fn stop(&mut self) -> Result<()> {
        self.stop_shared()
    }

    /// [`Dataplane::stop`] through a shared reference (the daemon's control thread may still
    /// hold one while a reload compiles). Idempotent: a second call finds nothing to stop.
    pub fn stop_shared(&self) -> Result<()> {
        for w in &self.workers {
            w.control.request_stop();
        }
        let mut panicked = 0;
        for w in &self.workers {
            let t = w.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(t) = t {
                if t.join().is_err() {
                    panicked += 1;
                }
            }
        }
        self.stop_housekeeping.store(true, Ordering::Release);
        let h = self.housekeeping.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
        // Workers closed their sockets; dropping the ports detaches the XDP programs.
        self.afxdp_ports.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // Host workers stop after the datapath workers and drain the rings between them; the
        // TAP goes away with its last descriptor.
        let host = self.host.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut h) = host {
            h.stop();
        }
        if panicked > 0 {
            bail!("{panicked} worker(s) panicked");
        }
        check_no_leak(&self.pool, &[]).map_err(|e| anyhow::anyhow!("frame leak at shutdown: {e}"))?;
        Ok(())
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        if self.workers.iter_mut().any(|w| w.thread.get_mut().unwrap_or_else(|e| e.into_inner()).is_some()) {
            let _ = self.stop();
        }
    }
}
