//! A bounded single-producer single-consumer ring of descriptors, lock-free.
//!
//! One ring per direction per (datapath worker, host worker) pair, so no ring ever has two
//! producers or two consumers; the types that own the ends ([`crate::HostPortQueue`] and the
//! host worker) enforce that, which is why push and pop are `unsafe fn`s here. Both move whole
//! bursts: one acquire load and one release store per call, not per descriptor.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use wasmswitch_core::Desc;

#[repr(align(64))]
struct Padded(AtomicUsize);

pub(crate) struct Spsc {
    mask: usize,
    slots: Box<[UnsafeCell<Desc>]>,
    /// Consumer position (next slot to pop).
    head: Padded,
    /// Producer position (next slot to fill).
    tail: Padded,
}

// SAFETY: slots are only written by the single producer between its acquire of `head` and its
// release of `tail`, and only read by the single consumer after acquiring that `tail`; the
// single-producer/single-consumer contract is on `push_bulk`/`pop_bulk`.
unsafe impl Sync for Spsc {}
// SAFETY: as above; the ring holds plain `Desc` values.
unsafe impl Send for Spsc {}

impl Spsc {
    pub(crate) fn new(capacity: usize) -> Self {
        let cap = capacity.max(2).next_power_of_two();
        Self {
            mask: cap - 1,
            slots: (0..cap).map(|_| UnsafeCell::new(Desc::default())).collect(),
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Entries in the ring (exact when called by either end, a snapshot otherwise).
    pub(crate) fn len(&self) -> usize {
        let tail = self.tail.0.load(Ordering::Acquire);
        let head = self.head.0.load(Ordering::Acquire);
        tail.wrapping_sub(head)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pushes a prefix of `items`; returns how many fit (never blocks).
    ///
    /// # Safety
    /// At most one thread is the producer at any time.
    pub(crate) unsafe fn push_bulk(&self, items: &[Desc]) -> usize {
        let tail = self.tail.0.load(Ordering::Relaxed);
        let head = self.head.0.load(Ordering::Acquire);
        let free = self.capacity() - tail.wrapping_sub(head);
        let n = items.len().min(free);
        for (i, d) in items[..n].iter().enumerate() {
            // SAFETY: slot `tail + i` is free (the consumer released it, acquire above) and only
            // this producer writes it until the release store below publishes it.
            unsafe { *self.slots[tail.wrapping_add(i) & self.mask].get() = *d };
        }
        self.tail.0.store(tail.wrapping_add(n), Ordering::Release);
        n
    }

    /// Pops up to `out.len()` entries into `out`; returns how many.
    ///
    /// # Safety
    /// At most one thread is the consumer at any time.
    pub(crate) unsafe fn pop_bulk(&self, out: &mut [Desc]) -> usize {
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Acquire);
        let n = out.len().min(tail.wrapping_sub(head));
        for (i, o) in out[..n].iter_mut().enumerate() {
            // SAFETY: slot `head + i` was published by the producer (acquire of `tail` above) and
            // is not reused until the release store of `head` below.
            *o = unsafe { *self.slots[head.wrapping_add(i) & self.mask].get() };
        }
        self.head.0.store(head.wrapping_add(n), Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(a: u64) -> Desc {
        Desc { addr: a, len: 1, options: 0 }
    }

    #[test]
    fn bulk_push_pop_wraps_and_bounds() {
        let r = Spsc::new(8);
        let items: Vec<Desc> = (0..10).map(d).collect();
        // SAFETY: single-threaded test: one producer, one consumer.
        #[allow(clippy::multiple_unsafe_ops_per_block)]
        unsafe {
            assert_eq!(r.push_bulk(&items), 8, "full ring takes a prefix");
            let mut out = [Desc::default(); 5];
            assert_eq!(r.pop_bulk(&mut out), 5);
            assert_eq!(out[4].addr, 4);
            assert_eq!(r.push_bulk(&items[8..]), 2);
            let mut out = [Desc::default(); 16];
            assert_eq!(r.pop_bulk(&mut out), 5);
            assert_eq!(out.iter().take(5).map(|x| x.addr).collect::<Vec<_>>(), vec![5, 6, 7, 8, 9]);
        }
    }

    #[test]
    fn cross_thread_order_and_count() {
        let r = std::sync::Arc::new(Spsc::new(64));
        let r2 = r.clone();
        const N: u64 = 200_000;
        let t = std::thread::spawn(move || {
            let mut next = 0;
            while next < N {
                let batch: Vec<Desc> = (next..(next + 7).min(N)).map(d).collect();
                // SAFETY: this thread is the only producer.
                next += unsafe { r2.push_bulk(&batch) } as u64;
            }
        });
        let mut expect = 0;
        let mut out = [Desc::default(); 13];
        while expect < N {
            // SAFETY: this thread is the only consumer.
            let n = unsafe { r.pop_bulk(&mut out) };
            for o in &out[..n] {
                assert_eq!(o.addr, expect);
                expect += 1;
            }
        }
        t.join().unwrap();
    }
}
