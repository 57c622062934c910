//! The frame pool, with the kernel page_pool's semantics.
//!
//! * Each worker has a [`PoolCache`]: a LIFO stack of free frame addresses (so the frame used
//!   last, still warm in cache, is reused first), touched by no other thread.
//! * Refill and surplus go through the [`SharedPool`]'s bounded recycle ring, always in bulk
//!   under one lock acquisition (`page_pool_refill_alloc_cache` / `page_pool_put_page_bulk`).
//! * When the ring is full, frames go to the release list (the kernel would hand the page back
//!   to the page allocator); the release list is also where every frame starts, and where the
//!   slow allocation path takes from. Nothing is ever dropped on the floor.
//! * [`BulkReturn`] is the `xdp_frame_bulk` pattern of seed 000: TX completions are collected
//!   up to 16 frames of one pool and returned in one call, flushed when full or when the pool
//!   changes.
//!
//! Stats use the kernel's names and are per-worker single-writer counters.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::counter::Counter;
use crate::umem::Umem;

/// Frames taken from the recycle ring per refill, and returned per bulk (`XDP_BULK_QUEUE_SIZE`).
pub const BULK: usize = 16;
/// Default per-worker alloc cache size (`PP_ALLOC_CACHE_SIZE`).
pub const CACHE_SIZE: usize = 128;

pub use crate::types::PoolId;

/// Pools (UMEM groups) a worker can draw from.
pub const MAX_POOLS: usize = 8;

/// Pool statistics of one worker, named like the kernel's `page_pool_stats`.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Allocation served from the worker's cache.
    pub alloc_fast: Counter,
    /// Cache refilled (in bulk) from the recycle ring.
    pub alloc_refill: Counter,
    /// Cache refilled from the release list because the ring was empty.
    pub alloc_slow: Counter,
    /// The recycle ring was empty when a refill was attempted.
    pub alloc_empty: Counter,
    /// No frame anywhere: the allocation failed.
    pub alloc_failed: Counter,
    /// Frame returned straight into the worker's cache.
    pub recycle_cached: Counter,
    /// Cache was full on return.
    pub recycle_cache_full: Counter,
    /// Frame returned to the recycle ring.
    pub recycle_ring: Counter,
    /// The recycle ring was full on return.
    pub recycle_ring_full: Counter,
    /// Frame went to the release list.
    pub recycle_released: Counter,
}

struct Lists {
    /// Bounded recycle ring (used LIFO like a stack: the freshest frames are handed out first).
    ring: Vec<u64>,
    /// Where frames start and where they go when the ring is full. Unbounded, never loses one.
    released: Vec<u64>,
}

/// The part of a pool shared by all workers: the UMEM, the recycle ring, the release list.
pub struct SharedPool {
    id: PoolId,
    umem: Arc<Umem>,
    ring_capacity: usize,
    // One lock for ring and release list: every operation on them is a bulk one, so the lock is
    // taken once per 16 frames at most (and not at all while caches absorb the traffic).
    lists: Mutex<Lists>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool").field("id", &self.id).field("frames", &self.umem.frames()).finish()
    }
}

impl SharedPool {
    /// A pool over every frame of `umem`, with a recycle ring of `ring_capacity` entries.
    pub fn new(id: PoolId, umem: Arc<Umem>, ring_capacity: usize) -> Arc<Self> {
        let fs = umem.frame_size() as u64;
        // Reverse order so the first allocations get the lowest addresses (easier to read in traces).
        let released: Vec<u64> = (0..umem.frames() as u64).rev().map(|i| i * fs).collect();
        Arc::new(Self {
            id,
            umem,
            ring_capacity: ring_capacity.max(BULK),
            lists: Mutex::new(Lists { ring: Vec::with_capacity(ring_capacity.max(BULK)), released }),
        })
    }

    /// This pool's id.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The frame memory the pool hands out.
    pub fn umem(&self) -> &Arc<Umem> {
        &self.umem
    }

    /// Every frame of the pool, wherever it is now.
    pub fn total_frames(&self) -> usize {
        self.umem.frames() as usize
    }

    fn lock(&self) -> MutexGuard<'_, Lists> {
        // A panic while holding this lock cannot leave the lists inconsistent (pushes and
        // truncations only), so a poisoned lock is still usable.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frames currently in the ring and the release list (not in caches or drivers).
    pub fn frames_at_rest(&self) -> usize {
        let l = self.lock();
        l.ring.len() + l.released.len()
    }

    /// Every frame address at rest in the shared lists (for the leak and double-free checks).
    pub fn snapshot_at_rest(&self) -> Vec<u64> {
        let l = self.lock();
        l.ring.iter().chain(l.released.iter()).copied().collect()
    }

    /// Returns frames in bulk from any thread (the cross-thread path, e.g. host workers), under
    /// one lock acquisition: into the ring while it has room, the rest to the release list.
    pub fn put_bulk(&self, frames: &[u64], stats: &PoolStats) {
        if frames.is_empty() {
            return;
        }
        let mut l = self.lock();
        let room = self.ring_capacity - l.ring.len();
        let to_ring = frames.len().min(room);
        l.ring.extend_from_slice(&frames[..to_ring]);
        stats.recycle_ring.add(to_ring as u64);
        if to_ring < frames.len() {
            let rest = &frames[to_ring..];
            l.released.extend(rest.iter().map(|&a| self.umem.frame_base(a)));
            stats.recycle_ring_full.inc();
            stats.recycle_released.add(rest.len() as u64);
        }
    }

    /// Takes up to `out.len()` frames under one lock: ring first, then the release list.
    fn take_bulk(&self, out: &mut Vec<u64>, want: usize, stats: &PoolStats) -> usize {
        let mut l = self.lock();
        let from_ring = want.min(l.ring.len());
        if from_ring > 0 {
            let start = l.ring.len() - from_ring;
            out.extend(l.ring.drain(start..));
            stats.alloc_refill.inc();
        }
        let mut got = from_ring;
        if got < want {
            stats.alloc_empty.inc();
            let n = (want - got).min(l.released.len());
            if n > 0 {
                let start = l.released.len() - n;
                out.extend(l.released.drain(start..));
                stats.alloc_slow.inc();
                got += n;
            }
        }
        got
    }
}

/// How a worker allocates: with its page_pool-style cache, or (ablation) straight from the
/// shared locked lists one frame at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocMode {
    /// The per-worker LIFO cache, refilled from and spilled to the shared lists in bulk.
    Recycling,
    /// One frame at a time through the shared lists' lock (the ablation).
    SharedLocked,
}

/// One worker's handle on a pool: its private LIFO alloc cache and its stats.
pub struct PoolCache {
    shared: Arc<SharedPool>,
    cache: Vec<u64>,
    capacity: usize,
    mode: AllocMode,
    stats: Arc<PoolStats>,
}

impl PoolCache {
    /// A cache of up to `capacity` frames (at least [`BULK`]) on `shared`, counting into
    /// stats of its own.
    pub fn new(shared: Arc<SharedPool>, capacity: usize, mode: AllocMode) -> Self {
        Self::with_stats(shared, capacity, mode, Arc::default())
    }

    /// A cache counting into `stats`: a worker with a cache on each of several pools (one per
    /// UMEM group) counts them all as one, still single-writer.
    pub fn with_stats(shared: Arc<SharedPool>, capacity: usize, mode: AllocMode, stats: Arc<PoolStats>) -> Self {
        let capacity = capacity.max(BULK);
        Self { shared, cache: Vec::with_capacity(capacity + BULK), capacity, mode, stats }
    }

    /// Changes how the cache allocates ([`crate::pipeline::Pipeline::set_variant`]). On an
    /// empty cache only: what it holds was taken under the old mode.
    pub fn set_mode(&mut self, mode: AllocMode) {
        assert!(self.cache.is_empty(), "an allocation mode changes on an empty cache only");
        self.mode = mode;
    }

    /// The pool this cache draws from.
    pub fn shared(&self) -> &Arc<SharedPool> {
        &self.shared
    }

    /// Its pool's id.
    pub fn id(&self) -> PoolId {
        self.shared.id
    }

    /// Its pool's frame memory.
    pub fn umem(&self) -> &Arc<Umem> {
        &self.shared.umem
    }

    /// The counters this cache writes.
    pub fn stats(&self) -> &Arc<PoolStats> {
        &self.stats
    }

    /// Frames sitting in this cache.
    pub fn cached(&self) -> &[u64] {
        &self.cache
    }

    /// Starts loading the line at `offset` into each of the next `n` frames [`PoolCache::alloc`]
    /// hands out (the cache's top), for a caller about to write there.
    #[inline]
    pub fn prefetch_next(&self, n: usize, offset: u64) {
        for &a in self.cache.iter().rev().take(n) {
            self.shared.umem.prefetch(a + offset);
        }
    }

    /// Allocates one frame (its base address), or `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&mut self) -> Option<u64> {
        if let Some(a) = self.cache.pop() {
            self.stats.alloc_fast.inc();
            return Some(a);
        }
        self.alloc_slow()
    }

    #[cold]
    fn alloc_slow(&mut self) -> Option<u64> {
        let want = if self.mode == AllocMode::Recycling { BULK } else { 1 };
        if self.shared.take_bulk(&mut self.cache, want, &self.stats) == 0 {
            self.stats.alloc_failed.inc();
            return None;
        }
        self.stats.alloc_fast.inc();
        self.cache.pop()
    }

    /// Allocates up to `out.len()` frames into `out`; returns how many (fill-ring refills).
    #[inline]
    pub fn alloc_bulk(&mut self, out: &mut [u64]) -> usize {
        if self.mode == AllocMode::SharedLocked {
            let mut n = 0;
            while n < out.len() {
                match self.alloc() {
                    Some(a) => out[n] = a,
                    None => break,
                }
                n += 1;
            }
            return n;
        }
        let mut n = 0;
        while n < out.len() {
            if self.cache.is_empty() {
                let want = (out.len() - n).clamp(BULK, self.capacity);
                if self.shared.take_bulk(&mut self.cache, want, &self.stats) == 0 {
                    self.stats.alloc_failed.inc();
                    break;
                }
            }
            let take = (out.len() - n).min(self.cache.len());
            let start = self.cache.len() - take;
            out[n..n + take].copy_from_slice(&self.cache[start..]);
            self.cache.truncate(start);
            self.stats.alloc_fast.add(take as u64);
            n += take;
        }
        n
    }

    /// Returns one frame: into the cache if it has room, otherwise to the ring.
    #[inline]
    pub fn put(&mut self, addr: u64) {
        let base = self.shared.umem.frame_base(addr);
        if self.mode == AllocMode::Recycling && self.cache.len() < self.capacity {
            self.cache.push(base);
            self.stats.recycle_cached.inc();
        } else {
            self.stats.recycle_cache_full.inc();
            self.shared.put_bulk(&[base], &self.stats);
        }
    }

    /// Returns frames in bulk: the cache takes what it has room for, the surplus goes to the
    /// ring in one lock acquisition.
    pub fn put_bulk(&mut self, frames: &[u64]) {
        if self.mode == AllocMode::SharedLocked {
            for &a in frames {
                self.put(a);
            }
            return;
        }
        let fb = !(self.shared.umem.frame_size() as u64 - 1);
        let room = self.capacity.saturating_sub(self.cache.len()).min(frames.len());
        self.cache.extend(frames[..room].iter().map(|&a| a & fb));
        self.stats.recycle_cached.add(room as u64);
        if room < frames.len() {
            self.stats.recycle_cache_full.inc();
            let mut surplus = [0u64; BULK];
            for chunk in frames[room..].chunks(BULK) {
                for (d, &a) in surplus.iter_mut().zip(chunk) {
                    *d = a & fb;
                }
                self.shared.put_bulk(&surplus[..chunk.len()], &self.stats);
            }
        }
    }

    /// Gives every cached frame back to the shared lists (worker shutdown).
    pub fn drain(&mut self) {
        let frames = std::mem::take(&mut self.cache);
        for chunk in frames.chunks(BULK) {
            self.shared.put_bulk(chunk, &self.stats);
        }
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        // A cache that goes away must not take frames with it.
        self.drain();
    }
}

/// Collects returned frames of one pool and hands them back 16 at a time (`xdp_frame_bulk`).
///
/// Lives on the stack of the completion loop; `flush` at the end of the loop is mandatory
/// (dropping a non-empty `BulkReturn` is a bug caught by a debug assertion).
#[derive(Debug)]
pub struct BulkReturn {
    pool: PoolId,
    /// The pool of the queued frames, kept to return them there when a frame of another pool
    /// comes (cloned when the pool changes, never per frame).
    owner: Option<Arc<SharedPool>>,
    count: usize,
    frames: [u64; BULK],
    /// 1 disables bulking (the single-return ablation).
    limit: usize,
}

impl Default for BulkReturn {
    fn default() -> Self {
        Self::new()
    }
}

impl BulkReturn {
    /// An empty queue of up to [`BULK`] frames; the first push names its pool.
    pub fn new() -> Self {
        Self { pool: PoolId(0), owner: None, count: 0, frames: [0; BULK], limit: BULK }
    }

    /// A `BulkReturn` that flushes after every frame (ablation of bulk return).
    pub fn single() -> Self {
        let mut b = Self::new();
        b.limit = 1;
        b
    }

    /// Queues `addr`, which belongs to `cache`'s pool; flushes first if the queue holds frames
    /// of another pool (as the kernel's `xdp_return_frame_bulk` does when the allocator
    /// changes), and after if it is full.
    #[inline]
    pub fn push(&mut self, cache: &mut PoolCache, addr: u64) {
        self.own(cache);
        self.frames[self.count] = addr;
        self.count += 1;
        if self.count >= self.limit {
            self.flush(cache);
        }
    }

    /// Queues every frame of `addrs` (all of `cache`'s pool): a driver's whole completion burst
    /// goes back in one bulk, the pool checked once rather than per frame.
    #[inline]
    pub fn push_all(&mut self, cache: &mut PoolCache, addrs: &[u64]) {
        if self.limit == 1 || addrs.len() < BULK {
            for &a in addrs {
                self.push(cache, a);
            }
            return;
        }
        self.own(cache);
        // What was queued first, then the burst: frames come back in the order they were given.
        self.flush(cache);
        cache.put_bulk(addrs);
    }

    /// Makes `cache`'s pool the owner of what is queued next (one compare when it already is).
    #[inline]
    fn own(&mut self, cache: &PoolCache) {
        if self.pool != cache.id() || self.owner.is_none() {
            self.switch_pool(cache);
        }
    }

    /// Returns the queued frames to `cache`'s pool.
    #[inline]
    pub fn flush(&mut self, cache: &mut PoolCache) {
        if self.count == 0 {
            return;
        }
        debug_assert_eq!(self.pool, cache.id());
        if self.count == 1 {
            cache.put(self.frames[0]);
        } else {
            cache.put_bulk(&self.frames[..self.count]);
        }
        self.count = 0;
    }

    /// Whether no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The queued frames (of another pool than `cache`'s) go back to their own pool, through
    /// its shared lists (counted in `cache`'s stats: the worker's); `cache`'s pool is the
    /// owner from now on. Cold: taken when the pool changes, not per frame.
    #[cold]
    fn switch_pool(&mut self, cache: &PoolCache) {
        if self.count > 0 {
            if let Some(owner) = &self.owner {
                owner.put_bulk(&self.frames[..self.count], cache.stats());
            }
            self.count = 0;
        }
        self.pool = cache.id();
        self.owner = Some(cache.shared().clone());
    }
}

impl Drop for BulkReturn {
    fn drop(&mut self) {
        debug_assert!(self.count == 0 || std::thread::panicking(), "BulkReturn dropped with {} frames", self.count);
    }
}

/// Frame accounting: every frame of the pool must be in exactly one place at rest.
pub fn check_no_leak(pool: &SharedPool, elsewhere: &[u64]) -> Result<(), String> {
    let mut all = pool.snapshot_at_rest();
    all.extend_from_slice(elsewhere);
    let total = pool.total_frames();
    if all.len() != total {
        return Err(format!(
            "{} of {} frames accounted for ({} missing)",
            all.len(),
            total,
            total as i64 - all.len() as i64
        ));
    }
    let fs = pool.umem().frame_size() as u64;
    let mut seen = vec![false; total];
    for a in all {
        // An index past usize (a 32-bit target) is no frame of this pool either.
        let i = usize::try_from(a / fs).unwrap_or(usize::MAX);
        if a % fs != 0 || i >= total {
            return Err(format!("address {a:#x} is not a frame base of this pool"));
        }
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("frame {a:#x} is at rest twice (double free)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(frames: u32, ring: usize) -> Arc<SharedPool> {
        SharedPool::new(PoolId(0), Arc::new(Umem::new(frames, 2048).unwrap()), ring)
    }

    #[test]
    fn alloc_refills_in_bulk_then_serves_from_cache() {
        let p = pool(256, 64);
        let mut c = PoolCache::new(p.clone(), 128, AllocMode::Recycling);
        let a = c.alloc().unwrap();
        assert_eq!(a, 0);
        assert_eq!(c.stats().alloc_slow.get(), 1);
        assert_eq!(c.cached().len(), BULK - 1);
        for _ in 0..BULK - 1 {
            c.alloc().unwrap();
        }
        assert_eq!(c.stats().alloc_fast.get(), BULK as u64);
        assert_eq!(c.stats().alloc_slow.get(), 1, "15 more came from the cache");
    }

    #[test]
    fn lifo_reuses_the_last_freed_frame() {
        let p = pool(64, 64);
        let mut c = PoolCache::new(p, 128, AllocMode::Recycling);
        let a = c.alloc().unwrap();
        let b = c.alloc().unwrap();
        c.put(a);
        c.put(b + 100); // any address inside the frame returns the frame
        assert_eq!(c.alloc(), Some(b));
        assert_eq!(c.alloc(), Some(a));
    }

    #[test]
    fn surplus_goes_to_ring_then_release_list_never_lost() {
        let p = pool(1024, 32);
        let mut c = PoolCache::new(p.clone(), 16, AllocMode::Recycling);
        let mut out = vec![0u64; 200];
        assert_eq!(c.alloc_bulk(&mut out), 200);
        c.put_bulk(&out);
        let s = c.stats();
        // 200 = 12 refills of 16 + 8: the cache kept 8, so it has room for 8 more.
        assert_eq!(s.recycle_cached.get(), 8);
        assert_eq!(s.recycle_ring.get(), 32);
        assert_eq!(s.recycle_released.get(), 200 - 8 - 32);
        assert!(s.recycle_ring_full.get() > 0);
        let cached = c.cached().to_vec();
        check_no_leak(&p, &cached).unwrap();
    }

    #[test]
    fn exhaustion_fails_cleanly_and_recovers() {
        let p = pool(20, 16);
        let mut c = PoolCache::new(p.clone(), 16, AllocMode::Recycling);
        let got: Vec<u64> = std::iter::from_fn(|| c.alloc()).collect();
        assert_eq!(got.len(), 20);
        assert!(c.stats().alloc_failed.get() >= 1);
        c.put_bulk(&got);
        assert!(c.alloc().is_some());
    }

    #[test]
    fn bulk_return_flushes_at_16() {
        let p = pool(64, 64);
        let mut c = PoolCache::new(p.clone(), 16, AllocMode::Recycling);
        let mut out = vec![0u64; 40];
        c.alloc_bulk(&mut out);
        let mut bulk = BulkReturn::new();
        for &a in &out[..15] {
            bulk.push(&mut c, a);
        }
        assert!(!bulk.is_empty());
        bulk.push(&mut c, out[15]);
        assert!(bulk.is_empty(), "16th frame triggers the flush");
        for &a in &out[16..] {
            bulk.push(&mut c, a);
        }
        bulk.flush(&mut c);
        let cached = c.cached().to_vec();
        check_no_leak(&p, &cached).unwrap();
    }

    #[test]
    fn bulk_return_gives_each_pool_its_own_frames_back_when_the_pool_changes() {
        let (a, b) = (SharedPool::new(PoolId(1), Umem::new(64, 2048).unwrap().into(), 64), pool(64, 64));
        let (mut ca, mut cb) =
            (PoolCache::new(a.clone(), 16, AllocMode::Recycling), PoolCache::new(b.clone(), 16, AllocMode::Recycling));
        let (mut fa, mut fb) = (vec![0u64; 5], vec![0u64; 7]);
        assert_eq!((ca.alloc_bulk(&mut fa), cb.alloc_bulk(&mut fb)), (5, 7));
        let mut bulk = BulkReturn::new();
        // Interleaved, as completions of ports of two groups would be.
        for &x in &fa[..3] {
            bulk.push(&mut ca, x);
        }
        for &x in &fb {
            bulk.push(&mut cb, x);
        }
        for &x in &fa[3..] {
            bulk.push(&mut ca, x);
        }
        bulk.flush(&mut ca);
        let (at_a, at_b) = (ca.cached().to_vec(), cb.cached().to_vec());
        check_no_leak(&a, &at_a).unwrap();
        check_no_leak(&b, &at_b).unwrap();
    }

    #[test]
    fn a_whole_burst_returns_to_its_own_pool_after_what_was_queued_for_another() {
        let (a, b) = (SharedPool::new(PoolId(1), Umem::new(64, 2048).unwrap().into(), 64), pool(64, 64));
        for limit_one in [false, true] {
            let (mut ca, mut cb) = (
                PoolCache::new(a.clone(), 16, AllocMode::Recycling),
                PoolCache::new(b.clone(), 16, AllocMode::Recycling),
            );
            // 40 frames: more than a bulk, and more than the caches hold (the rest overflows).
            let (mut fa, mut fb) = (vec![0u64; 40], vec![0u64; 3]);
            assert_eq!((ca.alloc_bulk(&mut fa), cb.alloc_bulk(&mut fb)), (40, 3));
            let mut bulk = if limit_one { BulkReturn::single() } else { BulkReturn::new() };
            bulk.push_all(&mut cb, &fb);
            bulk.push_all(&mut ca, &fa);
            assert!(bulk.is_empty(), "a burst of a bulk or more goes back at once");
            bulk.flush(&mut ca);
            let (at_a, at_b) = (ca.cached().to_vec(), cb.cached().to_vec());
            check_no_leak(&a, &at_a).unwrap();
            check_no_leak(&b, &at_b).unwrap();
        }
    }

    #[test]
    fn shared_locked_mode_has_no_cache() {
        let p = pool(64, 64);
        let mut c = PoolCache::new(p.clone(), 128, AllocMode::SharedLocked);
        let a = c.alloc().unwrap();
        assert!(c.cached().is_empty());
        c.put(a);
        assert!(c.cached().is_empty());
        check_no_leak(&p, &[]).unwrap();
    }

    #[test]
    fn leak_check_catches_loss_and_double_free() {
        let p = pool(8, 16);
        let mut c = PoolCache::new(p.clone(), 16, AllocMode::Recycling);
        let a = c.alloc().unwrap();
        let rest = c.cached().to_vec();
        assert!(check_no_leak(&p, &rest).unwrap_err().contains("missing"));
        let mut dup = rest.clone();
        dup.push(rest[0]);
        assert!(check_no_leak(&p, &dup).unwrap_err().contains("twice"));
        c.put(a);
    }

    #[test]
    fn cross_thread_bulk_return() {
        let p = pool(256, 256);
        let mut c = PoolCache::new(p.clone(), 16, AllocMode::Recycling);
        let mut out = vec![0u64; 64];
        c.alloc_bulk(&mut out);
        let p2 = p.clone();
        std::thread::spawn(move || {
            let stats = PoolStats::default();
            for chunk in out.chunks(BULK) {
                p2.put_bulk(chunk, &stats);
            }
            assert_eq!(stats.recycle_ring.get(), 64);
        })
        .join()
        .unwrap();
        let cached = c.cached().to_vec();
        check_no_leak(&p, &cached).unwrap();
    }
}
