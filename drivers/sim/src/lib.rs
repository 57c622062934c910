//! `sim`: an in-memory NIC with hardware-like descriptor rings, and a traffic generator.
//!
//! Each [`SimQueue`] models one hardware queue the way a NIC driver sees it:
//!
//! * a **fill ring** the driver keeps stocked with free frames (bulk-allocated from the pool);
//! * an **RX ring**: when a packet "arrives" the NIC takes a frame from the fill ring, writes the
//!   packet into it (the DMA) and posts a descriptor; no frame on the fill ring means the packet
//!   is missed and counted (`rx_missed`), as real hardware does;
//! * a **TX ring** the driver posts to, which the NIC "transmits" on the doorbell (`flush_tx`):
//!   it counts the bytes, optionally captures them, and moves the frames to
//! * a **completion ring** the driver drains back to the pool.
//!
//! Packets come from a [`TrafficGen`] (benchmarks, demo) or an injection queue (tests). No root,
//! no syscalls: this is what micro benchmarks and logic tests drive.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
// Every public item says what it is; casts that could drop bits say why they cannot.
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmswitch_core::counter::Counter;
use wasmswitch_core::pool::{BulkReturn, PoolCache};
use wasmswitch_core::umem::copy_packet;
use wasmswitch_core::{Desc, PortQueue, Umem};

mod gen;
pub use gen::{mac_for, Frames, TrafficGen, TrafficSpec};

/// Headroom the sim NIC leaves before packet data ([`wasmswitch_core::umem::HEADROOM`]).
pub const HEADROOM: u64 = wasmswitch_core::umem::HEADROOM as u64;

/// Frames waiting to be received, shared with a test that pushes them.
pub type InjectQueue = Arc<Mutex<VecDeque<Vec<u8>>>>;
/// Frames transmitted, recorded for a test to inspect.
pub type CaptureLog = Arc<Mutex<Vec<Vec<u8>>>>;

/// Where a queue's received packets come from.
pub enum Source {
    /// Nothing arrives.
    Idle,
    /// Generated traffic (optionally at a fixed rate).
    Gen(TrafficGen),
    /// Frames a test pushed.
    Inject(InjectQueue),
}

/// Counters of one simulated queue (the "hardware" side).
#[derive(Debug, Default)]
pub struct SimStats {
    /// Packets the NIC could not receive because the fill ring was empty.
    pub rx_missed: Counter,
    /// Packets and bytes that left on the wire.
    pub wire_tx_packets: Counter,
    /// The bytes of those packets (their descriptors' lengths).
    pub wire_tx_bytes: Counter,
}

/// Ring sizes of a simulated queue.
#[derive(Clone, Copy, Debug)]
pub struct SimRings {
    /// Fill ring entries: frames the NIC can receive into before the driver refills.
    pub fill: usize,
    /// TX ring entries, shared by frames posted and frames completed but not yet reclaimed.
    pub tx: usize,
}

impl Default for SimRings {
    fn default() -> Self {
        Self { fill: 1024, tx: 1024 }
    }
}

/// One simulated NIC queue.
pub struct SimQueue {
    umem: Arc<Umem>,
    rings: SimRings,
    fill: VecDeque<u64>,
    /// Emptied whole by every doorbell, so a plain vector.
    tx: Vec<Desc>,
    completion: Vec<u64>,
    source: Source,
    capture: Option<CaptureLog>,
    stats: Arc<SimStats>,
    refill_buf: Vec<u64>,
}

impl SimQueue {
    /// A queue over `umem` whose packets come from `source`; its fill ring is stocked at the
    /// first RX burst.
    pub fn new(umem: Arc<Umem>, rings: SimRings, source: Source) -> Self {
        Self {
            umem,
            fill: VecDeque::with_capacity(rings.fill),
            tx: Vec::with_capacity(rings.tx),
            completion: Vec::with_capacity(rings.tx),
            rings,
            source,
            capture: None,
            stats: Arc::default(),
            refill_buf: vec![0; rings.fill],
        }
    }

    /// Records every transmitted frame into `log` (tests).
    pub fn with_capture(mut self, log: CaptureLog) -> Self {
        self.capture = Some(log);
        self
    }

    /// This queue's NIC-side counters.
    pub fn stats(&self) -> &Arc<SimStats> {
        &self.stats
    }

    /// The generator's rate (packets per second), when it has one: storing into it changes the
    /// rate of the running queue at its next burst.
    pub fn rate_handle(&self) -> Option<Arc<AtomicU64>> {
        match &self.source {
            Source::Gen(g) => g.rate_handle(),
            _ => None,
        }
    }

    /// The driver's half of RX: keep the fill ring stocked, in bulk, once a default burst's
    /// worth (or a quarter of a small ring) is free. Not the largest burst: a refill of more
    /// frames than the pool's per-worker cache holds would go to its shared ring every time.
    fn refill(&mut self, pool: &mut PoolCache) {
        let free = self.rings.fill - self.fill.len();
        if free >= (self.rings.fill / 4).min(wasmswitch_core::DEFAULT_BATCH) {
            let n = pool.alloc_bulk(&mut self.refill_buf[..free]);
            self.fill.extend(&self.refill_buf[..n]);
        }
    }

    /// The NIC's half of RX for one packet: "DMA" it into a frame off the fill ring, describe it.
    #[inline]
    fn receive_into(umem: &Umem, frame: u64, pkt: &[u8]) -> Desc {
        let addr = frame + HEADROOM;
        let room = (umem.frame_size() - wasmswitch_core::umem::HEADROOM) as usize;
        let len = pkt.len().min(room);
        // SAFETY: the frame came off our fill ring, so the driver handed it to this "NIC".
        copy_packet(unsafe { umem.bytes_mut(addr, len) }, &pkt[..len]);
        // An oversize test frame keeps its claimed length: the pipeline must reject it.
        #[expect(clippy::cast_possible_truncation, reason = "a generated or injected frame is far below 4 GiB")]
        let claimed = pkt.len() as u32;
        Desc { addr, len: claimed, options: 0 }
    }
}

/// Receives one packet of `pkts` into each frame of `fill`, describing it in `out` (as many as
/// the shorter of the two). A function of its own, so that the compiler knows the UMEM's
/// geometry and the template table do not change under the copies into frame memory.
#[inline]
fn receive_all<'a>(umem: &Umem, out: &mut [Desc], fill: &[u64], pkts: &mut impl Iterator<Item = &'a [u8]>) {
    for (d, &frame) in out.iter_mut().zip(fill) {
        let Some(pkt) = pkts.next() else { return };
        *d = SimQueue::receive_into(umem, frame, pkt);
    }
}

impl PortQueue for SimQueue {
    fn rx_burst(&mut self, pool: &mut PoolCache, out: &mut [Desc]) -> usize {
        self.refill(pool);
        let mut n = 0;
        match &mut self.source {
            Source::Idle => {}
            Source::Gen(gen) => {
                // The burst's frames come off the fill ring in one pass and are retired together,
                // as a NIC moves its consumer index once per burst.
                let want = gen.budget(out.len());
                n = want.min(self.fill.len());
                let (head, wrapped) = self.fill.as_slices();
                let (first, second) = out[..n].split_at_mut(n.min(head.len()));
                let mut pkts = gen.burst(n);
                receive_all(&self.umem, first, head, &mut pkts);
                receive_all(&self.umem, second, wrapped, &mut pkts);
                self.fill.drain(..n);
                if n < want {
                    self.stats.rx_missed.add((want - n) as u64);
                }
            }
            Source::Inject(q) => {
                let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
                while n < out.len() {
                    let Some(pkt) = q.front() else { break };
                    // No fill frame: the packet stays queued until the driver refills.
                    let Some(frame) = self.fill.pop_front() else { break };
                    out[n] = Self::receive_into(&self.umem, frame, pkt);
                    q.pop_front();
                    n += 1;
                }
            }
        }
        n
    }

    fn tx_burst(&mut self, descs: &[Desc]) -> usize {
        let room = self.rings.tx - self.tx.len() - self.completion.len().min(self.rings.tx - self.tx.len());
        let n = descs.len().min(room);
        self.tx.extend_from_slice(&descs[..n]);
        n
    }

    fn flush_tx(&mut self) {
        // The doorbell: the NIC sends everything posted and completes it.
        if let Some(log) = &self.capture {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            for d in &self.tx {
                // SAFETY: the descriptor was posted to our TX ring; the NIC holds the frame.
                log.push(unsafe { self.umem.bytes(d.addr, d.len as usize) }.to_vec());
            }
        }
        let bytes: u64 = self.tx.iter().map(|d| d.len as u64).sum();
        self.completion.extend(self.tx.iter().map(|d| d.addr));
        self.stats.wire_tx_packets.add(self.tx.len() as u64);
        self.stats.wire_tx_bytes.add(bytes);
        self.tx.clear();
    }

    fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
        let n = self.completion.len();
        bulk.push_all(pool, &self.completion);
        self.completion.clear();
        n
    }

    fn release_all(&mut self, pool: &mut PoolCache) {
        self.flush_tx();
        let mut bulk = BulkReturn::new();
        self.complete(pool, &mut bulk);
        for addr in self.fill.drain(..) {
            bulk.push(pool, addr);
        }
        bulk.flush(pool);
    }

    fn frames_held(&self) -> usize {
        self.fill.len() + self.tx.len() + self.completion.len()
    }

    fn has_rx(&self) -> bool {
        !matches!(self.source, Source::Idle)
    }
}

/// A rate limiter for generated traffic, checked once per burst. The rate lives in a shared
/// atomic so that a reload can change it on a running queue: the pacer loads it (relaxed) once
/// per burst and restarts its schedule when it moved.
#[derive(Debug)]
pub(crate) struct Pacer {
    pps: f64,
    start: Instant,
    sent: u64,
    rate: Arc<AtomicU64>,
    seen: u64,
}

impl Pacer {
    pub(crate) fn new(pps: u64) -> Self {
        Self { pps: pps as f64, start: Instant::now(), sent: 0, rate: Arc::new(AtomicU64::new(pps)), seen: pps }
    }

    /// The rate in packets per second, shared: storing into it changes the pacer's rate.
    pub(crate) fn rate(&self) -> &Arc<AtomicU64> {
        &self.rate
    }

    /// How many packets may be sent now, at most `max`.
    pub(crate) fn budget(&mut self, max: usize) -> usize {
        let r = self.rate.load(Ordering::Relaxed);
        if r != self.seen {
            // A new rate starts a new schedule (no burst to catch up, no debt).
            *self = Self { rate: self.rate.clone(), ..Self::new(r) };
        }
        #[expect(clippy::cast_possible_truncation, reason = "floors on purpose (and saturates, past u64::MAX)")]
        let due = (self.start.elapsed().as_secs_f64() * self.pps) as u64;
        #[expect(clippy::cast_possible_truncation, reason = "at most `max`, a usize")]
        let n = due.saturating_sub(self.sent).min(max as u64) as usize;
        self.sent += n as u64;
        n
    }
}

#[cfg(test)]
mod tests;
