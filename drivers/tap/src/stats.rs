//! Counters of the host port, single-writer (`wasmswitch_core::counter::Counter`).
//!
//! Two kinds, by who writes them: [`HostQueueStats`] belong to one datapath worker's host
//! `PortQueue` (the producer side), [`HostWorkerStats`] to one host worker thread. The daemon
//! holds the [`TapStats`] (an `Arc`) and sums at scrape time.

use std::sync::Arc;

use wasmswitch_core::counter::{Counter, Gauge};

/// Upper bounds of the batch-size histogram's finite buckets (a batch of n goes into the first
/// bucket whose bound is ≥ n, one larger than all into the last, unbounded one).
pub const BATCH_BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Buckets of the histogram: the finite ones and the unbounded (`+Inf`) one.
pub const HIST_LEN: usize = BATCH_BUCKETS.len() + 1;

/// Written by one datapath worker (its host `PortQueue`).
#[derive(Debug, Default)]
pub struct HostQueueStats {
    /// Frames accepted into a per-destination bulk queue.
    pub enqueued: Counter,
    /// Frames moved into a host worker's ring.
    pub ring_enqueued: Counter,
    /// Frames dropped because a host worker's ring was full (returned to the pool).
    pub ring_full: Counter,
    /// Bulk-queue flushes into rings (a full bulk queue or the end of a burst).
    pub flushes: Counter,
    /// Host workers woken from sleep (an eventfd write).
    pub wakeups: Counter,
    /// Frames the host sent, handed to the pipeline by `rx_burst`.
    pub rx_frames: Counter,
}

/// Written by one host worker thread.
#[derive(Debug, Default)]
pub struct HostWorkerStats {
    /// Frames written to the TAP successfully.
    pub delivered: Counter,
    /// Writes that failed (the frame is still returned to the pool).
    pub write_errors: Counter,
    /// Delivery batches by size ([`BATCH_BUCKETS`], then larger ones).
    pub batch_hist: [Counter; HIST_LEN],
    /// Frames in those batches (the histogram's sum: what was handed to the TAP, written or not).
    pub batch_frames: Counter,
    /// Frames written to the TAP (received by the host); the same count as `delivered`.
    pub tap_tx_packets: Counter,
    /// Bytes of those frames.
    pub tap_tx_bytes: Counter,
    /// Frames read from the TAP (sent by the host).
    pub tap_rx_packets: Counter,
    /// Bytes of those frames.
    pub tap_rx_bytes: Counter,
    /// Reads from the TAP that failed (a cancelled read aside).
    pub read_errors: Counter,
    /// Host frames dropped because the datapath worker's ring was full.
    pub rx_ring_full: Counter,
    /// No free frame to post a read into.
    pub rx_alloc_failed: Counter,
    /// io_uring_enter calls that submitted or waited.
    pub submissions: Counter,
    /// Times the worker went to sleep waiting for work.
    pub sleeps: Counter,
    /// Reads posted and not yet completed.
    pub reads_in_flight: Gauge,
}

impl HostWorkerStats {
    pub(crate) fn record_batch(&self, n: usize) {
        let i = BATCH_BUCKETS.iter().position(|&b| n <= b).unwrap_or(BATCH_BUCKETS.len());
        self.batch_hist[i].inc();
        self.batch_frames.add(n as u64);
    }
}

/// Every counter of one host port, for the daemon's exporter.
#[derive(Debug, Default)]
pub struct TapStats {
    /// Index = datapath worker.
    pub queues: Vec<Arc<HostQueueStats>>,
    /// Index = host worker.
    pub workers: Vec<Arc<HostWorkerStats>>,
}

/// A summed snapshot (what a scrape or a test reads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapTotals {
    /// [`HostQueueStats::enqueued`], summed over the datapath workers.
    pub enqueued: u64,
    /// [`HostQueueStats::ring_enqueued`], summed over the datapath workers.
    pub ring_enqueued: u64,
    /// [`HostQueueStats::ring_full`], summed over the datapath workers.
    pub ring_full: u64,
    /// [`HostQueueStats::wakeups`], summed over the datapath workers.
    pub wakeups: u64,
    /// [`HostQueueStats::rx_frames`], summed over the datapath workers.
    pub rx_frames: u64,
    /// [`HostWorkerStats::delivered`], summed over the host workers.
    pub delivered: u64,
    /// [`HostWorkerStats::write_errors`], summed over the host workers.
    pub write_errors: u64,
    /// [`HostWorkerStats::batch_hist`], summed bucket by bucket over the host workers.
    pub batch_hist: [u64; HIST_LEN],
    /// [`HostWorkerStats::batch_frames`], summed over the host workers.
    pub batch_frames: u64,
    /// [`HostWorkerStats::tap_tx_packets`], summed over the host workers.
    pub tap_tx_packets: u64,
    /// [`HostWorkerStats::tap_tx_bytes`], summed over the host workers.
    pub tap_tx_bytes: u64,
    /// [`HostWorkerStats::tap_rx_packets`], summed over the host workers.
    pub tap_rx_packets: u64,
    /// [`HostWorkerStats::tap_rx_bytes`], summed over the host workers.
    pub tap_rx_bytes: u64,
    /// [`HostWorkerStats::read_errors`], summed over the host workers.
    pub read_errors: u64,
    /// [`HostWorkerStats::rx_ring_full`], summed over the host workers.
    pub rx_ring_full: u64,
    /// [`HostWorkerStats::rx_alloc_failed`], summed over the host workers.
    pub rx_alloc_failed: u64,
    /// [`HostWorkerStats::submissions`], summed over the host workers.
    pub submissions: u64,
    /// [`HostWorkerStats::sleeps`], summed over the host workers.
    pub sleeps: u64,
}

impl TapStats {
    /// Every counter summed over the workers that write it.
    pub fn totals(&self) -> TapTotals {
        let mut t = TapTotals::default();
        for q in &self.queues {
            t.enqueued += q.enqueued.get();
            t.ring_enqueued += q.ring_enqueued.get();
            t.ring_full += q.ring_full.get();
            t.wakeups += q.wakeups.get();
            t.rx_frames += q.rx_frames.get();
        }
        for w in &self.workers {
            t.delivered += w.delivered.get();
            t.write_errors += w.write_errors.get();
            for (d, c) in t.batch_hist.iter_mut().zip(&w.batch_hist) {
                *d += c.get();
            }
            t.batch_frames += w.batch_frames.get();
            t.tap_tx_packets += w.tap_tx_packets.get();
            t.tap_tx_bytes += w.tap_tx_bytes.get();
            t.tap_rx_packets += w.tap_rx_packets.get();
            t.tap_rx_bytes += w.tap_rx_bytes.get();
            t.read_errors += w.read_errors.get();
            t.rx_ring_full += w.rx_ring_full.get();
            t.rx_alloc_failed += w.rx_alloc_failed.get();
            t.submissions += w.submissions.get();
            t.sleeps += w.sleeps.get();
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_larger_than_the_last_bound_goes_in_the_unbounded_bucket() {
        let w = HostWorkerStats::default();
        for n in [1, 3, 64, 65, 1000] {
            w.record_batch(n);
        }
        let hist: Vec<u64> = w.batch_hist.iter().map(Counter::get).collect();
        // 1 → le 1, 3 → le 4, 64 → le 64; 65 and 1000 are in no finite bucket.
        assert_eq!(hist, [1, 0, 1, 0, 0, 0, 1, 2]);
        assert_eq!(w.batch_frames.get(), 1 + 3 + 64 + 65 + 1000);
    }
}
