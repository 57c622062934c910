//! The `afxdp` driver: one AF_XDP socket per queue of a real interface, all on the shared UMEM.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wasmswitch_afxdp::{AfXdpError, AfXdpPort, PortSpec, UmemRegistration};

use super::{max_frame, max_tx_frame, OpenCtx, OpenedPort, PortHandle, PortInfo};
use crate::config::AfxdpSection;

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
    let mut info = PortInfo::new(name, "afxdp", nq, format!("{}/{}", d.attach, d.bind));
    info.complete_partial_checksums = d.complete_partial_checksums;
    info.veth = d.driver == "veth";
    let tx_max = max_tx_frame(mtu, info.veth);
    info.afxdp = xp.queue_stats();
    info.interface = Some(a.interface.value.clone());
    info.ifindex = xp.ifindex();
    info.reopen = Some(a.clone());
    Ok(OpenedPort {
        info,
        queues: per_worker,
        max_frame: max_frame(mtu),
        tx_max,
        handle: PortHandle::Afxdp(xp),
        l2: Default::default(),
        pool: ctx.pool.id(),
    })
}
