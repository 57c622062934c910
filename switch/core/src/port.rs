//! The batch-oriented interface between the pipeline and a driver.

use crate::pool::{BulkReturn, PoolCache};
use crate::types::Desc;
pub use crate::types::PortId;

/// One queue of one port, owned by exactly one worker (so no method needs a lock).
///
/// Every method works on a whole burst: the pipeline makes one virtual call per burst per
/// queue, never one per packet.
pub trait PortQueue: Send {
    /// Receives up to `out.len()` packets; returns how many were written to `out`. The driver
    /// keeps its fill ring topped up from `pool` (bulk allocation) as part of the call.
    fn rx_burst(&mut self, pool: &mut PoolCache, out: &mut [Desc]) -> usize;

    /// Queues `descs` for transmission; returns how many were accepted (a prefix). The caller
    /// still owns the rest and returns them to the pool.
    fn tx_burst(&mut self, descs: &[Desc]) -> usize;

    /// Makes queued transmissions go (one syscall per burst where the driver needs one).
    fn flush_tx(&mut self) {}

    /// Moves finished transmissions back to the pool through `bulk`; returns how many.
    fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize;

    /// Returns every frame the driver holds (fill ring, RX ring, TX in flight) to the pool.
    /// Called once at shutdown, after the last burst.
    fn release_all(&mut self, pool: &mut PoolCache);

    /// Frames this queue holds right now (fill + RX + TX + completion), for frame accounting.
    fn frames_held(&self) -> usize;

    /// True when this queue has a receive side the worker should poll.
    fn has_rx(&self) -> bool {
        true
    }
}
