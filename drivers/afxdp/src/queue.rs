//! [`AfXdpQueue`]: one AF_XDP socket as a `wasmswitch_core::PortQueue`.
//!
//! A queue is split into an RX half (fill + RX rings, polled by the one worker that owns the
//! queue) and a TX half (TX + completion rings). The TX half is either owned by that worker too,
//! or, for ports with fewer queues than workers, put behind an `Arc<Mutex<_>>` and shared with
//! other workers ([`AfXdpQueue::share_tx`]): those get a TX-only queue (`has_rx() == false`) and
//! take the lock once per burst, while the owner keeps polling RX without any lock.

use std::sync::{Arc, Mutex, MutexGuard};

use wasmswitch_core::counter::Counter;
use wasmswitch_core::{BulkReturn, Desc, PoolCache, PortQueue, Umem};

use crate::xsk::{FrameSet, RxRings, SockHandle, TxRings, XdpStatistics};

/// Frames moved from the pool to the fill ring per `alloc_bulk` call.
const FILL_BATCH: usize = 64;
/// Completions read per ring access.
const COMP_BATCH: usize = 64;
/// Extra kicks after the kernel answers EAGAIN with descriptors still queued (copy mode sends at
/// most 32 per `sendto`, so a 64-packet burst needs two).
const KICK_RETRIES: usize = 4;

/// Per-queue driver counters. RX counters are written only by the polling worker; TX counters
/// only under the TX half's lock (or by its sole owner), so each has one writer at a time.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// RX bursts that found the RX ring empty.
    pub rx_ring_empty: Counter,
    /// Fill ring refills that found the pool empty (the kernel will drop when the fill ring runs dry).
    pub fill_starved: Counter,
    /// `recvfrom` wakeups issued because the fill ring asked for one.
    pub rx_wakeups: Counter,
    /// `sendto` kicks issued because the TX ring asked for one.
    pub tx_wakeups: Counter,
    /// Kicks answered EAGAIN / ENOBUFS: the kernel stopped early (its per-call budget, a full
    /// completion ring, a stopped device queue) and is asked again; nothing was lost.
    pub tx_kick_busy: Counter,
    /// Kicks answered EBUSY: in copy mode the device refused a frame (`NET_XMIT_DROP`, e.g. a
    /// veth peer's backlog full), which the kernel then completed unsent. One frame lost each.
    pub tx_kernel_drops: Counter,
    /// Kicks answered with any other error.
    pub tx_kick_errors: Counter,
    /// Kicks answered ENETDOWN / ENXIO: the interface went down or away.
    pub port_gone: Counter,
}

impl QueueStats {
    /// Adds what `old` counted, for a queue that takes over from `old`'s (a port re-attached
    /// when its interface came back), so that the counters keep rising. Call it before the
    /// queue runs: the caller is then its counters' one writer.
    pub fn carry(&self, old: &QueueStats) {
        let pairs = [
            (&self.rx_ring_empty, &old.rx_ring_empty),
            (&self.fill_starved, &old.fill_starved),
            (&self.rx_wakeups, &old.rx_wakeups),
            (&self.tx_wakeups, &old.tx_wakeups),
            (&self.tx_kick_busy, &old.tx_kick_busy),
            (&self.tx_kernel_drops, &old.tx_kernel_drops),
            (&self.tx_kick_errors, &old.tx_kick_errors),
            (&self.port_gone, &old.port_gone),
        ];
        for (new, old) in pairs {
            new.add(old.get());
        }
    }
}

#[derive(Debug)]
struct RxHalf {
    sock: Arc<SockHandle>,
    rings: RxRings,
    posted: FrameSet,
}

#[derive(Debug)]
pub(crate) struct TxHalf {
    sock: Arc<SockHandle>,
    rings: TxRings,
    posted: FrameSet,
    /// Descriptors submitted since the last kick the kernel fully acted on.
    unkicked: u32,
    /// The last kick was answered ENETDOWN/ENXIO: what the ring holds waits for the next burst
    /// (which kicks it all, even when the ring is too full to take anything new).
    kick_refused: bool,
    stats: Arc<QueueStats>,
    /// Scratch for draining the completion ring, kept here so no poll round zeroes it anew.
    comp_buf: [u64; COMP_BATCH],
}

// The owned half (with its completion scratch) is what every burst touches: kept inline rather
// than boxed; there is one per queue, so the size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum TxSide {
    Own(TxHalf),
    Shared(Arc<Mutex<TxHalf>>),
    Released,
}

/// One (interface, queue) AF_XDP socket, or a TX-only handle on one shared with other workers.
#[derive(Debug)]
pub struct AfXdpQueue {
    rx: Option<RxHalf>,
    tx: TxSide,
    /// Whether this handle accounts the TX half's frames in `frames_held` (the owner does, TX
    /// sharers don't, so summing over all workers counts each frame once).
    counts_tx: bool,
    stats: Arc<QueueStats>,
    ifname: Arc<str>,
    queue: u32,
}

fn lock(m: &Mutex<TxHalf>) -> MutexGuard<'_, TxHalf> {
    // Ring indices are only published after a consistent update, so a panic while the lock was
    // held leaves a usable half.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl TxHalf {
    fn tx_burst(&mut self, descs: &[Desc]) -> usize {
        let n = self.rings.tx.produce(descs);
        for d in &descs[..n] {
            self.posted.insert(d.addr);
        }
        if self.kick_refused {
            self.kick_refused = false;
            self.unkicked = self.rings.tx.outstanding();
        } else {
            #[expect(clippy::cast_possible_truncation, reason = "at most the TX ring's size, a u32")]
            let n32 = n as u32;
            self.unkicked += n32;
        }
        n
    }

    /// One kick when the kernel asks for it (need_wakeup), a few more only while it answers
    /// EAGAIN with descriptors still queued.
    fn flush(&mut self) {
        if self.unkicked == 0 {
            return;
        }
        if !self.rings.tx.needs_wakeup() {
            // Zero-copy driver already running its TX NAPI: it will pick the ring up itself.
            self.unkicked = 0;
            return;
        }
        for _ in 0..KICK_RETRIES {
            self.stats.tx_wakeups.inc();
            // SAFETY: zero-length sendto with null buffer and address on our own AF_XDP socket:
            // the kernel reads nothing from userspace memory, it only processes the TX ring.
            let r =
                unsafe { libc::sendto(self.sock.raw(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
            if r >= 0 {
                self.unkicked = 0;
                return;
            }
            let e = errno();
            match e {
                libc::EAGAIN | libc::EBUSY | libc::ENOBUFS => {
                    if e == libc::EBUSY {
                        self.stats.tx_kernel_drops.inc();
                    } else {
                        self.stats.tx_kick_busy.inc();
                    }
                    let left = self.rings.tx.outstanding();
                    self.unkicked = left;
                    if left == 0 {
                        return;
                    }
                }
                libc::ENETDOWN | libc::ENXIO => {
                    // Not again every round while the port is stopped (a syscall per round);
                    // what the ring holds goes with the next burst's kick.
                    self.stats.port_gone.inc();
                    self.unkicked = 0;
                    self.kick_refused = true;
                    return;
                }
                _ => {
                    self.stats.tx_kick_errors.inc();
                    return;
                }
            }
        }
    }

    fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
        let mut total = 0;
        loop {
            let n = self.rings.comp.consume(&mut self.comp_buf);
            for &a in &self.comp_buf[..n] {
                self.posted.remove(a);
            }
            bulk.push_all(pool, &self.comp_buf[..n]);
            total += n;
            if n < COMP_BATCH {
                break;
            }
        }
        // Descriptors left behind by an EAGAIN'd kick go now, not with the next burst (which may
        // never come).
        if self.unkicked > 0 {
            self.flush();
        }
        total
    }
}

impl AfXdpQueue {
    pub(crate) fn new(sock: Arc<SockHandle>, rx: RxRings, tx: TxRings, umem: &Umem) -> Self {
        let stats = Arc::new(QueueStats::default());
        let ifname: Arc<str> = sock.ifname.as_str().into();
        let queue = sock.queue;
        Self {
            rx: Some(RxHalf { sock: sock.clone(), rings: rx, posted: FrameSet::new(umem) }),
            tx: TxSide::Own(TxHalf {
                sock,
                rings: tx,
                posted: FrameSet::new(umem),
                unkicked: 0,
                kick_refused: false,
                stats: stats.clone(),
                comp_buf: [0; COMP_BATCH],
            }),
            counts_tx: true,
            stats,
            ifname,
            queue,
        }
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The queue id on the interface.
    pub fn queue_id(&self) -> u32 {
        self.queue
    }

    /// The driver's counters of this queue (shared by its TX sharers).
    pub fn stats(&self) -> &Arc<QueueStats> {
        &self.stats
    }

    /// The kernel's `XDP_STATISTICS` for this socket (`None` once released).
    pub fn xdp_stats(&self) -> Option<XdpStatistics> {
        let sock = match (&self.rx, &self.tx) {
            (Some(rx), _) => rx.sock.clone(),
            (None, TxSide::Own(t)) => t.sock.clone(),
            (None, TxSide::Shared(t)) => lock(t).sock.clone(),
            (None, TxSide::Released) => return None,
        };
        sock.statistics().ok()
    }

    /// Returns a TX-only handle on this queue's socket for another worker (`has_rx() == false`).
    ///
    /// The first call moves the TX half behind a mutex; from then on every handle (this one
    /// included) takes the lock once per `tx_burst` (which also kicks, so `flush_tx` needs no
    /// second lock) and once per `complete`. This queue keeps its RX side, lock-free.
    pub fn share_tx(&mut self) -> AfXdpQueue {
        let shared = match std::mem::replace(&mut self.tx, TxSide::Released) {
            TxSide::Own(t) => Arc::new(Mutex::new(t)),
            TxSide::Shared(s) => s,
            TxSide::Released => panic!("share_tx on a released queue"),
        };
        self.tx = TxSide::Shared(shared.clone());
        AfXdpQueue {
            rx: None,
            tx: TxSide::Shared(shared),
            counts_tx: false,
            stats: self.stats.clone(),
            ifname: self.ifname.clone(),
            queue: self.queue,
        }
    }

    /// True when the TX half is shared with other workers.
    pub fn is_tx_shared(&self) -> bool {
        matches!(self.tx, TxSide::Shared(_))
    }
}

impl RxHalf {
    /// Tops the fill ring up from the pool, `FILL_BATCH` frames per allocation.
    #[inline]
    fn refill(&mut self, pool: &mut PoolCache, stats: &QueueStats) {
        let batch = FILL_BATCH.min(self.rings.fill.size() as usize / 2).max(1);
        #[expect(clippy::cast_possible_truncation, reason = "at most FILL_BATCH, 64")]
        let mut free = self.rings.fill.free(batch as u32) as usize;
        if free < batch {
            return; // the common case: nothing to refill, and no scratch buffer to zero
        }
        let mut buf = [0u64; FILL_BATCH];
        while free >= batch {
            let got = pool.alloc_bulk(&mut buf[..batch]);
            for &a in &buf[..got] {
                self.posted.insert(a);
            }
            let put = self.rings.fill.produce(&buf[..got]);
            debug_assert_eq!(put, got, "single producer: the room was checked");
            free -= got;
            if got < batch {
                stats.fill_starved.inc();
                break;
            }
        }
    }
}

impl PortQueue for AfXdpQueue {
    fn rx_burst(&mut self, pool: &mut PoolCache, out: &mut [Desc]) -> usize {
        let Some(rx) = self.rx.as_mut() else { return 0 };
        rx.refill(pool, &self.stats);
        if rx.rings.fill.needs_wakeup() {
            self.stats.rx_wakeups.inc();
            // SAFETY: zero-length recvfrom with null buffer/address on our own AF_XDP socket: it
            // only wakes the driver's RX processing; nothing is written to userspace memory.
            unsafe {
                libc::recvfrom(
                    rx.sock.raw(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
        }
        let n = rx.rings.rx.consume(out);
        if n == 0 {
            self.stats.rx_ring_empty.inc();
        }
        for d in &out[..n] {
            rx.posted.remove(d.addr);
        }
        n
    }

    fn tx_burst(&mut self, descs: &[Desc]) -> usize {
        match &mut self.tx {
            TxSide::Own(t) => t.tx_burst(descs),
            TxSide::Shared(s) => {
                // One lock per burst: submit and kick together.
                let mut t = lock(s);
                let n = t.tx_burst(descs);
                t.flush();
                n
            }
            TxSide::Released => 0,
        }
    }

    fn flush_tx(&mut self) {
        if let TxSide::Own(t) = &mut self.tx {
            t.flush();
        }
    }

    fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
        match &mut self.tx {
            TxSide::Own(t) => t.complete(pool, bulk),
            TxSide::Shared(s) => lock(s).complete(pool, bulk),
            TxSide::Released => 0,
        }
    }

    /// Shutdown: frames the rings show (completions, unprocessed RX) go straight back to `pool`;
    /// frames the kernel may still hold (fill entries, TX not completed) are parked on the socket
    /// and returned to the pool right after the socket is closed, which happens when the last
    /// handle on it (RX owner or TX sharer) is released or dropped.
    fn release_all(&mut self, pool: &mut PoolCache) {
        let shared = pool.shared().clone();
        let mut bulk = BulkReturn::new();
        if let Some(mut rx) = self.rx.take() {
            let mut buf = [Desc::default(); 64];
            loop {
                let n = rx.rings.rx.consume(&mut buf);
                for d in &buf[..n] {
                    rx.posted.remove(d.addr);
                    bulk.push(pool, d.addr);
                }
                if n < buf.len() {
                    break;
                }
            }
            rx.sock.park(rx.posted.drain(), &shared);
        }
        match std::mem::replace(&mut self.tx, TxSide::Released) {
            TxSide::Own(mut t) => {
                t.complete(pool, &mut bulk);
                t.sock.park(t.posted.drain(), &shared);
            }
            TxSide::Shared(s) => {
                lock(&s).complete(pool, &mut bulk);
                // The last handle on the shared half parks what it still has in flight.
                if let Ok(m) = Arc::try_unwrap(s) {
                    let mut t = m.into_inner().unwrap_or_else(|e| e.into_inner());
                    t.sock.park(t.posted.drain(), &shared);
                }
            }
            TxSide::Released => {}
        }
        bulk.flush(pool);
    }

    fn frames_held(&self) -> usize {
        let rx = self.rx.as_ref().map_or(0, |r| r.posted.len());
        let tx = match &self.tx {
            TxSide::Own(t) => t.posted.len(),
            TxSide::Shared(s) if self.counts_tx => lock(s).posted.len(),
            _ => 0,
        };
        rx + tx
    }

    fn has_rx(&self) -> bool {
        self.rx.is_some()
    }
}
