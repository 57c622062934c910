//! Builds the datapath from a [`Config`] and runs one pinned thread per worker.
//!
//! Queue ownership: queue `q` of a port is polled by worker `q % workers`; every worker also
//! has its own TX queue on every port (its first RX queue there, or a TX-only queue when the
//! port has fewer queues than there are workers).
//!
//! Ports have stable ids: the configured ports get 0..n at start and the host port n; a port a
//! reload adds takes the lowest free id, and a removed port's id becomes free once every
//! worker has let go of it.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wasmswitch_afxdp::QueueMonitor;
use wasmswitch_core::fdb::{CurrentFdb, Fdb, Flush};
use wasmswitch_core::pipeline::{Pipeline, PipelineOptions, PortSlot};
use wasmswitch_core::pool::{check_no_leak, AllocMode, PoolCache, PoolId, PoolStats, SharedPool};
use wasmswitch_core::stats::WorkerStats;
use wasmswitch_core::verdict::VerdictStage;
use wasmswitch_core::vlan::{PortL2, Vid};
use wasmswitch_core::wire::build::{tcp_flags, L4};
use wasmswitch_core::{PortId, Umem};
use wasmswitch_sim::TrafficSpec;

use crate::config::{Config, DriverKind, Idle, PortSection, TrafficProto};
use crate::drivers::afxdp::AfxdpInfo;
use crate::drivers::{self, OpenCtx, OpenedPort, PortHandle, PortInfo, PortTable, UmemGroup, MAX_PORT_IDS};
use crate::error_text::ErrorText;
use crate::plugins::{ChainStage, Stages};

/// A change a worker applies between two rounds.
pub enum Command {
    /// A port's new ingress stage (its plugin chains) or none; it takes over what it wants of
    /// the old stage, which is retired.
    SetIngress(PortId, Option<Box<dyn VerdictStage>>),
    /// A port up, or down (its interface gone or its link down): no RX or TX on it while down.
    SetPortUp(PortId, bool),
    /// `workers[].idle`: what the worker does after an empty round.
    SetIdle(Idle),
    /// A port added (`fresh`: its counters start at zero) or replaced, with its ingress stage
    /// already in the slot, so no frame of it is ever forwarded without its plugins.
    AttachPort {
        /// The port's id.
        port: PortId,
        /// The port as this worker holds it: its queues, limits and ingress stage.
        slot: PortSlot,
        /// The port's counters on this worker start from zero (a new port, not a replaced one).
        fresh: bool,
    },
    /// A port removed: its frames go back to the pool and the worker drops its queues.
    DetachPort(PortId),
    /// A port's longest frame taken in (longer: dropped as `oversize`) and longest frame sent,
    /// in bytes.
    SetMaxFrame(PortId, usize, usize),
    /// `switch.batch`: most packets per RX burst.
    SetBatch(usize),
    /// A port's VLANs, storm limits and mirrors.
    SetL2(PortId, PortL2),
    /// A resized FDB (the entries of the old one copied in).
    SetFdb(Arc<Fdb>),
    /// Pin the worker to this CPU, or let it run anywhere.
    Pin(Option<usize>),
    /// New queues for a port whose interface came back (its plugins and counters stay).
    ReplaceQueues(PortId, Vec<Box<dyn wasmswitch_core::PortQueue>>),
    /// Promote or discard a port's shadow chain.
    Shadow(PortId, ShadowOp),
}

/// What to do with a port's shadow chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShadowOp {
    /// It becomes the live chain; the live one goes.
    Promote,
    /// It goes; the live chain stays.
    Discard,
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
    /// The last generation whose commands the worker has applied.
    applied: AtomicU64,
    /// What the worker's commands replaced (slots, queues, plugin stages), dropped by the
    /// thread that sent them: closing sockets and instances is slow, and a worker must not
    /// stall its other ports on it.
    retired: Mutex<Vec<Box<dyn Send>>>,
}

impl WorkerControl {
    /// Queues `cmd`, applied between two rounds (see [`WorkerControl::send_all`]).
    pub fn send(&self, cmd: Command) {
        self.send_all(vec![cmd]);
    }

    /// Queues `cmds` to be applied together, in order, between the same two rounds; returns
    /// the generation to wait for with [`WorkerControl::wait_applied`].
    pub fn send_all(&self, cmds: Vec<Command>) -> u64 {
        let mut list = self.commands.lock().unwrap_or_else(|e| e.into_inner());
        list.extend(cmds);
        // Release: a worker that sees the new generation sees the commands pushed before it.
        self.generation.fetch_add(1, Ordering::Release) + 1
    }

    /// Waits until the worker has applied generation `g`, at most `limit`; false on timeout.
    pub fn wait_applied(&self, g: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.applied.load(Ordering::Acquire) < g {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Hands over what the worker's commands replaced, to be dropped by the caller.
    pub fn take_retired(&self) -> Vec<Box<dyn Send>> {
        std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn retire<T: Send + 'static>(&self, x: Option<T>) {
        if let Some(x) = x {
            self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(x));
        }
    }

    /// Rounds the worker has completed.
    pub fn rounds(&self) -> u64 {
        self.heartbeat.load(Ordering::Relaxed)
    }
}

/// A running worker thread, with what the metrics and reloads reach it by.
pub struct WorkerHandle {
    /// The worker's counters (single writer: the worker), read by the metrics.
    pub stats: Arc<WorkerStats>,
    /// Its mailbox: commands, stop, heartbeat.
    pub control: Arc<WorkerControl>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WorkerHandle {
    /// The CPUs the kernel lets this worker's thread run on (`None` once it has been joined).
    /// By handle, not by thread name: several dataplanes in one process name their workers alike.
    pub fn cpus_allowed(&self) -> Option<std::io::Result<Vec<usize>>> {
        use std::os::unix::thread::JoinHandleExt;
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the handle is held unjoined under the lock, so its pthread_t stays valid.
        thread.as_ref().map(|t| unsafe { wasmswitch_sys::cpus_of(t.as_pthread_t()) })
    }
}

/// The running datapath.
pub struct Dataplane {
    /// The UMEM groups, by pool id.
    pub groups: Arc<[UmemGroup]>,
    /// The MAC table the workers share (a reload may replace it by a resized one).
    pub fdb: Arc<CurrentFdb>,
    /// The running ports, for the metrics and the API.
    pub ports: PortTable,
    /// The worker threads, by index.
    pub workers: Vec<WorkerHandle>,
    /// When the datapath started: the FDB's clock and the uptime metric count from it.
    pub start: Instant,
    res: Arc<Resources>,
    housekeeping: Mutex<Option<JoinHandle<()>>>,
    stop_housekeeping: Arc<AtomicBool>,
    /// True once the datapath is stopping. Read-held by a reload from the first port it opens
    /// to its last change of the datapath ([`Dataplane::begin_change`]), write-held by
    /// [`Dataplane::stop_shared`] to set it: a stop waits for the ports a reload opened to be
    /// attached (or dropped, their frames back) instead of counting their frames as leaked, and
    /// a reload that gets there after the stop is refused.
    stopped: std::sync::RwLock<bool>,
}

/// What opening and closing ports needs, shared by reloads and the housekeeping thread (which
/// re-attaches a port whose interface came back).
struct Resources {
    groups: Arc<[UmemGroup]>,
    workers: usize,
    /// What closes each running port, by id; taken out when the port goes.
    handles: Mutex<Vec<Option<Box<dyn PortHandle>>>>,
    /// Handles of ports that a worker was late to let go of; closed at stop.
    retired: Mutex<Vec<Box<dyn PortHandle>>>,
    /// Held while ports change (a reload's, or a re-attach), so the two never interleave.
    changing: Mutex<()>,
    /// The config the switch runs, replaced by each reload that applies: a re-attach checks
    /// the pool against it as `run` and `check` did.
    config: Mutex<Arc<Config>>,
}

impl Resources {
    fn config(&self) -> Arc<Config> {
        self.config.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether port `id` has a handle (its interface's sockets and XDP link are open).
    fn has_handle(&self, id: PortId) -> bool {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.get(id.index()).is_some_and(Option::is_some)
    }

    /// Puts `handle` in as port `id`'s, closing the one it replaces (every worker has let go of
    /// it: `late` is false) or keeping that for stop.
    fn replace_handle(&self, id: PortId, handle: Option<Box<dyn PortHandle>>, late: bool) {
        let old = {
            let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
            let i = id.index();
            if handles.len() <= i {
                handles.resize_with(i + 1, || None);
            }
            std::mem::replace(&mut handles[i], handle)
        };
        match old {
            Some(h) if late => self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(h),
            Some(h) => h.close(),
            None => {}
        }
    }
}

/// The pipelines of every worker, before they get threads (the bench drives these directly).
pub struct Built {
    /// By pool id.
    pub groups: Vec<UmemGroup>,
    /// The MAC table the pipelines share.
    pub fdb: Arc<Fdb>,
    /// The opened ports.
    pub ports: PortTable,
    /// One pipeline per worker.
    pub pipelines: Vec<Pipeline>,
    /// By port id. Dropping them detaches XDP programs and stops host workers, so they outlive
    /// the workers.
    pub handles: Vec<Option<Box<dyn PortHandle>>>,
}

/// The UMEM group configured port `port` belongs in: its `umem:`, or else the bind mode its
/// driver profile and overrides choose for an AF_XDP port (the kernel lets only sockets of one
/// bind mode share a UMEM), `copy` for a sim port.
pub fn umem_group_of(port: &PortSection) -> String {
    if let Some(u) = &port.umem {
        return u.value.clone();
    }
    match (&port.driver.value, &port.afxdp) {
        (DriverKind::Afxdp, Some(a)) => a.value.umem_group().to_string(),
        _ => wasmswitch_afxdp::BindMode::Copy.config_value().to_string(),
    }
}

/// The group called `name` among `groups`, or an error that says a running switch cannot add
/// one.
fn find_group<'g>(groups: &'g [UmemGroup], port: &str, name: &str) -> Result<&'g UmemGroup> {
    groups.iter().find(|g| g.name == name).with_context(|| {
        let have: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        format!(
            "port `{port}` belongs in UMEM group `{name}`, which the running switch does not have (it has {}): a new UMEM group needs a restart",
            have.join(", ")
        )
    })
}

/// Generated traffic of the sim port at `index` in `cfg`, its destinations resolved to ids.
fn traffic_spec(cfg: &Config, index: usize, id_of: &dyn Fn(&str) -> Option<PortId>) -> Option<TrafficSpec> {
    let sim = &cfg.ports[index].sim.as_ref()?.value;
    let t = sim.traffic.as_ref()?;
    let dst_ports: Vec<u16> = match &t.to {
        Some(to) => to.iter().filter_map(|n| Some(id_of(&n.value)?.0)).collect(),
        None => cfg
            .ports
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != index && p.sim.as_ref().is_some_and(|s| s.value.traffic.is_some()))
            .filter_map(|(_, p)| Some(id_of(&p.name.value)?.0))
            .collect(),
    };
    Some(TrafficSpec {
        port: id_of(&cfg.ports[index].name.value).unwrap_or(PortId::from_index(index)).0,
        src_macs: t.src_macs.value,
        dst_ports,
        frame_sizes: t.frame_sizes.value.clone(),
        broadcast: t.broadcast_percent.value / 100.0,
        flows: t.flows.value,
        vlans: t
            .vlan
            .as_ref()
            .and_then(|v| v.value.expand("vlan").ok())
            .unwrap_or_default()
            .iter()
            .map(|v| v.get())
            .collect(),
        ipv6: t.ip.value == 6,
        l4: match t.proto {
            TrafficProto::Udp => L4::Udp,
            TrafficProto::Tcp => L4::Tcp(t.tcp_flag_bits().unwrap_or(tcp_flags::SYN)),
        },
        dst_port: t.dst_port.value,
        rate_pps: t.rate_pps.as_ref().map(|r| r.value),
        templates: 1024,
        seed: 0x5eed,
    })
}

/// Opens configured port `index` of `cfg` through its driver (`id_of` resolves the names
/// its sim traffic is addressed to).
fn open_port(
    ctx: &mut OpenCtx<'_>,
    cfg: &Config,
    index: usize,
    id_of: &dyn Fn(&str) -> Option<PortId>,
) -> Result<OpenedPort> {
    let port: &PortSection = &cfg.ports[index];
    let name = &port.name.value;
    let mut opened = match port.driver.value {
        DriverKind::Sim => {
            let sim = port.sim.as_ref().map(|s| s.value.clone()).unwrap_or_default();
            drivers::sim::open(ctx, name, &sim, port.mtu.value, traffic_spec(cfg, index, id_of))
        }
        DriverKind::Afxdp => {
            let a = &port.afxdp.as_ref().context("an afxdp port without an `afxdp:` section")?.value;
            drivers::afxdp::open(ctx, name, a, port.mtu.value)?
        }
    };
    opened.l2 = cfg.port_l2(name, storm_share(&opened.info, cfg), id_of);
    Ok(opened)
}

/// Opens configured port `index` of `cfg` in its UMEM group among `groups`.
fn open_in_group(
    groups: &[UmemGroup],
    workers: usize,
    cfg: &Config,
    index: usize,
    id_of: &dyn Fn(&str) -> Option<PortId>,
) -> Result<OpenedPort> {
    let port = &cfg.ports[index];
    let group = find_group(groups, &port.name.value, &umem_group_of(port))?;
    let mut opened = group.open(workers, |ctx| open_port(ctx, cfg, index, id_of))?;
    opened.info.umem = group.name.clone();
    Ok(opened)
}

/// Among how many workers a port's storm limits are divided: those that poll one of its queues.
pub fn storm_share(info: &PortInfo, cfg: &Config) -> u32 {
    info.queues.min(cfg.workers.len()).max(1) as u32
}

/// Worker `w`'s slot of an opened port, with `ingress` as its stage.
fn slot(port: &mut OpenedPort, w: usize, ingress: Option<Box<dyn VerdictStage>>) -> PortSlot {
    PortSlot::new(std::mem::take(&mut port.queues[w]), port.max_frame)
        .with_tx_max(port.tx_max)
        .with_queue_index(w as u16)
        .with_ingress(ingress)
        .with_checksum_completion(port.info.complete_partial_checksums)
        .with_l2(port.l2.clone())
        .with_pool(port.pool)
}

/// Builds pools, FDB, drivers and one pipeline per worker. Configured port `i` gets id `i`,
/// the host port the id after them.
pub fn build(cfg: &Config) -> Result<Built> {
    let workers = cfg.workers.len();
    // One UMEM per group, in the order the ports name them (so the first port's is pool 0).
    let mut names: Vec<String> = Vec::new();
    for port in &cfg.ports {
        let name = umem_group_of(port);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        names.push(wasmswitch_afxdp::BindMode::Copy.config_value().into());
    }
    let mut groups = Vec::new();
    for (id, name) in names.into_iter().enumerate() {
        let umem = Umem::new(cfg.pool.frames.value, cfg.pool.frame_size.value)
            .with_context(|| format!("cannot map the frame memory (UMEM) of group `{name}`"))?;
        let pool = SharedPool::new(PoolId(id as u16), Arc::new(umem), cfg.pool.ring.value);
        groups.push(UmemGroup::new(name, pool));
    }
    if groups.len() > 1 {
        let list: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        log::info!(
            "{} UMEM groups ({}), {} frames each: frames crossing groups are copied",
            groups.len(),
            list.join(", "),
            cfg.pool.frames.value
        );
    }
    let fdb = Arc::new(Fdb::new(cfg.fdb.capacity.value, cfg.fdb.aging_seconds.value));
    for (id, p) in cfg.ports.iter().enumerate() {
        fdb.set_max_learned(PortId::from_index(id), cfg.max_macs(&p.name.value));
    }
    for e in &cfg.fdb.statics {
        let port = PortId::from_index(cfg.port_index(&e.port.value).context("a static FDB entry on no port")?);
        let vlan = Vid::new(e.vlan.value).context("a static FDB entry outside 1-4094")?;
        fdb.add_static(vlan, e.mac.value.0, port)
            .map_err(|why| anyhow::anyhow!("fdb.static {} in VLAN {}: {why}", e.mac.value.0, e.vlan.value))?;
    }
    let mode = cfg.switch.mode;
    let id_of = |name: &str| cfg.port_index(name).map(PortId::from_index);
    let mut opened = Vec::new();
    for index in 0..cfg.ports.len() {
        opened.push(open_in_group(&groups, workers, cfg, index, &id_of)?);
    }
    if let Some(h) = &cfg.host {
        // The host port joins the first group: the TAP reads into and writes from any memory.
        let mut host = groups[0].open(workers, |ctx| drivers::host::open(ctx, h))?;
        host.info.umem = groups[0].name.clone();
        host.l2 = cfg.port_l2(&h.name.value, storm_share(&host.info, cfg), &id_of);
        opened.push(host);
    }
    let host_port = cfg.host.as_ref().map(|_| PortId::from_index(cfg.ports.len()));
    let mut pipelines = Vec::new();
    for w in 0..workers {
        // One cache per group, all counting into the worker's one set of pool counters.
        let pool_stats = Arc::new(PoolStats::default());
        let caches = groups
            .iter()
            .map(|g| {
                PoolCache::with_stats(g.pool.clone(), cfg.pool.cache.value, AllocMode::Recycling, pool_stats.clone())
            })
            .collect();
        let stats = Arc::new(WorkerStats::new(w, MAX_PORT_IDS, pool_stats));
        let ports = opened.iter_mut().map(|o| slot(o, w, None)).collect();
        let host_mac = cfg.host.as_ref().map(|h| h.mac.value.0);
        let opts = PipelineOptions {
            mode,
            bulk_return: true,
            host_port,
            host_mac,
            parse_all: false,
            batch: cfg.switch.batch.value,
        };
        pipelines.push(Pipeline::with_pools(ports, caches, fdb.clone(), stats, opts));
    }
    let table = PortTable::default();
    let mut handles = Vec::new();
    for (id, o) in opened.into_iter().enumerate() {
        table.set(PortId::from_index(id), Some(Arc::new(o.info)));
        handles.push(o.handle);
    }
    Ok(Built { groups, fdb, ports: table, pipelines, handles })
}
pub use wasmswitch_sys::pin_to_cpu;

/// Pins the calling worker to `cpu`, or unpins it; a failure is logged (the worker runs on).
fn pin(cpu: Option<usize>) {
    let r = match cpu {
        Some(c) => pin_to_cpu(c),
        None => wasmswitch_sys::unpin(),
    };
    if let Err(e) = r {
        log::warn!("{}: cannot pin to cpu {cpu:?}: {e}", std::thread::current().name().unwrap_or("worker"));
    }
}

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
                    Command::SetIngress(p, stage) => control.retire(pipe.set_ingress(p, stage)),
                    Command::SetPortUp(p, up) => pipe.set_port_up(p, up),
                    Command::SetIdle(i) => idle = i,
                    Command::AttachPort { port, slot, fresh } => control.retire(pipe.attach_port(port, slot, fresh)),
                    Command::DetachPort(p) => control.retire(pipe.detach_port(p)),
                    Command::SetMaxFrame(p, max, tx_max) => pipe.set_max_frame(p, max, tx_max),
                    Command::SetBatch(n) => pipe.set_batch(n),
                    Command::SetL2(p, l2) => pipe.set_l2(p, l2),
                    Command::SetFdb(fdb) => pipe.set_fdb(fdb),
                    Command::Pin(cpu) => pin(cpu),
                    Command::ReplaceQueues(p, queues) => control.retire(Some(pipe.replace_queues(p, queues))),
                    Command::Shadow(p, op) => {
                        let chains = pipe.ingress_mut(p).and_then(|s| s.as_any_mut()?.downcast_mut::<ChainStage>());
                        if let Some(c) = chains {
                            match op {
                                ShadowOp::Promote => control.retire(c.promote()),
                                ShadowOp::Discard => control.retire(c.discard()),
                            }
                        }
                    }
                }
            }
            control.applied.store(generation, Ordering::Release);
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

/// Whether the link of interface `name` is down: its operstate is `down` or `lowerlayerdown`
/// (a veth whose peer is down). `unknown` (drivers that do not report it) counts as up, and so
/// does an unreadable file (the interface watch handles a vanished one).
fn link_down(name: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{name}/operstate"))
        .is_ok_and(|s| matches!(s.trim(), "down" | "lowerlayerdown"))
}

/// Ages the FDB and watches AF_XDP interfaces: one that vanishes is reported and its port
/// stopped on every worker (its FDB entries forgotten); the other ports keep forwarding.
/// An interface that comes back is re-attached: the port is opened on it again and every worker
/// swaps in the new queues, keeping the port's plugins and counters.
fn housekeeping_loop(
    fdb: Arc<CurrentFdb>,
    controls: Vec<Arc<WorkerControl>>,
    ports: PortTable,
    res: Arc<Resources>,
    start: Instant,
    stop: Arc<AtomicBool>,
) {
    let mut last: Vec<u64> = controls.iter().map(|c| c.rounds()).collect();
    let mut watch = Watch::default();
    // Ports to flush once no reload holds the table.
    let mut flush_later: std::collections::BTreeSet<PortId> = std::collections::BTreeSet::new();
    let mut tick: u64 = 0;
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
        // Not while a reload changes the table (its `aged` would be lost in a copy): next time.
        // (A reload that panicked holding it poisoned it: that is no reload holding it.)
        let held = fdb.edits().try_read();
        if !matches!(held, Err(std::sync::TryLockError::WouldBlock)) {
            fdb.get().age(start.elapsed().as_secs() as u32);
            for p in std::mem::take(&mut flush_later) {
                fdb.get().flush_port(p);
            }
        }
        drop(held);
        // A port's flush waits likewise: on a table a resize had already copied it would be
        // lost, and the copied entries would send frames to the port that went until they aged.
        let mut flush_port = |p: PortId| {
            let held = fdb.edits().try_read();
            if matches!(held, Err(std::sync::TryLockError::WouldBlock)) {
                flush_later.insert(p);
            } else {
                fdb.get().flush_port(p);
            }
        };
        tick += 1;
        for (p, info) in ports.snapshot() {
            if let Some(name) = &info.interface {
                watch.look(
                    &Look { res: &res, controls: &controls, ports: &ports, tick },
                    p,
                    &info,
                    name,
                    &mut flush_port,
                );
            }
        }
    }
}

/// What the interface watch needs of the switch for one look.
struct Look<'a> {
    res: &'a Resources,
    controls: &'a [Arc<WorkerControl>],
    ports: &'a PortTable,
    /// Looks so far (one every 100 ms).
    tick: u64,
}

/// What the interface watch keeps between its looks.
#[derive(Default)]
struct Watch {
    /// Failed re-attach attempts per port (retried every second, logged every 30th).
    failures: std::collections::HashMap<PortId, u64>,
    /// What each gone port's queues had counted, taken while their sockets were still open.
    counted: std::collections::HashMap<PortId, Vec<QueueMonitor>>,
}

impl Watch {
    /// One look at port `p`'s interface `name`: gone, back, its link down or up.
    fn look(&mut self, l: &Look<'_>, p: PortId, info: &Arc<PortInfo>, name: &str, flush_port: &mut dyn FnMut(PortId)) {
        let (res, controls, ports, tick) = (l.res, l.controls, l.ports, l.tick);
        let gone = info.gone.load(Ordering::Relaxed);
        // 0: there is none now.
        let now = wasmswitch_sys::ifindex(name).unwrap_or(0);
        // Deleted and re-created between two looks: the same name, another interface. Moved
        // to another namespace and straight back: the same index, but the kernel unbound
        // the port's sockets when it left, so they are dead all the same.
        let afxdp = info.driver.afxdp();
        let same = now != 0 && now == info.ifindex && !afxdp.is_some_and(AfxdpInfo::unbound);
        // Once a second: queues added or taken away (`ethtool -L`) under a port that opens
        // every queue. An added one has no socket, and its frames would never reach the
        // switch (the XDP program passes them to the kernel); the port is re-attached.
        let requeued =
            if !gone && same && tick.is_multiple_of(10) { afxdp.and_then(|a| a.queues_changed(name)) } else { None };
        match (gone, same && requeued.is_none(), now != 0) {
            (false, false, _) => {
                info.gone.store(true, Ordering::Relaxed);
                info.gone_events.fetch_add(1, Ordering::Relaxed);
                if let Some((had, has)) = requeued {
                    log::warn!(
                        "interface {name} now has {has} queue(s), port `{}` opened {had}: it is stopped and re-attached on all of them",
                        info.name
                    );
                } else if now == info.ifindex {
                    log::error!(
                        "interface {name} left and came back between two looks (another network namespace?): the kernel unbound port `{}`'s sockets; it is stopped and re-attached",
                        info.name
                    );
                } else if afxdp.is_some() {
                    log::error!(
                        "interface {name} disappeared: port `{}` stopped, the other ports keep forwarding; it is re-attached when {name} comes back",
                        info.name
                    );
                } else {
                    // The host port's TAP: the switch made it, and does not make it again.
                    log::error!(
                        "TAP {name} was deleted: host port `{}` stopped, the other ports keep forwarding; restart the daemon to create it again",
                        info.name
                    );
                }
                for c in controls {
                    c.send(Command::SetPortUp(p, false));
                }
                flush_port(p);
                self.counted.insert(p, afxdp.map(AfxdpInfo::frozen).unwrap_or_default());
            }
            // There and attached: its link. A port whose link is down is stopped (nothing
            // is queued for it to leave stale when the link comes back, floods skip it) and
            // forgets what it learned, as the Linux bridge does on carrier loss. The host
            // port's TAP too: set down, it fails every write.
            (false, true, _) => {
                let down = link_down(name);
                if down != info.link_down.load(Ordering::Relaxed) {
                    info.link_down.store(down, Ordering::Relaxed);
                    if !down {
                        // What a worker learned there in the round it finished after the
                        // stop (the flush at link down did not wait for it): stale now.
                        flush_port(p);
                    }
                    for c in controls {
                        c.send(Command::SetPortUp(p, !down));
                    }
                    if down {
                        info.down_events.fetch_add(1, Ordering::Relaxed);
                        flush_port(p);
                        log::warn!("interface {name}: link down; port `{}` stopped until it is up", info.name);
                    } else {
                        info.up_events.fetch_add(1, Ordering::Relaxed);
                        log::info!("interface {name}: link up; port `{}` forwarding again", info.name);
                    }
                }
            }
            (true, _, true) if tick.is_multiple_of(10) && afxdp.is_some() => {
                // As at link up: nothing learned there before it went may stay.
                flush_port(p);
                match reattach(res, controls, ports, p, info, &self.counted) {
                    Ok(()) => {
                        self.failures.remove(&p);
                        self.counted.remove(&p);
                        log::info!("interface {name} is back: port `{}` re-attached", info.name);
                    }
                    Err(e) => {
                        let n = self.failures.entry(p).or_default();
                        if n.is_multiple_of(30) {
                            log::warn!(
                                "interface {name} is back but port `{}` cannot be re-attached yet: {}",
                                info.name,
                                ErrorText(&e)
                            );
                        }
                        *n += 1;
                    }
                }
            }
            _ => {}
        }
    }
}

/// Opens port `p` again on its interface (which came back) and gives every worker its new
/// queues. Nothing happens if a reload changed the port meanwhile.
fn reattach(
    res: &Resources,
    controls: &[Arc<WorkerControl>],
    ports: &PortTable,
    p: PortId,
    info: &Arc<PortInfo>,
    counted: &std::collections::HashMap<PortId, Vec<QueueMonitor>>,
) -> Result<()> {
    let _changing = res.changing.lock().unwrap_or_else(|e| e.into_inner());
    if !ports.get(p).is_some_and(|now| Arc::ptr_eq(&now, info)) {
        return Ok(());
    }
    let afxdp = info.driver.afxdp().context("the port has no interface to reopen")?;
    // In the group it was in: the workers' slots keep their pool.
    let group = find_group(&res.groups, &info.name, &info.umem)?;
    // The old sockets and XDP link go first. An interface that came back as the same device
    // (renamed away and back, or moved to another namespace and back) still carries the old
    // link, beside which no program attaches, and its queues may still be bound to the old
    // sockets. Once per disappearance: a retry finds nothing left to close.
    if res.has_handle(p) {
        let late = swap_queues(controls, p, controls.iter().map(|_| Vec::new()).collect());
        res.replace_handle(p, None, late);
    }
    // The interface may have come back with more queues (every one of which a port without
    // `queues:` opens, each with a fill ring's and a TX ring's frames): held to what `run` and
    // `check` hold the config to, so that it cannot take the other ports' frames.
    let cfg = res.config();
    let needed = cfg.frames_needed();
    if needed > u64::from(cfg.pool.frames.value) {
        let queues = wasmswitch_afxdp::decide(&afxdp.section.spec()).queues.len();
        bail!(
            "with the {queues} queue(s) it opens there now, pool.frames {} is too small: at least {needed} are needed (give the port `queues:` and reload, or raise pool.frames and restart)",
            cfg.pool.frames.value
        );
    }
    let counted = counted.get(&p).map_or(&[][..], Vec::as_slice);
    let mut opened = group.open(res.workers, |ctx| drivers::afxdp::reopen(ctx, &info.name, afxdp, counted))?;
    opened.info.umem = group.name.clone();
    let late = swap_queues(controls, p, std::mem::take(&mut opened.queues));
    res.replace_handle(p, opened.handle, late);
    let mut new = opened.info;
    new.gone_events.store(info.gone_events.load(Ordering::Relaxed), Ordering::Relaxed);
    new.back_events.store(info.back_events.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    new.down_events.store(info.down_events.load(Ordering::Relaxed), Ordering::Relaxed);
    new.up_events.store(info.up_events.load(Ordering::Relaxed), Ordering::Relaxed);
    // Gone while its link was down: the watch's next look counts the `up` of the link it came
    // back with, or `down > up` (the link-down alert) would hold for ever.
    new.link_down.store(info.link_down.load(Ordering::Relaxed), Ordering::Relaxed);
    new.kernel_drops = info.kernel_drops.carried();
    ports.set(p, Some(Arc::new(new)));
    Ok(())
}

/// Gives worker `w` `queues[w]` as port `p`'s, and closes what they replace here, off the data
/// path. True when a worker was late to apply it.
fn swap_queues(
    controls: &[Arc<WorkerControl>],
    p: PortId,
    queues: Vec<Vec<Box<dyn wasmswitch_core::PortQueue>>>,
) -> bool {
    let sent: Vec<u64> =
        controls.iter().zip(queues).map(|(c, q)| c.send_all(vec![Command::ReplaceQueues(p, q)])).collect();
    let late = !controls.iter().zip(sent).all(|(c, g)| c.wait_applied(g, APPLY_BOUND));
    for c in controls {
        drop(c.take_retired());
    }
    late
}

/// How long a reload waits for every worker to apply a port change. The worst round the
/// config permits is about 200 ms (see [`STALL_BOUND`]).
pub const APPLY_BOUND: Duration = Duration::from_secs(5);

/// Ports a reload takes out and puts in, applied by [`Dataplane::change_ports`].
#[derive(Default)]
pub struct PortChanges {
    /// Ports to take out.
    pub remove: Vec<PortId>,
    /// Ports to put in, opened already.
    pub add: Vec<AddPort>,
}

/// A port to put in.
pub struct AddPort {
    /// The id it takes (a replaced port keeps its own).
    pub id: PortId,
    /// The port, opened, with the queues to hand to the workers.
    pub port: OpenedPort,
    /// A new port (counters from zero) rather than one replaced under the same name.
    pub fresh: bool,
    /// Its ingress stage on each worker (index = worker; missing means none).
    pub stages: Vec<Option<Box<dyn VerdictStage>>>,
}

impl Dataplane {
    /// Builds the datapath and starts its worker threads, without plugins.
    pub fn start(cfg: &Config) -> Result<Dataplane> {
        Self::start_with_stages(cfg, Vec::new())
    }

    /// Starts the datapath with the ports' plugin chains (compiled here, before any traffic)
    /// installed on every worker; their counters go to `plugin_metrics`.
    pub fn start_with_plugins(
        cfg: &Config,
        plugin_metrics: Option<&crate::plugins::PluginMetrics>,
    ) -> Result<Dataplane> {
        let id_of = |name: &str| cfg.port_index(name).map(PortId::from_index);
        let (stages, table) =
            crate::plugins::stages(cfg, &id_of, &crate::plugins::RunningSet::default(), crate::plugins::Smoke::Skip)?;
        if let Some(m) = plugin_metrics {
            m.replace(table);
        }
        Self::start_with_stages(cfg, stages)
    }

    /// Builds the datapath, installs the ready `stages` (worker by worker; empty for none) and
    /// starts the worker threads.
    pub fn start_with_stages(cfg: &Config, stages: Stages) -> Result<Dataplane> {
        let mut built = build(cfg)?;
        for (pipe, stages) in built.pipelines.iter_mut().zip(stages) {
            for (p, stage) in stages {
                pipe.set_ingress(p, stage);
            }
        }
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
                    if cpu.is_some() {
                        pin(cpu);
                    }
                    worker_loop(pipe, ctl, start, idle)
                })
                .context("cannot start a worker thread")?;
            workers.push(WorkerHandle { stats, control, thread: Mutex::new(Some(thread)) });
        }
        let groups: Arc<[UmemGroup]> = built.groups.into();
        let res = Arc::new(Resources {
            groups: groups.clone(),
            workers: workers.len(),
            handles: Mutex::new(built.handles),
            retired: Mutex::new(Vec::new()),
            changing: Mutex::new(()),
            config: Mutex::new(Arc::new(cfg.clone())),
        });
        let stop_housekeeping = Arc::new(AtomicBool::new(false));
        let fdb = Arc::new(CurrentFdb::new(built.fdb));
        let housekeeping = {
            let fdb = fdb.clone();
            let stop = stop_housekeeping.clone();
            let controls: Vec<_> = workers.iter().map(|w: &WorkerHandle| w.control.clone()).collect();
            let ports = built.ports.clone();
            let res = res.clone();
            std::thread::Builder::new()
                .name("housekeeping".into())
                .spawn(move || housekeeping_loop(fdb, controls, ports, res, start, stop))
                .context("cannot start the housekeeping thread")?
        };
        Ok(Dataplane {
            res,
            groups,
            fdb,
            ports: built.ports,
            workers,
            start,
            housekeeping: Mutex::new(Some(housekeeping)),
            stop_housekeeping,
            stopped: std::sync::RwLock::new(false),
        })
    }

    /// Sends `cmd_for(worker)` to every worker.
    pub fn broadcast(&self, mut cmd_for: impl FnMut(usize) -> Command) {
        for (w, h) in self.workers.iter().enumerate() {
            h.control.send(cmd_for(w));
        }
    }

    /// Opens configured port `index` of `cfg` (a port a reload adds), its sim traffic addressed
    /// through `id_of`. Nothing reaches the workers until [`Dataplane::change_ports`].
    /// The port must belong in one of the running UMEM groups (see [`umem_group_of`]).
    pub fn open_port(&self, cfg: &Config, index: usize, id_of: &dyn Fn(&str) -> Option<PortId>) -> Result<OpenedPort> {
        open_in_group(&self.res.groups, self.res.workers, cfg, index, id_of)
    }

    /// Frames in all UMEM groups.
    pub fn total_frames(&self) -> usize {
        self.groups.iter().map(|g| g.pool.total_frames()).sum()
    }

    /// `n` ids for new ports, given that the ports in `removed` go: the lowest free ones.
    pub fn free_ids(&self, removed: &[PortId], n: usize) -> Result<Vec<PortId>> {
        let running: Vec<PortId> = self.ports.snapshot().into_iter().map(|(id, _)| id).collect();
        let free: Vec<PortId> = (0..MAX_PORT_IDS)
            .map(PortId::from_index)
            .filter(|id| !running.contains(id) || removed.contains(id))
            .take(n)
            .collect();
        if free.len() < n {
            bail!("no free port id for {n} new port(s): at most {MAX_PORT_IDS} ports, the host port included");
        }
        Ok(free)
    }

    /// A reload's leave to open ports and change the datapath, held until it is done with them;
    /// an error once the datapath is stopping (see the `stopped` field).
    /// The config the switch runs.
    pub fn config(&self) -> Arc<Config> {
        self.res.config()
    }

    /// Makes `cfg` the config the switch runs (a reload or shadow change that applied).
    pub fn set_config(&self, cfg: Arc<Config>) {
        *self.res.config.lock().unwrap_or_else(|e| e.into_inner()) = cfg;
    }

    /// Starts a change of the datapath (a reload's): a stop waits for the guard to be dropped.
    /// Fails when the datapath is stopping.
    pub fn begin_change(&self) -> Result<std::sync::RwLockReadGuard<'_, bool>> {
        let stopped = self.stopped.read().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            bail!("the daemon is stopping");
        }
        Ok(stopped)
    }

    /// Applies `changes` together with `extra[w]` (further commands for worker `w`, e.g. the
    /// other ports' new stages): every worker gets them as one list between two rounds, so an
    /// added port is polled only with its plugins in place, and the ports not named keep
    /// forwarding throughout. Removed ports are closed once every worker has let go of them.
    pub fn change_ports(&self, mut changes: PortChanges, mut extra: Vec<Vec<Command>>) -> Result<()> {
        let _changing = self.res.changing.lock().unwrap_or_else(|e| e.into_inner());
        // A reopened port stays in the table (its series on /metrics) until its new info is in.
        let reopened: Vec<PortId> = changes.add.iter().filter(|a| !a.fresh).map(|a| a.id).collect();
        for &id in &changes.remove {
            if !reopened.contains(&id) {
                self.ports.set(id, None);
            }
        }
        extra.resize_with(self.workers.len(), Vec::new);
        // A port reopened under its id is detached by its own attach, which hands its plugins
        // over to the new slot (`Pipeline::attach_port`); detached first, there was nothing left
        // to take over, and a plugin that stays lost its instance and state.
        let detach: Vec<PortId> = changes.remove.iter().copied().filter(|p| !reopened.contains(p)).collect();
        let mut sent = Vec::new();
        for (w, (h, extra)) in self.workers.iter().zip(extra).enumerate() {
            let mut cmds: Vec<Command> = detach.iter().map(|&p| Command::DetachPort(p)).collect();
            for a in changes.add.iter_mut() {
                let stage = a.stages.get_mut(w).and_then(Option::take);
                cmds.push(Command::AttachPort { port: a.id, slot: slot(&mut a.port, w, stage), fresh: a.fresh });
            }
            cmds.extend(extra);
            sent.push(h.control.send_all(cmds));
        }
        let mut late = Vec::new();
        for (w, (h, g)) in self.workers.iter().zip(sent).enumerate() {
            if !h.control.wait_applied(g, APPLY_BOUND) {
                late.push(w);
            }
            // What the worker let go of is closed here, off the data path.
            drop(h.control.take_retired());
        }
        for id in &changes.remove {
            // A late worker may still poll the port: then its handle is closed at stop.
            self.res.replace_handle(*id, None, !late.is_empty());
            if late.is_empty() {
                // A port reopened with new settings keeps its name and id, so its static
                // entries (the config's and the API's) stay; what it learned goes with its old
                // queues. A removed port's id may go to another port: its statics go too.
                self.fdb.get().flush(Flush { port: Some(*id), statics: !reopened.contains(id), ..Flush::default() });
            }
        }
        for a in changes.add {
            self.res.replace_handle(a.id, a.port.handle, !late.is_empty());
            let mut info = a.port.info;
            if let Some(old) = self.ports.get(a.id).filter(|_| !a.fresh) {
                // The old queues are let go of (unless a worker is late): their counts are final.
                info.driver.carry_from(&old.driver);
            }
            self.ports.set(a.id, Some(Arc::new(info)));
        }
        if !late.is_empty() {
            bail!(
                "worker(s) {late:?} did not apply the change within {} s; it is applied when they next complete a round",
                APPLY_BOUND.as_secs()
            );
        }
        Ok(())
    }

    /// Replaces the FDB with one of `capacity` holding the current entries (see
    /// [`Fdb::resized`]); entries learned by a worker in the old table while the copy is made
    /// are learned again from the next frame they send. The caller holds
    /// [`CurrentFdb::edits`] for writing (`_no_edits`).
    pub fn resize_fdb(&self, capacity: usize, _no_edits: &std::sync::RwLockWriteGuard<'_, ()>) -> Result<()> {
        let new =
            self.fdb.get().resized(capacity, self.start.elapsed().as_secs() as u32).map_err(anyhow::Error::msg)?;
        let new = Arc::new(new);
        self.fdb.set(new.clone());
        let sent: Vec<u64> =
            self.workers.iter().map(|w| w.control.send_all(vec![Command::SetFdb(new.clone())])).collect();
        let late: Vec<usize> = self
            .workers
            .iter()
            .zip(sent)
            .enumerate()
            .filter(|(_, (w, g))| !w.control.wait_applied(*g, APPLY_BOUND))
            .map(|(i, _)| i)
            .collect();
        if !late.is_empty() {
            bail!("worker(s) {late:?} did not take the new FDB within {} s", APPLY_BOUND.as_secs());
        }
        Ok(())
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
        // After a reload that has opened ports is done with them; none starts after this.
        *self.stopped.write().unwrap_or_else(|e| e.into_inner()) = true;
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
        // Workers closed their sockets: dropping the AF_XDP ports detaches the XDP programs.
        // Host workers stop after the datapath workers and drain the rings between them; the
        // TAP goes away with its last descriptor.
        let handles = std::mem::take(&mut *self.res.handles.lock().unwrap_or_else(|e| e.into_inner()));
        let retired = std::mem::take(&mut *self.res.retired.lock().unwrap_or_else(|e| e.into_inner()));
        for w in &self.workers {
            drop(w.control.take_retired());
        }
        for h in handles.into_iter().flatten().chain(retired) {
            h.close();
        }
        if panicked > 0 {
            bail!("{panicked} worker(s) panicked");
        }
        for g in self.groups.iter() {
            check_no_leak(&g.pool, &[])
                .map_err(|e| anyhow::anyhow!("frame leak at shutdown in UMEM group `{}`: {e}", g.name))?;
        }
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
