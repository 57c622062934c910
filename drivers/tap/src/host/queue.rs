//! The datapath worker's side of the host port: its [`PortQueue`].

use std::sync::Arc;

use wasmswitch_core::pool::{BulkReturn, PoolCache, PoolStats, SharedPool};
use wasmswitch_core::{Desc, PortQueue, Umem};

use super::link::{flow_hash, put_shared, Doorbell, Link};
use crate::stats::HostQueueStats;

/// The host port as one datapath worker sees it: a normal [`PortQueue`].
///
/// * `tx_burst`: frames go into a per-host-worker bulk queue of `bulk` frames (steered by a flow
///   hash when there are several host workers); a full bulk queue is flushed into that worker's
///   ring at once, the rest at `flush_tx` (end of the burst). A full ring drops the frames
///   (counted in `ring_full`); they go back to the pool at the next `complete`.
/// * `rx_burst`: frames the host sent, read from the TAP by the host workers.
/// * `complete`: returns ring-full drops. Delivered frames are returned by the host worker itself
///   (`SharedPool::put_bulk`), so they never come back through here.
// Fields are `pub(super)`: `HostPort::start` wires each queue to its rings and doorbells.
pub struct HostPortQueue {
    pub(super) worker: usize,
    pub(super) umem: Arc<Umem>,
    pub(super) shared: Arc<SharedPool>,
    pub(super) links: Vec<Arc<Link>>,
    pub(super) bells: Vec<Arc<Doorbell>>,
    pub(super) bq: Vec<Vec<Desc>>,
    pub(super) pushed: Vec<bool>,
    pub(super) bulk: usize,
    pub(super) to_free: Vec<u64>,
    pub(super) stats: Arc<HostQueueStats>,
    pub(super) rr: usize,
    pub(super) released: bool,
}

impl std::fmt::Debug for HostPortQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPortQueue")
            .field("worker", &self.worker)
            .field("host_workers", &self.links.len())
            .field("bulk", &self.bulk)
            .finish()
    }
}

impl HostPortQueue {
    /// The datapath worker this queue belongs to.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// This queue's counters.
    pub fn stats(&self) -> &Arc<HostQueueStats> {
        &self.stats
    }

    #[inline]
    fn dest(&self, d: &Desc) -> usize {
        let m = self.links.len();
        if m == 1 {
            return 0;
        }
        // SAFETY: the pipeline handed us the frame (tx_burst), so this worker holds it; read only.
        let b = unsafe { self.umem.bytes(d.addr, (d.len as usize).min(34)) };
        flow_hash(b) as usize % m
    }

    fn flush_one(&mut self, h: usize) {
        let q = &self.bq[h];
        if q.is_empty() {
            return;
        }
        // SAFETY: this queue is the only producer of the down ring of pair (self.worker, h).
        let n = unsafe { self.links[h].down.push_bulk(q) };
        self.stats.flushes.inc();
        self.stats.ring_enqueued.add(n as u64);
        if n < q.len() {
            self.stats.ring_full.add((q.len() - n) as u64);
            self.to_free.extend(q[n..].iter().map(|d| d.addr));
        }
        if n > 0 {
            self.pushed[h] = true;
        }
        self.bq[h].clear();
    }

    fn release_inner(&mut self, mut give: impl FnMut(&[Desc])) {
        if self.released {
            return;
        }
        self.released = true;
        for q in self.bq.iter_mut() {
            give(q);
            q.clear();
        }
        for link in &self.links {
            link.exit(true, &mut give);
        }
    }
}

impl PortQueue for HostPortQueue {
    fn rx_burst(&mut self, _pool: &mut PoolCache, out: &mut [Desc]) -> usize {
        let m = self.links.len();
        let mut n = 0;
        for k in 0..m {
            if n == out.len() {
                break;
            }
            let h = (self.rr + k) % m;
            // SAFETY: this queue is the only consumer of the up ring of pair (self.worker, h).
            n += unsafe { self.links[h].up.pop_bulk(&mut out[n..]) };
        }
        self.rr = self.rr.wrapping_add(1);
        if n > 0 {
            self.stats.rx_frames.add(n as u64);
        }
        n
    }

    fn tx_burst(&mut self, descs: &[Desc]) -> usize {
        for d in descs {
            let h = self.dest(d);
            self.bq[h].push(*d);
            if self.bq[h].len() >= self.bulk {
                self.flush_one(h);
            }
        }
        self.stats.enqueued.add(descs.len() as u64);
        descs.len()
    }

    fn flush_tx(&mut self) {
        for h in 0..self.bq.len() {
            self.flush_one(h);
        }
        for h in 0..self.pushed.len() {
            if std::mem::take(&mut self.pushed[h]) && self.bells[h].ring() {
                self.stats.wakeups.inc();
            }
        }
    }

    fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
        let n = self.to_free.len();
        for &a in &self.to_free {
            bulk.push(pool, a);
        }
        self.to_free.clear();
        n
    }

    fn release_all(&mut self, pool: &mut PoolCache) {
        let mut addrs: Vec<u64> = std::mem::take(&mut self.to_free);
        self.release_inner(|ds| addrs.extend(ds.iter().map(|d| d.addr)));
        pool.put_bulk(&addrs);
    }

    fn frames_held(&self) -> usize {
        self.bq.iter().map(Vec::len).sum::<usize>() + self.to_free.len()
    }
}

impl Drop for HostPortQueue {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped without `release_all` (e.g. a worker that panicked): still no frame is lost.
        let shared = self.shared.clone();
        let stats = PoolStats::default();
        let umem = self.umem.clone();
        let to_free: Vec<Desc> =
            self.to_free.drain(..).map(|a| Desc { addr: umem.frame_base(a), len: 0, options: 0 }).collect();
        put_shared(&shared, &to_free, &stats);
        self.release_inner(|ds| put_shared(&shared, ds, &stats));
    }
}
