//! The `afxdp` driver: one AF_XDP socket per queue of a real interface, all on the shared UMEM.

pub mod config;
pub(crate) mod metrics;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wasmswitch_afxdp::{AfXdpError, AfXdpPort, PortSpec, QueueMonitor, UmemRegistration};

pub use self::config::{max_tx_frame, AfxdpSection};
use super::{max_frame, DriverInfo, OpenCtx, OpenedPort, PortHandle, PortInfo};

/// What a running AF_XDP port keeps: its queues' counters, and its section, to open it again
/// on an interface of the same name when the one it had comes back.
#[derive(Debug)]
pub struct AfxdpInfo {
    /// Per-queue driver and kernel counters.
    pub queues: Vec<QueueMonitor>,
    /// The interface is a veth, which sends less past the MTU ([`max_tx_frame`]).
    pub veth: bool,
    /// The section it was opened from.
    pub section: AfxdpSection,
}

impl AfxdpInfo {
    /// `(opened, now)` when the port opens every queue of interface `iface` and their count is
    /// no longer the count it opened (`ethtool -L`).
    pub fn queues_changed(&self, iface: &str) -> Option<(u32, u32)> {
        if self.section.queues.is_some() {
            return None;
        }
        let ch = wasmswitch_afxdp::sys::channels(iface).ok()?;
        let now = wasmswitch_afxdp::profile::queue_count(ch.combined_count, ch.rx_count);
        let had = self.queues.len() as u32;
        (now != had).then_some((had, now))
    }

    /// True when the kernel unbound any of the port's sockets from its interface. Only when
    /// the sockets look bound does the rest of the watch (its link) mean anything.
    pub fn unbound(&self) -> bool {
        self.queues.iter().any(QueueMonitor::unbound)
    }

    /// The queues' counts as they stand, to carry into the port once it is opened again.
    pub fn frozen(&self) -> Vec<QueueMonitor> {
        self.queues.iter().map(QueueMonitor::frozen).collect()
    }
}

/// Dropping the port detaches its XDP program and closes its sockets.
impl PortHandle for AfXdpPort {
    fn close(self: Box<Self>) {}
}

/// Opens the interface. A queue still bound right after a previous owner died (the kernel
/// releases an AF_XDP socket of a killed process asynchronously) is retried for up to 3 s.
fn open_retrying(spec: &PortSpec, reg: &UmemRegistration) -> Result<AfXdpPort, AfXdpError> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match AfXdpPort::open(spec, reg) {
            Err(AfXdpError::QueueBusy { .. }) if Instant::now() < deadline => {
                log::info!("{}: queue still bound by a closing socket, retrying", spec.iface);
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// The worker that polls the `i`-th opened queue of a port (the metrics name it too).
pub fn worker_of_queue(i: usize, workers: usize) -> usize {
    i % workers.max(1)
}

/// Opens an AF_XDP port: queue `i` goes to worker [`worker_of_queue`]; a worker without a
/// queue of its own shares one's TX side (locked per burst).
pub fn open(ctx: &mut OpenCtx<'_>, name: &str, a: &AfxdpSection, mtu: u32) -> Result<OpenedPort> {
    let workers = ctx.workers;
    let reg = ctx.registration.get_or_insert_with(|| UmemRegistration::new(ctx.umem.clone()));
    let mut xp = open_retrying(&a.spec(), reg).with_context(|| format!("port `{name}`"))?;
    // The driver logs its decision (profile, attach and bind mode) as it opens the port.
    let d = xp.decision().clone();
    let mut queues: Vec<_> = xp.take_queues().into_iter().map(|(_, q)| q).collect();
    let nq = queues.len();
    if nq == 0 {
        bail!("port `{name}`: interface {} has no queue to open", a.interface.value);
    }
    let shared: Vec<_> = (nq..workers).map(|w| queues[w % nq].share_tx()).collect();
    let mut per_worker: Vec<Vec<Box<dyn wasmswitch_core::PortQueue>>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, q) in queues.into_iter().enumerate() {
        per_worker[worker_of_queue(i, workers)].push(Box::new(q));
    }
    for (k, q) in shared.into_iter().enumerate() {
        per_worker[nq + k].push(Box::new(q));
    }
    let veth = d.driver == "veth";
    let afxdp = AfxdpInfo { queues: xp.queue_stats(), veth, section: a.clone() };
    let mut info = PortInfo::new(name, DriverInfo::Afxdp(afxdp), nq, format!("{}/{}", d.attach, d.bind));
    info.complete_partial_checksums = d.complete_partial_checksums;
    let tx_max = max_tx_frame(mtu, veth);
    info.interface = Some(a.interface.value.clone());
    info.ifindex = xp.ifindex();
    Ok(OpenedPort {
        info,
        queues: per_worker,
        max_frame: max_frame(mtu),
        tx_max,
        handle: Some(Box::new(xp)),
        l2: Default::default(),
        pool: ctx.pool.id(),
    })
}

/// Opens port `name` of `info` again on its interface, which came back; the counts in
/// `counted` (frozen when it went) carry on in the new queues of the same ids. The MTU only
/// sets `max_frame` and `tx_max`, which the workers' slots keep, so it is not asked for.
pub fn reopen(ctx: &mut OpenCtx<'_>, name: &str, info: &AfxdpInfo, counted: &[QueueMonitor]) -> Result<OpenedPort> {
    let mut opened = open(ctx, name, &info.section, 0)?;
    if let DriverInfo::Afxdp(a) = &mut opened.info.driver {
        for m in &mut a.queues {
            if let Some(old) = counted.iter().find(|o| o.queue == m.queue) {
                m.carry_over(old);
            }
        }
    }
    Ok(opened)
}
