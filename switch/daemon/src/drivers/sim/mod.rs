//! The `sim` driver: NIC queues in memory, with optional generated traffic (benchmarks and
//! logic tests).

pub mod config;
pub(crate) mod metrics;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use wasmswitch_sim::{SimQueue, SimRings, SimStats, Source, TrafficGen, TrafficSpec};

pub use self::config::SimSection;
use super::{max_frame, DriverInfo, OpenCtx, OpenedPort, PortInfo};

/// What a running sim port keeps: its queues' NIC-side counters and generator rates.
#[derive(Debug, Default)]
pub struct SimInfo {
    /// Per-queue NIC-side counters.
    pub stats: Vec<Arc<SimStats>>,
    /// Per queue, the `rx_missed` of the queues this port had before a reload reopened it
    /// (its series goes on from there rather than back to 0).
    pub missed_before: Vec<u64>,
    /// The rates of its rate-limited generators (one per queue), which a reload sets.
    pub rates: Vec<Arc<AtomicU64>>,
}

impl SimInfo {
    /// Queue `q`'s `rx_missed`, counting the queues a reload replaced.
    pub fn missed(&self, q: usize) -> u64 {
        let now = self.stats.get(q).map_or(0, |s| s.rx_missed.get());
        now + self.missed_before.get(q).copied().unwrap_or(0)
    }

    /// Takes over the final counts of `old`, the port's queues before a reload replaced them.
    pub fn carry_from(&mut self, old: &SimInfo) {
        self.missed_before = (0..old.stats.len()).map(|q| old.missed(q)).collect();
    }
}

/// Opens a sim port. `traffic` is the port's generator spec with its destinations already
/// resolved to port ids (each queue gets its own seed).
pub fn open(ctx: &OpenCtx<'_>, name: &str, sim: &SimSection, mtu: u32, traffic: Option<TrafficSpec>) -> OpenedPort {
    let queues = sim.queues.value as usize;
    let rings = SimRings { fill: sim.ring_size.value, tx: sim.ring_size.value };
    let mut sim_info = SimInfo::default();
    let mut per_worker: Vec<Vec<Box<dyn wasmswitch_core::PortQueue>>> = (0..ctx.workers).map(|_| Vec::new()).collect();
    for q in 0..queues {
        let source = match &traffic {
            Some(spec) => Source::Gen(TrafficGen::new(&TrafficSpec { seed: 0x5eed ^ q as u64, ..spec.clone() })),
            None => Source::Idle,
        };
        let queue = SimQueue::new(ctx.umem.clone(), rings, source);
        sim_info.stats.push(queue.stats().clone());
        sim_info.rates.extend(queue.rate_handle());
        per_worker[q % ctx.workers].push(Box::new(queue));
    }
    for worker in per_worker.iter_mut().skip(queues) {
        // Fewer queues than workers: a TX-only queue each (a sim NIC has plenty).
        let queue = SimQueue::new(ctx.umem.clone(), rings, Source::Idle);
        sim_info.stats.push(queue.stats().clone());
        worker.push(Box::new(queue));
    }
    OpenedPort {
        info: PortInfo::new(name, DriverInfo::Sim(sim_info), queues, "sim".into()),
        queues: per_worker,
        max_frame: max_frame(mtu),
        tx_max: max_frame(mtu),
        handle: None,
        l2: Default::default(),
        pool: ctx.pool.id(),
    }
}
