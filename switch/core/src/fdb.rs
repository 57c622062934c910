//! The forwarding database: MAC → port, learned from traffic, aged out when silent.
//!
//! Lock-free and shared by all workers. The table is an array of 64-byte buckets of eight
//! `AtomicU64` slots, each slot packing a MAC (48 bits) and port+1 (16 bits), so a lookup reads
//! one cache line with plain loads and can never see a torn entry. Learning writes a slot only
//! when something changes: a new MAC, a MAC that moved, or a last-seen tick that advanced (ticks
//! are coarse, one second by default), so steady traffic costs no stores and no cache-line
//! bouncing between workers. A full bucket evicts its stalest entry.
//!
//! Learning is shared across VLANs (SVL): one entry per MAC whatever its VLAN.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::counter::Counter;
use crate::port::PortId;
use crate::wire::MacAddr;

const SLOTS: usize = 8;
const MAC_MASK: u64 = (1 << 48) - 1;

/// Eight entries and their last-seen ticks: two adjacent cache lines, prefetched together.
#[repr(align(128))]
struct Bucket {
    slots: [AtomicU64; SLOTS],
    seen: [AtomicU32; SLOTS],
}

/// What a learn call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Known, same port; nothing written (or only the last-seen tick).
    Known,
    /// New entry.
    New,
    /// Known on another port; moved.
    Moved,
    /// New entry that evicted a stale one from a full bucket.
    Evicted,
}

/// Counters written by the aging sweep (a single thread).
#[derive(Debug, Default)]
pub struct FdbStats {
    pub aged: Counter,
}

pub struct Fdb {
    buckets: Box<[Bucket]>,
    mask: usize,
    /// Read only by the aging sweep, so an atomic (relaxed) costs the datapath nothing and lets
    /// a reload change it on a running table.
    aging_ticks: AtomicU32,
    pub stats: FdbStats,
}

impl std::fmt::Debug for Fdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fdb").field("capacity", &self.capacity()).field("aging_ticks", &self.aging_ticks()).finish()
    }
}

#[inline]
fn pack(mac: u64, port: PortId) -> u64 {
    mac | ((port as u64 + 1) << 48)
}

#[inline]
fn slot_port(v: u64) -> PortId {
    ((v >> 48) - 1) as PortId
}

impl Fdb {
    /// A table with room for at least `capacity` MACs, forgetting entries silent for more than
    /// `aging_ticks` ticks.
    pub fn new(capacity: usize, aging_ticks: u32) -> Self {
        let buckets = capacity.div_ceil(SLOTS).next_power_of_two().max(1);
        Self {
            buckets: (0..buckets).map(|_| Bucket { slots: Default::default(), seen: Default::default() }).collect(),
            mask: buckets - 1,
            aging_ticks: AtomicU32::new(aging_ticks),
            stats: FdbStats::default(),
        }
    }

    /// Ticks an entry may stay silent before the sweep forgets it.
    pub fn aging_ticks(&self) -> u32 {
        self.aging_ticks.load(Ordering::Relaxed)
    }

    /// Changes the aging time; the next sweep uses it.
    pub fn set_aging_ticks(&self, ticks: u32) {
        self.aging_ticks.store(ticks, Ordering::Relaxed);
    }

    pub fn capacity(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    #[inline]
    fn bucket_of(&self, mac: u64) -> usize {
        // Fibonacci hashing: MACs of one vendor differ in the low bytes only.
        ((mac.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 40) as usize & self.mask
    }

    /// Starts loading the bucket of `mac` into cache (a batch's lookups are prefetched in one
    /// pass before any of them is used, so their cache misses overlap).
    #[inline]
    pub fn prefetch(&self, mac: MacAddr) {
        let b: *const Bucket = &self.buckets[self.bucket_of(mac.to_u64())];
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // A bucket is 128 bytes: the second cache line starts 64 bytes in, still inside it.
            let second = b.cast::<i8>().wrapping_add(64);
            // SAFETY: prefetch is a hint with no memory effects; the pointer is to a live bucket.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(b.cast()) };
            // SAFETY: as above; `second` points inside the same bucket.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(second) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = b;
    }

    /// The port `mac` was learned on.
    #[inline]
    pub fn lookup(&self, mac: MacAddr) -> Option<PortId> {
        let m = mac.to_u64();
        let b = &self.buckets[self.bucket_of(m)];
        for s in &b.slots {
            let v = s.load(Ordering::Acquire);
            if v != 0 && v & MAC_MASK == m {
                return Some(slot_port(v));
            }
        }
        None
    }

    /// Records that `mac` was seen on `port` at tick `now`.
    #[inline]
    pub fn learn(&self, mac: MacAddr, port: PortId, now: u32) -> Learned {
        let m = mac.to_u64();
        let bi = self.bucket_of(m);
        let b = &self.buckets[bi];
        let want = pack(m, port);
        let mut empty = None;
        for (i, s) in b.slots.iter().enumerate() {
            let v = s.load(Ordering::Acquire);
            if v == 0 {
                empty.get_or_insert(i);
                continue;
            }
            if v & MAC_MASK == m {
                let seen = &b.seen[i];
                if seen.load(Ordering::Relaxed) != now {
                    seen.store(now, Ordering::Relaxed);
                }
                if v == want {
                    return Learned::Known;
                }
                // Moved: last writer wins if two workers see it on two ports at once.
                s.store(want, Ordering::Release);
                return Learned::Moved;
            }
        }
        self.learn_slow(bi, want, now, empty)
    }

    #[cold]
    fn learn_slow(&self, bi: usize, want: u64, now: u32, empty: Option<usize>) -> Learned {
        let b = &self.buckets[bi];
        if let Some(i) = empty {
            // Tick first so the aging sweep never sees the new entry with a stale time.
            b.seen[i].store(now, Ordering::Relaxed);
            if b.slots[i].compare_exchange(0, want, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Learned::New;
            }
        }
        // Bucket full (or lost a race for the empty slot): evict the stalest entry.
        let oldest = (0..SLOTS).max_by_key(|&i| now.wrapping_sub(b.seen[i].load(Ordering::Relaxed))).unwrap_or(0);
        b.seen[oldest].store(now, Ordering::Relaxed);
        b.slots[oldest].store(want, Ordering::Release);
        Learned::Evicted
    }

    /// Removes entries silent for longer than the aging time; returns how many. Run by one
    /// housekeeping thread (it owns `stats.aged`).
    pub fn age(&self, now: u32) -> usize {
        let mut aged = 0;
        let aging_ticks = self.aging_ticks();
        for b in self.buckets.iter() {
            for (i, s) in b.slots.iter().enumerate() {
                let v = s.load(Ordering::Acquire);
                if v == 0 {
                    continue;
                }
                let seen = b.seen[i].load(Ordering::Relaxed);
                if now.wrapping_sub(seen) > aging_ticks
                    && s.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
                {
                    aged += 1;
                }
            }
        }
        self.stats.aged.add(aged as u64);
        aged
    }

    /// Forgets every entry on `port` (port went down).
    pub fn flush_port(&self, port: PortId) {
        for b in self.buckets.iter() {
            for s in &b.slots {
                let v = s.load(Ordering::Acquire);
                if v != 0 && slot_port(v) == port {
                    let _ = s.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
        }
    }

    /// Every entry as (MAC, port, ticks since last seen).
    pub fn entries(&self, now: u32) -> Vec<(MacAddr, PortId, u32)> {
        let mut out = Vec::new();
        for b in self.buckets.iter() {
            for (i, s) in b.slots.iter().enumerate() {
                let v = s.load(Ordering::Acquire);
                if v != 0 {
                    let seen = b.seen[i].load(Ordering::Relaxed);
                    out.push((MacAddr::from_u64(v & MAC_MASK), slot_port(v), now.wrapping_sub(seen)));
                }
            }
        }
        out.sort();
        out
    }

    /// Number of entries (walks the table: for metrics, not the data path).
    pub fn len(&self) -> usize {
        self.buckets.iter().flat_map(|b| b.slots.iter()).filter(|s| s.load(Ordering::Relaxed) != 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A table of `capacity` with this one's aging time, entries (each with its last-seen
    /// tick) and counters: what a reload that changes `fdb.capacity` swaps in. Entries that do
    /// not fit a smaller table are dropped stalest first by the usual eviction.
    pub fn resized(&self, capacity: usize, now: u32) -> Fdb {
        let new = Fdb::new(capacity, self.aging_ticks());
        let mut entries = self.entries(now);
        // Stalest first, so the freshest win where buckets overflow.
        entries.sort_by_key(|&(_, _, age)| std::cmp::Reverse(age));
        for (mac, port, age) in entries {
            new.learn(mac, port, now.wrapping_sub(age));
        }
        new.stats.aged.add(self.stats.aged.get());
        new
    }
}

/// The table the switch uses now, for the threads that are not workers (aging, metrics, API);
/// a reload that changes the capacity puts a [`Fdb::resized`] one here and in every worker.
#[derive(Debug)]
pub struct CurrentFdb(RwLock<Arc<Fdb>>);

impl CurrentFdb {
    pub fn new(fdb: Arc<Fdb>) -> Self {
        Self(RwLock::new(fdb))
    }

    pub fn get(&self) -> Arc<Fdb> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, fdb: Arc<Fdb>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = fdb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u64) -> MacAddr {
        MacAddr::from_u64(0x0200_0000_0000 | i)
    }

    #[test]
    fn learn_lookup_move() {
        let f = Fdb::new(1024, 300);
        assert_eq!(f.lookup(mac(1)), None);
        assert_eq!(f.learn(mac(1), 3, 0), Learned::New);
        assert_eq!(f.learn(mac(1), 3, 0), Learned::Known);
        assert_eq!(f.lookup(mac(1)), Some(3));
        assert_eq!(f.learn(mac(1), 0, 1), Learned::Moved);
        assert_eq!(f.lookup(mac(1)), Some(0));
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn aging_forgets_silent_macs_only() {
        let f = Fdb::new(64, 10);
        f.learn(mac(1), 1, 0);
        f.learn(mac(2), 2, 0);
        f.learn(mac(2), 2, 8); // refreshed
        assert_eq!(f.age(11), 1);
        assert_eq!(f.lookup(mac(1)), None);
        assert_eq!(f.lookup(mac(2)), Some(2));
        assert_eq!(f.stats.aged.get(), 1);
        // A longer aging time set on the running table applies to the next sweep.
        f.set_aging_ticks(100);
        assert_eq!(f.age(50), 0);
        assert_eq!(f.lookup(mac(2)), Some(2));
        f.set_aging_ticks(5);
        assert_eq!(f.age(50), 1);
    }

    #[test]
    fn full_bucket_evicts_stalest() {
        let f = Fdb::new(8, 100); // one bucket
        for i in 0..8 {
            f.learn(mac(i), 1, i as u32);
        }
        assert_eq!(f.learn(mac(100), 2, 20), Learned::Evicted);
        assert_eq!(f.lookup(mac(0)), None, "the stalest entry went");
        assert_eq!(f.lookup(mac(100)), Some(2));
        assert_eq!(f.lookup(mac(7)), Some(1));
    }

    #[test]
    fn port_zero_and_mac_zero_are_valid() {
        let f = Fdb::new(64, 10);
        f.learn(MacAddr([0; 6]), 0, 0);
        assert_eq!(f.lookup(MacAddr([0; 6])), Some(0));
    }

    #[test]
    fn concurrent_learning_is_consistent() {
        let f = std::sync::Arc::new(Fdb::new(65536, 100));
        let hs: Vec<_> = (0..2)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        f.learn(mac(i * 2 + t), t as PortId, 0);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        for i in 0..4000u64 {
            assert_eq!(f.lookup(mac(i)), Some((i % 2) as PortId));
        }
    }

    #[test]
    fn a_resized_table_keeps_entries_ages_and_counters() {
        let old = Fdb::new(64, 300);
        for i in 0..40u64 {
            old.learn(MacAddr::from_u64(0x0200_0000_0000 + i), (i % 3) as PortId, i as u32);
        }
        old.stats.aged.add(7);
        let big = old.resized(4096, 100);
        assert_eq!(big.entries(100), old.entries(100));
        assert_eq!(big.stats.aged.get(), 7);
        assert_eq!(big.aging_ticks(), 300);
        let small = old.resized(8, 100);
        assert!(small.len() <= small.capacity() && !small.is_empty());
        // What was kept is what the old table said.
        for (mac, port, age) in small.entries(100) {
            assert!(old.entries(100).contains(&(mac, port, age)));
        }
    }
}
