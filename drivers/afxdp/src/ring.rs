//! The four AF_XDP rings (fill, completion, RX, TX) as single-producer / single-consumer views.
//!
//! Each ring is a power-of-two array of entries plus a producer index, a consumer index and a
//! flags word, all shared with the kernel through `mmap`. Indices are free-running `u32`s; an
//! entry lives at `index & mask`. Userspace is the producer of the fill and TX rings
//! ([`ProdRing`]) and the consumer of the RX and completion rings ([`ConsRing`]).
//!
//! Both sides keep a cached copy of the other side's index and only reload it (one acquire load)
//! when the cache says there is not enough room / not enough entries, so a burst costs one
//! shared-memory load and one store at most. Ordering is the one `libxdp` and the kernel use:
//!
//! * producer: write entries, then `store(producer, Release)`; read the consumer with `Acquire`
//!   so the kernel's reads of the entries we are about to overwrite have finished;
//! * consumer: `load(producer, Acquire)` before reading entries, then `store(consumer, Release)`
//!   once they are read, so the kernel cannot overwrite an entry we are still reading.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

/// `XDP_RING_NEED_WAKEUP`: the kernel wants a syscall to make progress on this ring.
pub const NEED_WAKEUP: u32 = libc::XDP_RING_NEED_WAKEUP;

/// Raw pointers to one ring's shared words and entries.
///
/// Invariant (established by whoever builds it, see [`RingPtrs::new`]): all four pointers stay
/// valid and suitably aligned for as long as the ring value exists, `size` is a power of two and
/// `entries` points to `size` entries of `T`.
#[derive(Debug)]
pub struct RingPtrs<T> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    size: u32,
    _t: PhantomData<T>,
}

impl<T: Copy> RingPtrs<T> {
    /// # Safety
    /// The pointers must be valid, aligned, and outlive the returned value (and every ring built
    /// from it); `entries` must point to `size` entries; `size` must be a power of two; nothing
    /// but the one peer (the kernel or a test's other half) may access the ring concurrently.
    pub unsafe fn new(
        producer: *const AtomicU32,
        consumer: *const AtomicU32,
        flags: *const AtomicU32,
        entries: *mut T,
        size: u32,
    ) -> Self {
        assert!(size.is_power_of_two(), "ring size {size} is not a power of two");
        Self { producer, consumer, flags, entries, size, _t: PhantomData }
    }

    #[inline]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: valid and aligned for the ring's lifetime (constructor contract).
        unsafe { &*self.producer }
    }

    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    #[inline]
    fn flags(&self) -> u32 {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed)
    }

    #[inline]
    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: `idx & (size - 1) < size` and `entries` points to `size` entries.
        unsafe { self.entries.add((idx & (self.size - 1)) as usize) }
    }

    #[inline]
    fn write(&self, idx: u32, v: T) {
        let p = self.slot(idx);
        // SAFETY: the slot belongs to the producer between the consumer index (loaded with
        // Acquire) and the producer index it has not yet published.
        unsafe { p.write_volatile(v) }
    }

    #[inline]
    fn read(&self, idx: u32) -> T {
        let p = self.slot(idx);
        // SAFETY: the slot was published by the producer (Acquire load of the producer index)
        // and is not reused until we publish our consumer index.
        unsafe { p.read_volatile() }
    }
}

// SAFETY: a ring is a handle on memory shared with exactly one peer; moving the handle to another
// thread is fine, it is never used from two threads at once (it is not Sync, methods take &mut).
unsafe impl<T: Send> Send for RingPtrs<T> {}

/// The producer side of a ring (fill and TX rings).
#[derive(Debug)]
pub struct ProdRing<T> {
    r: RingPtrs<T>,
    /// Our producer index (the next slot we write); published on `submit`.
    cached_prod: u32,
    /// The consumer index last seen plus `size`: we may write up to (not including) this index.
    cached_limit: u32,
}

impl<T: Copy> ProdRing<T> {
    /// The producer side of `r`, picking up its current indices.
    pub fn new(r: RingPtrs<T>) -> Self {
        let prod = r.producer().load(Ordering::Relaxed);
        let cons = r.consumer().load(Ordering::Acquire);
        let limit = cons.wrapping_add(r.size);
        Self { r, cached_prod: prod, cached_limit: limit }
    }

    /// Entries in the ring (a power of two).
    pub fn size(&self) -> u32 {
        self.r.size
    }

    /// Free slots, reloading the consumer index only when the cache shows fewer than `want`.
    #[inline]
    pub fn free(&mut self, want: u32) -> u32 {
        let free = self.cached_limit.wrapping_sub(self.cached_prod);
        if free >= want {
            return free;
        }
        self.cached_limit = self.r.consumer().load(Ordering::Acquire).wrapping_add(self.r.size);
        self.cached_limit.wrapping_sub(self.cached_prod)
    }

    /// Writes as many of `items` as fit and publishes them with one release store; returns how
    /// many (a prefix of `items`).
    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "`items` is a burst, far below 2^32; `i < n` and `n` are at most free slots, a u32"
    )]
    pub fn produce(&mut self, items: &[T]) -> usize {
        let n = (self.free(items.len() as u32) as usize).min(items.len());
        for (i, &v) in items[..n].iter().enumerate() {
            self.r.write(self.cached_prod.wrapping_add(i as u32), v);
        }
        if n > 0 {
            self.cached_prod = self.cached_prod.wrapping_add(n as u32);
            self.r.producer().store(self.cached_prod, Ordering::Release);
        }
        n
    }

    /// Entries published but not yet consumed by the peer (reloads the consumer index).
    pub fn outstanding(&mut self) -> u32 {
        self.free(u32::MAX);
        self.r.size - self.cached_limit.wrapping_sub(self.cached_prod)
    }

    /// Entries published but not yet consumed, in ring order (shutdown accounting).
    pub fn unconsumed(&self) -> impl Iterator<Item = T> + '_ {
        let cons = self.r.consumer().load(Ordering::Acquire);
        let n = self.cached_prod.wrapping_sub(cons);
        (0..n).map(move |i| self.r.read(cons.wrapping_add(i)))
    }

    /// True when the peer asked for a wakeup syscall (`XDP_RING_NEED_WAKEUP`).
    #[inline]
    pub fn needs_wakeup(&self) -> bool {
        self.r.flags() & NEED_WAKEUP != 0
    }
}

/// The consumer side of a ring (RX and completion rings).
#[derive(Debug)]
pub struct ConsRing<T> {
    r: RingPtrs<T>,
    /// The producer index last seen.
    cached_prod: u32,
    /// Our consumer index (next entry to read); published on release.
    cached_cons: u32,
}

impl<T: Copy> ConsRing<T> {
    /// The consumer side of `r`, picking up its current indices.
    pub fn new(r: RingPtrs<T>) -> Self {
        let cons = r.consumer().load(Ordering::Relaxed);
        let prod = r.producer().load(Ordering::Acquire);
        Self { r, cached_prod: prod, cached_cons: cons }
    }

    /// Entries in the ring (a power of two).
    pub fn size(&self) -> u32 {
        self.r.size
    }

    /// Entries available, reloading the producer index only when the cache shows fewer than `want`.
    #[inline]
    pub fn available(&mut self, want: u32) -> u32 {
        let avail = self.cached_prod.wrapping_sub(self.cached_cons);
        if avail >= want {
            return avail;
        }
        self.cached_prod = self.r.producer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Copies up to `out.len()` entries into `out` and releases them with one release store;
    /// returns how many.
    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "`out` is a burst, far below 2^32; `i < n` and `n` are at most the entries available, a u32"
    )]
    pub fn consume(&mut self, out: &mut [T]) -> usize {
        let n = (self.available(out.len() as u32) as usize).min(out.len());
        for (i, slot) in out[..n].iter_mut().enumerate() {
            *slot = self.r.read(self.cached_cons.wrapping_add(i as u32));
        }
        if n > 0 {
            self.cached_cons = self.cached_cons.wrapping_add(n as u32);
            self.r.consumer().store(self.cached_cons, Ordering::Release);
        }
        n
    }

    /// True when the peer asked for a wakeup syscall (`XDP_RING_NEED_WAKEUP`).
    #[inline]
    pub fn needs_wakeup(&self) -> bool {
        self.r.flags() & NEED_WAKEUP != 0
    }
}

/// Heap-backed rings for tests: the same layout as the kernel's (indices then entries).
#[cfg(test)]
pub(crate) mod fake {
    use super::*;

    pub(crate) struct FakeRing<T> {
        pub(crate) producer: Box<AtomicU32>,
        pub(crate) consumer: Box<AtomicU32>,
        pub(crate) flags: Box<AtomicU32>,
        pub(crate) entries: Box<[T]>,
    }

    impl<T: Copy + Default> FakeRing<T> {
        pub(crate) fn new(size: u32, start: u32) -> Self {
            Self {
                producer: Box::new(AtomicU32::new(start)),
                consumer: Box::new(AtomicU32::new(start)),
                flags: Box::new(AtomicU32::new(0)),
                entries: vec![T::default(); size as usize].into_boxed_slice(),
            }
        }

        /// A view on the ring. The fake must outlive it.
        pub(crate) fn ptrs(&mut self) -> RingPtrs<T> {
            let size = u32::try_from(self.entries.len()).unwrap();
            // SAFETY: boxed fields never move; tests keep the fake alive longer than the rings
            // and use each side from one thread.
            unsafe { RingPtrs::new(&*self.producer, &*self.consumer, &*self.flags, self.entries.as_mut_ptr(), size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeRing;
    use super::*;

    #[test]
    fn produce_consume_in_bulk_and_respect_capacity() {
        let mut f = FakeRing::<u64>::new(8, 0);
        let mut p = ProdRing::new(f.ptrs());
        let mut c = ConsRing::new(f.ptrs());
        assert_eq!(p.free(1), 8);
        assert_eq!(p.produce(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 8, "only the ring's capacity fits");
        assert_eq!(p.free(1), 0);
        assert_eq!(p.outstanding(), 8);
        let mut out = [0u64; 3];
        assert_eq!(c.consume(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(p.free(3), 3, "released slots become free after a consumer reload");
        assert_eq!(p.unconsumed().collect::<Vec<_>>(), vec![4, 5, 6, 7, 8]);
        let mut out = [0u64; 16];
        assert_eq!(c.consume(&mut out), 5);
        assert_eq!(&out[..5], &[4, 5, 6, 7, 8]);
        assert_eq!(c.consume(&mut out), 0);
    }

    #[test]
    fn indices_wrap_around_u32() {
        let start = u32::MAX - 3;
        let mut f = FakeRing::<u64>::new(4, start);
        let mut p = ProdRing::new(f.ptrs());
        let mut c = ConsRing::new(f.ptrs());
        let mut out = [0u64; 4];
        for round in 0..10u64 {
            let items = [round * 10, round * 10 + 1, round * 10 + 2];
            assert_eq!(p.produce(&items), 3);
            assert_eq!(c.consume(&mut out), 3);
            assert_eq!(&out[..3], &items);
        }
        assert_eq!(f.producer.load(Ordering::Relaxed), start.wrapping_add(30));
    }

    #[test]
    fn cached_indices_avoid_reloads_until_needed() {
        let mut f = FakeRing::<u64>::new(16, 0);
        let mut p = ProdRing::new(f.ptrs());
        assert_eq!(p.produce(&[0; 16]), 16);
        // The peer consumes behind our back; the cache still says "full"…
        f.consumer.store(16, Ordering::Release);
        assert_eq!(p.cached_limit.wrapping_sub(p.cached_prod), 0);
        // …until we ask for room, which reloads once.
        assert_eq!(p.free(1), 16);
    }

    #[test]
    fn need_wakeup_flag_is_read() {
        let mut f = FakeRing::<u64>::new(4, 0);
        let p = ProdRing::new(f.ptrs());
        assert!(!p.needs_wakeup());
        f.flags.store(NEED_WAKEUP, Ordering::Relaxed);
        assert!(p.needs_wakeup());
    }

    #[test]
    fn spsc_across_threads_keeps_order_and_loses_nothing() {
        const N: u64 = 200_000;
        let mut f = FakeRing::<wasmswitch_core::Desc>::new(64, 7);
        let mut p = ProdRing::new(f.ptrs());
        let mut c = ConsRing::new(f.ptrs());
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut next = 0u64;
                let mut buf = [wasmswitch_core::Desc::default(); 19];
                while next < N {
                    let k = usize::try_from((N - next).min(buf.len() as u64)).unwrap();
                    for (i, d) in buf[..k].iter_mut().enumerate() {
                        *d = wasmswitch_core::Desc {
                            addr: next + i as u64,
                            len: u32::try_from(next + i as u64).unwrap() ^ 0x5a5a,
                            options: 0,
                        };
                    }
                    next += p.produce(&buf[..k]) as u64;
                }
            });
            s.spawn(move || {
                let mut expect = 0u64;
                let mut out = [wasmswitch_core::Desc::default(); 23];
                while expect < N {
                    let n = c.consume(&mut out);
                    for d in &out[..n] {
                        assert_eq!(d.addr, expect);
                        assert_eq!(d.len, u32::try_from(expect).unwrap() ^ 0x5a5a, "entry read before it was written");
                        expect += 1;
                    }
                }
            });
        });
    }
}
