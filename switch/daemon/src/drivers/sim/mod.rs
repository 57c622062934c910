//! The `sim` driver: NIC queues in memory, with optional generated traffic (benchmarks and
//! logic tests).

use wasmswitch_sim::{SimQueue, SimRings, Source, TrafficGen, TrafficSpec};

use super::{max_frame, OpenCtx, OpenedPort, PortHandle, PortInfo};
use crate::config::SimSection;

/// Opens a sim port. `traffic` is the port's generator spec with its destinations already
/// resolved to port ids (each queue gets its own seed).
pub fn open(ctx: &OpenCtx<'_>, name: &str, sim: &SimSection, mtu: u32, traffic: Option<TrafficSpec>) -> OpenedPort {
    let queues = sim.queues.value as usize;
    let rings = SimRings { fill: sim.ring_size.value, tx: sim.ring_size.value };
    let mut info = PortInfo::new(name, "sim", queues, "sim".into());
    let mut per_worker: Vec<Vec<Box<dyn wasmswitch_core::PortQueue>>> = (0..ctx.workers).map(|_| Vec::new()).collect();
    for q in 0..queues {
        let source = match &traffic {
            Some(spec) => Source::Gen(TrafficGen::new(&TrafficSpec { seed: 0x5eed ^ q as u64, ..spec.clone() })),
            None => Source::Idle,
        };
        let queue = SimQueue::new(ctx.umem.clone(), rings, source);
        info.sim.push(queue.stats().clone());
        info.sim_rates.extend(queue.rate_handle());
        per_worker[q % ctx.workers].push(Box::new(queue));
    }
    for worker in per_worker.iter_mut().skip(queues) {
        // Fewer queues than workers: a TX-only queue each (a sim NIC has plenty).
        let queue = SimQueue::new(ctx.umem.clone(), rings, Source::Idle);
        info.sim.push(queue.stats().clone());
        worker.push(Box::new(queue));
    }
    OpenedPort {
        info,
        queues: per_worker,
        max_frame: max_frame(mtu),
        tx_max: max_frame(mtu),
        handle: PortHandle::Queues,
        l2: Default::default(),
        pool: ctx.pool.id(),
    }
}
