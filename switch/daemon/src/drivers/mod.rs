//! The drivers as the dataplane sees them. Each one turns its port section into an
//! [`OpenedPort`]: the queues every worker will own, the port's static facts and metrics
//! sources ([`PortInfo`]), and a [`PortHandle`] that closes what the kernel holds once the
//! workers have let go of the queues. Start and reload open ports through the same calls.
//!
//! Checking a section and counting the frames it needs is the config's job (`config`), so
//! that `check` answers without opening anything.

pub mod afxdp;
pub mod host;
pub mod sim;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use wasmswitch_afxdp::{AfXdpPort, QueueMonitor, UmemRegistration};
use wasmswitch_core::pool::SharedPool;
use wasmswitch_core::{PortId, PortQueue, Umem};
use wasmswitch_sim::SimStats;
use wasmswitch_tap::{HostPort, TapStats};

/// Port ids a running switch can hand out: every configured port plus the host port. Ids of
/// removed ports are reused; per-worker counters are sized for all of them once, at start.
pub const MAX_PORT_IDS: usize = crate::config::range::PORTS.1 + 1;
// Every port's learned entries are counted (and limited by `fdb.max_macs`) in the FDB.
const _: () = assert!(MAX_PORT_IDS <= wasmswitch_core::fdb::COUNTED_PORTS);

pub use crate::config::{max_frame, max_tx_frame};

/// What every driver needs to open a port: the UMEM group it opens the port in.
pub struct OpenCtx<'a> {
    pub umem: &'a Arc<Umem>,
    pub pool: &'a Arc<SharedPool>,
    pub workers: usize,
    /// The UMEM's registration with the kernel, shared by every AF_XDP port of the group.
    pub registration: &'a mut Option<UmemRegistration>,
}

/// One UMEM group: a UMEM with its pool and its kernel registration, shared by the ports of
/// the group (see `PortSection::umem`). Frames move between the group's ports without a copy.
pub struct UmemGroup {
    /// `copy`, `zerocopy` or a config's `umem:` name.
    pub name: String,
    /// The group's pool, over its UMEM; its id is the group's index.
    pub pool: Arc<SharedPool>,
    registration: Mutex<Option<UmemRegistration>>,
}

impl UmemGroup {
    /// A group with `pool`, not yet registered with the kernel (its first AF_XDP port does).
    pub fn new(name: String, pool: Arc<SharedPool>) -> Self {
        Self { name, pool, registration: Mutex::new(None) }
    }

    /// Runs `open` with this group's context (one port opens at a time per group).
    pub fn open<T>(&self, workers: usize, open: impl FnOnce(&mut OpenCtx<'_>) -> T) -> T {
        let mut registration = self.registration.lock().unwrap_or_else(|e| e.into_inner());
        open(&mut OpenCtx { umem: self.pool.umem(), pool: &self.pool, workers, registration: &mut registration })
    }
}

impl std::fmt::Debug for UmemGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemGroup").field("name", &self.name).field("pool", &self.pool).finish()
    }
}

/// A counter the kernel keeps on a port's interface (read at scrape time), made monotonic
/// across the interface being deleted and re-created: the port's series goes on from what
/// the old interface had counted when last read, instead of restarting at zero.
#[derive(Debug, Default)]
pub struct KernelCount {
    base: AtomicU64,
    last: AtomicU64,
}

impl KernelCount {
    /// The series' value for a fresh reading `raw` of the interface's counter.
    pub fn observe(&self, raw: u64) -> u64 {
        self.last.store(raw, Ordering::Relaxed);
        self.base.load(Ordering::Relaxed) + raw
    }

    /// The value while the interface cannot be read (gone): the last one.
    pub fn held(&self) -> u64 {
        self.base.load(Ordering::Relaxed) + self.last.load(Ordering::Relaxed)
    }

    /// The count for the port re-attached to a new interface, whose own counter starts at 0.
    pub fn carried(&self) -> KernelCount {
        KernelCount { base: AtomicU64::new(self.held()), last: AtomicU64::new(0) }
    }
}

/// The drop counters the kernel keeps on a port's interface, each a [`KernelCount`].
#[derive(Debug, Default)]
pub struct KernelDrops {
    /// The interface's `rx_dropped` and `tx_dropped` (sysfs).
    pub rx: KernelCount,
    pub tx: KernelCount,
    /// A veth's peer's `tx_dropped` (rtnetlink, in the peer's namespace).
    pub veth_peer: KernelCount,
}

impl KernelDrops {
    /// The counts for the port re-attached to a new interface.
    pub fn carried(&self) -> KernelDrops {
        KernelDrops { rx: self.rx.carried(), tx: self.tx.carried(), veth_peer: self.veth_peer.carried() }
    }
}

/// Static facts about a port, for metrics and the API.
#[derive(Debug)]
pub struct PortInfo {
    pub name: String,
    pub driver: &'static str,
    pub queues: usize,
    /// Mode label (e.g. the AF_XDP profile's choice), for metrics.
    pub mode: String,
    /// Per-queue NIC-side counters of sim ports.
    pub sim: Vec<Arc<SimStats>>,
    /// Per queue, the `rx_missed` of the queues this port had before a reload reopened it
    /// (its series goes on from there rather than back to 0).
    pub sim_missed_before: Vec<u64>,
    /// The rates of a sim port's rate-limited generators (one per queue), which a reload sets.
    pub sim_rates: Vec<Arc<AtomicU64>>,
    /// Per-queue driver and kernel counters of AF_XDP ports.
    pub afxdp: Vec<QueueMonitor>,
    /// Whether ingress completes TCP/UDP checksums left to offload (AF_XDP profile or override).
    pub complete_partial_checksums: bool,
    /// The port's interface is a veth, which sends less past the MTU ([`max_tx_frame`]).
    pub veth: bool,
    /// The kernel interface behind the port (AF_XDP, or the host port's TAP) and its index when
    /// the port was opened,
    /// watched for disappearance (an interface deleted and re-created keeps its name but gets
    /// a new index).
    pub interface: Option<String>,
    pub ifindex: u32,
    /// Set once the interface has disappeared and the port was stopped.
    pub gone: AtomicBool,
    /// Set while the interface is there but its link is down (operstate `down`): the port is
    /// stopped like a gone one, and started again when the link comes back.
    pub link_down: AtomicBool,
    /// Times the link went down, and came back up.
    pub down_events: AtomicU64,
    pub up_events: AtomicU64,
    pub kernel_drops: KernelDrops,
    /// Times the interface disappeared, and times the port was re-attached when it came back.
    pub gone_events: AtomicU64,
    pub back_events: AtomicU64,
    /// How to open the port again on an interface of the same name (AF_XDP).
    pub reopen: Option<crate::config::AfxdpSection>,
    /// Host port (TAP) counters.
    pub tap: Option<Arc<TapStats>>,
    /// The UMEM group the port is in (its name), set by the dataplane once opened.
    pub umem: String,
}

impl PortInfo {
    /// Sim queue `q`'s `rx_missed`, counting the queues a reload replaced.
    pub fn sim_missed(&self, q: usize) -> u64 {
        let now = self.sim.get(q).map_or(0, |s| s.rx_missed.get());
        now + self.sim_missed_before.get(q).copied().unwrap_or(0)
    }

    /// A port of `driver` with no driver-specific counters yet.
    pub fn new(name: &str, driver: &'static str, queues: usize, mode: String) -> Self {
        Self {
            name: name.to_string(),
            driver,
            queues,
            mode,
            sim: Vec::new(),
            sim_missed_before: Vec::new(),
            sim_rates: Vec::new(),
            afxdp: Vec::new(),
            complete_partial_checksums: false,
            veth: false,
            interface: None,
            ifindex: 0,
            gone: AtomicBool::new(false),
            link_down: AtomicBool::new(false),
            down_events: AtomicU64::new(0),
            up_events: AtomicU64::new(0),
            kernel_drops: Default::default(),
            gone_events: AtomicU64::new(0),
            back_events: AtomicU64::new(0),
            reopen: None,
            tap: None,
            umem: String::new(),
        }
    }
}

/// What keeps a port's kernel objects alive. Dropped (or [`PortHandle::close`]d) only after
/// every worker has released the port's queues.
pub enum PortHandle {
    /// Nothing beyond the queues themselves (sim).
    Queues,
    /// The XDP program and the sockets' registration; dropping it detaches the program.
    Afxdp(AfXdpPort),
    /// The TAP and its host workers.
    Host(HostPort),
}

impl PortHandle {
    /// Closes the port: host workers are stopped and joined (they drain the rings between
    /// them and the datapath); the XDP program is detached.
    pub fn close(self) {
        match self {
            PortHandle::Host(mut h) => h.stop(),
            PortHandle::Afxdp(p) => drop(p),
            PortHandle::Queues => {}
        }
    }
}

/// A port, opened: ready to be handed to the workers.
pub struct OpenedPort {
    pub info: PortInfo,
    /// `queues[w]`: the queues worker `w` owns on the port (the first carries its TX).
    pub queues: Vec<Vec<Box<dyn PortQueue>>>,
    pub max_frame: usize,
    /// The longest frame it sends ([`max_tx_frame`]).
    pub tx_max: usize,
    pub handle: PortHandle,
    /// VLANs, storm limits and mirrors, as each worker's slot gets them.
    pub l2: wasmswitch_core::vlan::PortL2,
    /// The pool (UMEM group) it was opened in.
    pub pool: wasmswitch_core::pool::PoolId,
}

/// The running ports by id, shared between the dataplane (which changes it on reload) and the
/// metrics and API (which read a snapshot per request).
#[derive(Clone, Debug, Default)]
pub struct PortTable(Arc<RwLock<Vec<Option<Arc<PortInfo>>>>>);

impl PortTable {
    /// Every running port with its id, in id order.
    pub fn snapshot(&self) -> Vec<(PortId, Arc<PortInfo>)> {
        let t = self.0.read().unwrap_or_else(|e| e.into_inner());
        t.iter().enumerate().filter_map(|(i, p)| Some((i as PortId, p.clone()?))).collect()
    }

    pub fn get(&self, id: PortId) -> Option<Arc<PortInfo>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(id as usize).cloned().flatten()
    }

    /// The id of the running port called `name`.
    pub fn id_of(&self, name: &str) -> Option<PortId> {
        let t = self.0.read().unwrap_or_else(|e| e.into_inner());
        t.iter().position(|p| p.as_ref().is_some_and(|p| p.name == name)).map(|i| i as PortId)
    }

    /// Ids in use (the highest plus one).
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    pub(crate) fn set(&self, id: PortId, info: Option<Arc<PortInfo>>) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        let i = id as usize;
        if t.len() <= i {
            t.resize_with(i + 1, || None);
        }
        t[i] = info;
        while t.last().is_some_and(Option::is_none) {
            t.pop();
        }
    }
}

#[cfg(test)]
mod kernel_count_tests {
    use super::KernelCount;

    #[test]
    fn a_kernel_count_never_goes_back_across_a_new_interface() {
        let c = KernelCount::default();
        assert_eq!((c.observe(5), c.observe(9)), (5, 9));
        assert_eq!(c.held(), 9, "gone: the last value");
        // Re-attached to a new interface whose own counter starts again.
        let c = c.carried();
        assert_eq!((c.held(), c.observe(0), c.observe(3)), (9, 9, 12));
    }
}
