//! The drivers. Each one is a folder with the same files:
//! - `config.rs`: its section of the file (the config names it), the checks on it with
//!   file:line:column errors, the frames it holds, and which of its keys a reload applies live;
//! - `mod.rs`: `open` (and `reopen` where it has one), turning the section into an
//!   [`OpenedPort`]: the queues every worker will own, the port's static facts ([`PortInfo`])
//!   with the driver's own part ([`DriverInfo`]), and a [`PortHandle`] that closes what the
//!   kernel holds once the workers have let go of the queues;
//! - `metrics.rs`: its metric families, over the running ports of that driver.
//!
//! Start and reload open ports through the same calls; `check` checks a section without
//! opening anything. Adding a driver: its folder, a variant of [`DriverInfo`] (with a line in
//! [`encode_metrics`]), and its section's key in `config::PortSection`.

pub mod afxdp;
pub mod host;
pub mod interface;
pub mod sim;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::encoding::DescriptorEncoder;
use wasmswitch_afxdp::UmemRegistration;
use wasmswitch_core::pool::SharedPool;
use wasmswitch_core::{PortId, PortQueue, Umem};

pub use interface::{KernelCount, KernelDrops};

/// Port ids a running switch can hand out: every configured port plus the host port. Ids of
/// removed ports are reused; per-worker counters are sized for all of them once, at start.
pub const MAX_PORT_IDS: usize = crate::schema::range::PORTS.1 + 1;
// Every port's learned entries are counted (and limited by `fdb.max_macs`) in the FDB.
const _: () = assert!(MAX_PORT_IDS <= wasmswitch_core::fdb::COUNTED_PORTS);

pub use crate::schema::max_frame;
pub use afxdp::config::max_tx_frame;

/// What a driver's checks know of the rest of the file, beside the port's own section.
pub struct CheckCtx<'a> {
    /// The port's name, for messages.
    pub port: &'a str,
    /// `pool.frame_size`: the most a frame of the pool holds, headroom included.
    pub frame_size: u32,
    /// Every configured port's name, in file order.
    pub ports: &'a [&'a str],
    /// `metrics.listen`: the control API's address.
    pub listen: SocketAddr,
}

/// A running port's driver-specific part: its counters (read by the metrics) and what it needs
/// to open the port again. One variant per driver, each its module's type.
#[derive(Debug)]
pub enum DriverInfo {
    /// A sim port.
    Sim(sim::SimInfo),
    /// An AF_XDP port.
    Afxdp(afxdp::AfxdpInfo),
    /// The host port (a TAP).
    Host(host::HostInfo),
}

impl DriverInfo {
    /// The driver's name, as the metrics and the API label the port with it.
    pub fn kind(&self) -> &'static str {
        match self {
            DriverInfo::Sim(_) => "sim",
            DriverInfo::Afxdp(_) => "afxdp",
            DriverInfo::Host(_) => "tap",
        }
    }

    /// The sim part.
    pub fn sim(&self) -> Option<&sim::SimInfo> {
        match self {
            DriverInfo::Sim(s) => Some(s),
            _ => None,
        }
    }

    /// The AF_XDP part (the watch re-attaches such a port when its interface comes back).
    pub fn afxdp(&self) -> Option<&afxdp::AfxdpInfo> {
        match self {
            DriverInfo::Afxdp(a) => Some(a),
            _ => None,
        }
    }

    /// The host port's part.
    pub fn host(&self) -> Option<&host::HostInfo> {
        match self {
            DriverInfo::Host(h) => Some(h),
            _ => None,
        }
    }

    /// Carries the counts of `old`, the same port before a reload replaced its queues, into
    /// this one's, so that its series go on.
    pub fn carry_from(&mut self, old: &DriverInfo) {
        if let (DriverInfo::Sim(new), DriverInfo::Sim(old)) = (self, old) {
            new.carry_from(old);
        }
    }
}

/// Writes every driver's metric families over the running `ports` (polled by `workers`
/// workers), and those of their interfaces.
pub fn encode_metrics(
    e: &mut DescriptorEncoder,
    ports: &[(PortId, Arc<PortInfo>)],
    workers: usize,
) -> std::fmt::Result {
    let infos: Vec<&PortInfo> = ports.iter().map(|(_, i)| &**i).collect();
    let sims: Vec<_> = infos.iter().filter_map(|&i| Some((i, i.driver.sim()?))).collect();
    sim::metrics::encode(e, &sims)?;
    let afxdps: Vec<_> = infos.iter().filter_map(|&i| Some((i, i.driver.afxdp()?))).collect();
    afxdp::metrics::encode(e, &afxdps, workers)?;
    interface::encode(e, &infos)?;
    let hosts: Vec<_> = infos.iter().filter_map(|&i| Some((i, i.driver.host()?))).collect();
    host::metrics::encode(e, &hosts)
}

/// What every driver needs to open a port: the UMEM group it opens the port in.
pub struct OpenCtx<'a> {
    /// The group's UMEM, the memory its frames live in.
    pub umem: &'a Arc<Umem>,
    /// The group's pool of free frames over that UMEM.
    pub pool: &'a Arc<SharedPool>,
    /// Datapath workers: the port's queues are spread over them, each gets one to send on.
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

/// Static facts about a port, for metrics and the API.
#[derive(Debug)]
pub struct PortInfo {
    /// The port's name (`ports[].name`, or `host.name`).
    pub name: String,
    /// Queues the port was opened with.
    pub queues: usize,
    /// Mode label (e.g. the AF_XDP profile's choice), for metrics.
    pub mode: String,
    /// The driver's own part: its counters and how to open the port again.
    pub driver: DriverInfo,
    /// Whether ingress completes TCP/UDP checksums left to offload (AF_XDP profile or override).
    pub complete_partial_checksums: bool,
    /// The kernel interface behind the port (AF_XDP, or the host port's TAP) and its index when
    /// the port was opened, watched for disappearance (an interface deleted and re-created
    /// keeps its name but gets a new index).
    pub interface: Option<String>,
    /// `interface`'s index when the port was opened (0 without one).
    pub ifindex: u32,
    /// Set once the interface has disappeared and the port was stopped.
    pub gone: AtomicBool,
    /// Set while the interface is there but its link is down (operstate `down`): the port is
    /// stopped like a gone one, and started again when the link comes back.
    pub link_down: AtomicBool,
    /// Times the link went down.
    pub down_events: AtomicU64,
    /// Times the link came back up.
    pub up_events: AtomicU64,
    /// The interface's own drop counters, carried over when the port is re-attached.
    pub kernel_drops: KernelDrops,
    /// Times the interface disappeared.
    pub gone_events: AtomicU64,
    /// Times the port was re-attached when the interface came back.
    pub back_events: AtomicU64,
    /// The UMEM group the port is in (its name), set by the dataplane once opened.
    pub umem: String,
}

impl PortInfo {
    /// A port of `driver` with no interface watched yet.
    pub fn new(name: &str, driver: DriverInfo, queues: usize, mode: String) -> Self {
        Self {
            name: name.to_string(),
            queues,
            mode,
            driver,
            complete_partial_checksums: false,
            interface: None,
            ifindex: 0,
            gone: AtomicBool::new(false),
            link_down: AtomicBool::new(false),
            down_events: AtomicU64::new(0),
            up_events: AtomicU64::new(0),
            kernel_drops: Default::default(),
            gone_events: AtomicU64::new(0),
            back_events: AtomicU64::new(0),
            umem: String::new(),
        }
    }
}

/// What keeps a port's kernel objects alive (an XDP program and sockets, a TAP and its host
/// workers). Closed only after every worker has released the port's queues.
pub trait PortHandle: Send {
    /// Closes the port: host workers are stopped and joined (they drain the rings between
    /// them and the datapath); the XDP program is detached.
    fn close(self: Box<Self>);
}

/// A port, opened: ready to be handed to the workers.
pub struct OpenedPort {
    /// What the metrics and the API show of it.
    pub info: PortInfo,
    /// `queues[w]`: the queues worker `w` owns on the port (the first carries its TX).
    pub queues: Vec<Vec<Box<dyn PortQueue>>>,
    /// The longest frame it takes in ([`max_frame`] of its MTU); longer ones are dropped as
    /// `oversize`.
    pub max_frame: usize,
    /// The longest frame it sends ([`max_tx_frame`]).
    pub tx_max: usize,
    /// What the kernel holds for it; none for a port of queues alone (sim).
    pub handle: Option<Box<dyn PortHandle>>,
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
        t.iter().enumerate().filter_map(|(i, p)| Some((PortId::from_index(i), p.clone()?))).collect()
    }

    /// The running port with id `id`.
    pub fn get(&self, id: PortId) -> Option<Arc<PortInfo>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(id.index()).cloned().flatten()
    }

    /// The id of the running port called `name`.
    pub fn id_of(&self, name: &str) -> Option<PortId> {
        let t = self.0.read().unwrap_or_else(|e| e.into_inner());
        t.iter().position(|p| p.as_ref().is_some_and(|p| p.name == name)).map(PortId::from_index)
    }

    /// Ids in use (the highest plus one).
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no port is running.
    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    pub(crate) fn set(&self, id: PortId, info: Option<Arc<PortInfo>>) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        let i = id.index();
        if t.len() <= i {
            t.resize_with(i + 1, || None);
        }
        t[i] = info;
        while t.last().is_some_and(Option::is_none) {
            t.pop();
        }
    }
}
