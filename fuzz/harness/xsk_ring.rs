// The `xsk_ring` fuzz target's body, shared verbatim (via `include!`) by the libFuzzer target
// and by `drivers/afxdp/tests/fuzz_corpus.rs`, which replays the committed corpus on stable.
//
// Drives the driver's real `ProdRing` (fill/TX side) and `ConsRing` (RX/completion side) over
// heap memory laid out like the kernel's mmap (the rings only ever see raw pointers), with this
// harness playing the kernel: it consumes what userspace produced and produces what userspace
// consumes, always within the ring protocol. A `VecDeque` per ring is the reference model;
// every operation's count and every entry read must agree with it, across u32 index wraparound.
//
// Input: byte 0 picks the ring size (2..=64), bytes 1..5 the starting index (both rings start
// there, as after a long run), then (op, arg) byte pairs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

use wasmswitch_afxdp::ring::{ConsRing, ProdRing, RingPtrs, NEED_WAKEUP};
use wasmswitch_core::Desc;

/// One ring's shared words and entries on the heap (the kernel's layout, minus the mmap).
struct HeapRing<T> {
    producer: Box<AtomicU32>,
    consumer: Box<AtomicU32>,
    flags: Box<AtomicU32>,
    entries: Box<[T]>,
}

impl<T: Copy + Default> HeapRing<T> {
    fn new(size: u32, start: u32) -> Self {
        Self {
            producer: Box::new(AtomicU32::new(start)),
            consumer: Box::new(AtomicU32::new(start)),
            flags: Box::new(AtomicU32::new(0)),
            entries: vec![T::default(); size as usize].into_boxed_slice(),
        }
    }

    fn ptrs(&mut self) -> RingPtrs<T> {
        let size = self.entries.len() as u32;
        // SAFETY: the boxes never move and outlive the rings (`check` declares the rings after
        // them, so drops them first); `entries` holds `size` entries, a power of two; one thread
        // uses both sides.
        unsafe { RingPtrs::new(&*self.producer, &*self.consumer, &*self.flags, self.entries.as_mut_ptr(), size) }
    }

    fn mask(&self) -> u32 {
        self.entries.len() as u32 - 1
    }
}

fn desc(seq: u64) -> Desc {
    // Any values will do, including addresses and lengths outside any UMEM: the ring copies
    // descriptors, it must not interpret them.
    Desc { addr: seq.wrapping_mul(0x9e37_79b9_7f4a_7c15), len: seq as u32 ^ 0xa5a5_a5a5, options: (seq >> 32) as u32 }
}

pub fn check(data: &[u8]) {
    if data.len() < 5 {
        return;
    }
    let size = 2u32 << (data[0] % 6);
    let start = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
    let ops = &data[5..];

    // Userspace produces (fill / TX), the "kernel" consumes.
    let mut fill = HeapRing::<u64>::new(size, start);
    // The "kernel" produces, userspace consumes (RX / completion).
    let mut rx = HeapRing::<Desc>::new(size, start);
    let mut prod = ProdRing::new(fill.ptrs());
    let mut cons = ConsRing::new(rx.ptrs());
    let (mut fill_model, mut rx_model) = (VecDeque::new(), VecDeque::new());
    let mut seq = 0u64;
    let mut buf = vec![Desc::default(); 80];

    for op in ops.chunks_exact(2) {
        let k = op[1] as u32 % 80;
        match op[0] % 8 {
            // Userspace produces k fill entries: exactly as many as there is room for.
            0 => {
                let items: Vec<u64> = (0..k as u64).map(|i| seq + i).collect();
                let n = prod.produce(&items);
                assert_eq!(n, (k as usize).min(size as usize - fill_model.len()), "produce count");
                fill_model.extend(&items[..n]);
                seq += n as u64;
            }
            // The kernel consumes up to k fill entries, checking each against the model.
            1 => {
                let (p, c) = (fill.producer.load(Ordering::Acquire), fill.consumer.load(Ordering::Relaxed));
                let avail = p.wrapping_sub(c);
                assert_eq!(avail as usize, fill_model.len(), "published fill entries");
                let n = k.min(avail);
                for i in 0..n {
                    let got = fill.entries[(c.wrapping_add(i) & fill.mask()) as usize];
                    assert_eq!(Some(got), fill_model.pop_front(), "fill entry order");
                }
                fill.consumer.store(c.wrapping_add(n), Ordering::Release);
            }
            // The kernel produces up to k RX descriptors, never more than the room it sees.
            2 => {
                let (p, c) = (rx.producer.load(Ordering::Relaxed), rx.consumer.load(Ordering::Acquire));
                let room = size - p.wrapping_sub(c);
                let n = k.min(room);
                for i in 0..n {
                    let d = desc(seq);
                    seq += 1;
                    let m = rx.mask();
                    rx.entries[(p.wrapping_add(i) & m) as usize] = d;
                    rx_model.push_back(d);
                }
                rx.producer.store(p.wrapping_add(n), Ordering::Release);
            }
            // Userspace consumes up to k RX descriptors.
            3 => {
                let n = cons.consume(&mut buf[..k as usize]);
                assert_eq!(n, (k as usize).min(rx_model.len()), "consume count");
                for d in &buf[..n] {
                    assert_eq!(Some(*d), rx_model.pop_front(), "RX entry order");
                }
            }
            4 => {
                assert_eq!(prod.outstanding() as usize, fill_model.len());
                assert_eq!(prod.free(k) as usize, size as usize - fill_model.len());
            }
            5 => {
                let u: Vec<u64> = prod.unconsumed().collect();
                assert!(u.iter().eq(fill_model.iter()), "unconsumed {u:?} vs {fill_model:?}");
                // A cached count may be stale but never too high, and is refreshed when short.
                let a = cons.available(k) as usize;
                assert!(a <= rx_model.len() && (a >= k as usize || a == rx_model.len()), "available {a}");
            }
            6 => {
                let on = op[1] & 1 != 0;
                fill.flags.store(if on { NEED_WAKEUP } else { 0 }, Ordering::Relaxed);
                rx.flags.store(if on { 0 } else { NEED_WAKEUP }, Ordering::Relaxed);
                assert_eq!(prod.needs_wakeup(), on);
                assert_eq!(cons.needs_wakeup(), !on);
            }
            _ => {
                // Likewise for free room.
                let f = prod.free(k) as usize;
                let truth = size as usize - fill_model.len();
                assert!(f <= truth && (f >= k as usize || f == truth), "free {f}, truly {truth}");
            }
        }
    }
}
