//! The host port: per-datapath-worker `PortQueue`s, the rings between them and the host
//! workers, and the host worker threads that deliver to and read from the TAP with io_uring.
//!
//! ```text
//!  datapath worker w                       host worker h (thread)
//!  HostPortQueue::tx_burst ──bulk queue[h]──▶ down ring (w,h) ──▶ gather ≤ bulk ──▶ N write SQEs,
//!         (flush when full / flush_tx)                             one io_uring_enter ──▶ TAP
//!                                                                  frames ──▶ SharedPool::put_bulk
//!  HostPortQueue::rx_burst ◀── up ring (w,h) ◀── read CQEs ◀── Read SQEs in flight ◀── TAP
//! ```

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmswitch_core::pool::{AllocMode, BulkReturn, PoolCache, PoolStats, SharedPool};
use wasmswitch_core::{Desc, PortQueue, Umem};

use crate::error::TapError;
use crate::ring::Spsc;
use crate::stats::{HostQueueStats, HostWorkerStats, TapStats};
use crate::tap::TapDevice;
use crate::uring::{HostRing, UringFeatures, UringOptions, MISC_TAG, READ_TAG, TAG_MASK};

/// Bytes left free before the packet in frames the host worker reads into (as AF_XDP leaves
/// `XDP_PACKET_HEADROOM`), so later stages can push headers.
pub const HEADROOM: u64 = 256;
/// Largest bulk (the batch-size histogram's last bucket).
pub const MAX_BULK: usize = 64;

/// How the host port is built.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Datapath workers: one [`HostPortQueue`] each.
    pub datapath_workers: usize,
    /// Host worker threads; must equal the TAP's queue count (one TAP queue fd each).
    pub host_workers: usize,
    /// Per-destination bulk queue size and the most frames a host worker delivers per
    /// submission (cpumap's `CPU_MAP_BULK_SIZE` is 8). 1..=64.
    pub bulk: usize,
    /// Entries of each ring, per (datapath worker, host worker) pair and direction.
    pub ring_size: usize,
    /// Reads from the TAP kept in flight per host worker.
    pub reads_in_flight: usize,
    /// Capacity of each host worker's own frame cache (its supply for reads).
    pub rx_cache: usize,
    pub uring: UringOptions,
    /// Empty polls (each one an `io_uring_enter` to reap completions) before sleeping.
    pub idle_spins: u32,
    /// Longest sleep without a doorbell (bounds the latency of a lost wakeup).
    pub idle_timeout: Duration,
    /// Bring the TAP link up on start and down on stop.
    pub manage_link: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            datapath_workers: 1,
            host_workers: 1,
            bulk: 8,
            ring_size: 1024,
            reads_in_flight: 8,
            rx_cache: 64,
            uring: UringOptions::default(),
            idle_spins: 64,
            idle_timeout: Duration::from_millis(10),
            manage_link: true,
        }
    }
}

/// Wakes a sleeping host worker (the `wake_up_process` of cpumap): an eventfd the worker keeps a
/// read posted on, written only when the worker said it is going to sleep.
struct Doorbell {
    sleeping: AtomicBool,
    efd: OwnedFd,
}

impl Doorbell {
    fn new() -> Result<Self, TapError> {
        // SAFETY: plain eventfd(2); the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(TapError::io("eventfd", "host worker", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Self { sleeping: AtomicBool::new(false), efd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Called by a producer after publishing into the worker's ring. Returns whether it woke it.
    #[inline]
    fn ring(&self) -> bool {
        // Pairs with the fence in the worker's sleep path (Dekker): either the worker sees our
        // ring entries on its re-check, or we see `sleeping` here.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            return true;
        }
        false
    }
}

/// The two rings of one (datapath worker, host worker) pair, and the exit protocol that lets
/// whichever side stops last reclaim every frame left in them.
struct Link {
    /// Datapath → host (frames to deliver).
    down: Spsc,
    /// Host → datapath (frames the host sent).
    up: Spsc,
    dp_done: AtomicBool,
    host_done: AtomicBool,
    /// Taken only by the exit paths, so the final drains never run concurrently.
    reclaim: Mutex<()>,
}

impl Link {
    fn new(size: usize) -> Self {
        Self {
            down: Spsc::new(size),
            up: Spsc::new(size),
            dp_done: AtomicBool::new(false),
            host_done: AtomicBool::new(false),
            reclaim: Mutex::new(()),
        }
    }

    /// Called once by each side when it stops producing and consuming: drains the ring it
    /// consumes, and, when the other side has stopped too, the ring it produced into.
    fn exit(&self, datapath_side: bool, mut give_back: impl FnMut(&[Desc])) {
        let (mine, other) =
            if datapath_side { (&self.dp_done, &self.host_done) } else { (&self.host_done, &self.dp_done) };
        mine.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let _g = self.reclaim.lock().unwrap_or_else(|e| e.into_inner());
        let (consumed, produced) = if datapath_side { (&self.up, &self.down) } else { (&self.down, &self.up) };
        let mut buf = [Desc::default(); 64];
        let mut drain = |r: &Spsc| loop {
            // SAFETY: under `reclaim`, after this side stopped its hot-path consumption; the
            // ring's other consumer (if this is the produced ring) has set its done flag, i.e.
            // stopped for good, and any later final drain is serialized by the lock.
            let n = unsafe { r.pop_bulk(&mut buf) };
            if n == 0 {
                break;
            }
            give_back(&buf[..n]);
        };
        drain(consumed);
        if other.load(Ordering::SeqCst) {
            drain(produced);
        }
    }
}

#[inline]
fn flow_hash(b: &[u8]) -> u32 {
    if b.len() < 14 {
        return 0;
    }
    let mut x = u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]))
        ^ (u32::from_le_bytes(b[8..12].try_into().unwrap_or([0; 4])) as u64) << 17;
    if b.len() >= 34 && b[12] == 0x08 && b[13] == 0x00 {
        x ^= u64::from_le_bytes(b[26..34].try_into().unwrap_or([0; 8])).rotate_left(29);
    }
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

/// Returns frames to the shared pool from any thread, masked to frame bases, in bulk.
fn put_shared(shared: &SharedPool, descs: &[Desc], stats: &PoolStats) {
    let umem = shared.umem();
    let mut buf = [0u64; 64];
    for chunk in descs.chunks(64) {
        for (o, d) in buf.iter_mut().zip(chunk) {
            *o = umem.frame_base(d.addr);
        }
        shared.put_bulk(&buf[..chunk.len()], stats);
    }
}

/// The host port as one datapath worker sees it: a normal [`PortQueue`].
///
/// * `tx_burst`: frames go into a per-host-worker bulk queue of `bulk` frames (steered by a flow
///   hash when there are several host workers); a full bulk queue is flushed into that worker's
///   ring at once, the rest at `flush_tx` (end of the burst). A full ring drops the frames
///   (counted in `ring_full`); they go back to the pool at the next `complete`.
/// * `rx_burst`: frames the host sent, read from the TAP by the host workers.
/// * `complete`: returns ring-full drops. Delivered frames are returned by the host worker itself
///   (`SharedPool::put_bulk`), so they never come back through here.
pub struct HostPortQueue {
    worker: usize,
    umem: Arc<Umem>,
    shared: Arc<SharedPool>,
    links: Vec<Arc<Link>>,
    bells: Vec<Arc<Doorbell>>,
    bq: Vec<Vec<Desc>>,
    pushed: Vec<bool>,
    bulk: usize,
    to_free: Vec<u64>,
    stats: Arc<HostQueueStats>,
    rr: usize,
    released: bool,
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

// ---- host worker ----------------------------------------------------------------------------

const EFD_UD: u64 = MISC_TAG | 1;
const CANCEL_UD: u64 = MISC_TAG | 2;
const NO_FRAME: u64 = u64::MAX;

struct HostWorker {
    // Field order matters: the ring (with the UMEM registered and the fd registered) goes first.
    ring: HostRing,
    fd: OwnedFd,
    idx: usize,
    cfg: HostConfig,
    links: Vec<Arc<Link>>,
    bell: Arc<Doorbell>,
    shared: Arc<SharedPool>,
    umem: Arc<Umem>,
    cache: PoolCache,
    stats: Arc<HostWorkerStats>,
    stop: Arc<AtomicBool>,
    batch: Vec<Desc>,
    others: Vec<(u64, i32)>,
    /// Per read slot: the frame base posted, or NO_FRAME.
    reads: Vec<u64>,
    reads_pending: usize,
    read_error_streak: u32,
    efd_buf: Box<u64>,
    efd_armed: bool,
    up_stage: Vec<Vec<Desc>>,
    rr: usize,
}

impl HostWorker {
    fn gather(&mut self) -> usize {
        let n_links = self.links.len();
        let mut buf = [Desc::default(); MAX_BULK];
        let want = self.cfg.bulk;
        let mut n = 0;
        for k in 0..n_links {
            if n == want {
                break;
            }
            let w = (self.rr + k) % n_links;
            // SAFETY: this host worker is the only consumer of the down ring of pair (w, idx).
            n += unsafe { self.links[w].down.pop_bulk(&mut buf[n..want]) };
        }
        self.rr = self.rr.wrapping_add(1);
        self.batch.clear();
        self.batch.extend_from_slice(&buf[..n]);
        n
    }

    fn arm_reads(&mut self) {
        if self.read_error_streak > 1000 {
            return; // the device is gone or broken: stop posting reads (logged once below)
        }
        let room = self.umem.frame_size() as u64 - HEADROOM;
        for slot in 0..self.reads.len() {
            if self.reads[slot] != NO_FRAME {
                continue;
            }
            let Some(frame) = self.cache.alloc() else {
                self.stats.rx_alloc_failed.inc();
                break;
            };
            let e = self.ring.read_sqe(frame + HEADROOM, room as u32, READ_TAG | slot as u64);
            // SAFETY: `frame` was just allocated to this worker and stays owned by the ring (in
            // `reads[slot]`) until the read's CQE is reaped.
            if unsafe { self.ring.push(&e) } {
                self.reads[slot] = frame;
                self.reads_pending += 1;
            } else {
                self.cache.put(frame);
                break;
            }
        }
        self.stats.reads_in_flight.set(self.reads_pending as u64);
    }

    fn arm_efd(&mut self) {
        if self.efd_armed {
            return;
        }
        let buf: *mut u64 = &mut *self.efd_buf;
        let e = io_uring::opcode::Read::new(io_uring::types::Fd(self.bell.efd.as_raw_fd()), buf.cast(), 8)
            .build()
            .user_data(EFD_UD);
        // SAFETY: `efd_buf` is boxed (stable address) and outlives the ring's use of it: the
        // worker waits for this read's CQE before dropping (shutdown).
        if unsafe { self.ring.push(&e) } {
            self.efd_armed = true;
        }
    }

    /// Handles a non-write completion. `forward`: hand read frames to the datapath (false while
    /// shutting down).
    fn on_cqe(&mut self, ud: u64, res: i32, forward: bool) {
        match ud & TAG_MASK {
            READ_TAG => {
                let slot = (ud & !TAG_MASK) as usize;
                let frame = std::mem::replace(&mut self.reads[slot], NO_FRAME);
                self.reads_pending -= 1;
                if res > 0 && forward {
                    self.read_error_streak = 0;
                    self.stats.tap_rx_packets.inc();
                    self.stats.tap_rx_bytes.add(res as u64);
                    let d = Desc { addr: frame + HEADROOM, len: res as u32, options: 0 };
                    let n = self.up_stage.len();
                    let w = if n == 1 {
                        0
                    } else {
                        // SAFETY: the read completed, so this worker holds the frame again; read only.
                        let b = unsafe { self.umem.bytes(d.addr, (res as usize).min(34)) };
                        flow_hash(b) as usize % n
                    };
                    self.up_stage[w].push(d);
                } else {
                    if res < 0 && res != -libc::ECANCELED {
                        self.stats.read_errors.inc();
                        self.read_error_streak += 1;
                        if self.read_error_streak == 1001 {
                            log::error!(
                                "host worker {}: TAP reads keep failing ({}), no more reads posted",
                                self.idx,
                                std::io::Error::from_raw_os_error(-res)
                            );
                        }
                    }
                    self.cache.put(frame);
                }
            }
            MISC_TAG if ud == EFD_UD => self.efd_armed = false,
            _ => {} // cancel completions
        }
    }

    fn flush_up(&mut self) {
        for w in 0..self.up_stage.len() {
            if self.up_stage[w].is_empty() {
                continue;
            }
            // SAFETY: this host worker is the only producer of the up ring of pair (w, idx).
            let n = unsafe { self.links[w].up.push_bulk(&self.up_stage[w]) };
            if n < self.up_stage[w].len() {
                self.stats.rx_ring_full.add((self.up_stage[w].len() - n) as u64);
                for i in n..self.up_stage[w].len() {
                    let a = self.up_stage[w][i].addr;
                    self.cache.put(a);
                }
            }
            self.up_stage[w].clear();
        }
    }

    fn reap(&mut self, forward: bool) -> usize {
        let mut n = 0;
        while let Some((ud, res)) = self.ring.next_cqe() {
            self.on_cqe(ud, res, forward);
            n += 1;
        }
        n
    }

    fn run(&mut self) {
        self.arm_reads();
        self.arm_efd();
        let mut idle = 0u32;
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            let mut progress = 0;
            let n = self.gather();
            if n > 0 {
                let batch = std::mem::take(&mut self.batch);
                let mut others = std::mem::take(&mut self.others);
                let d = self.ring.deliver(&batch, |ud, res| others.push((ud, res)));
                self.stats.submissions.add(d.enters);
                self.stats.delivered.add(d.packets);
                self.stats.tap_tx_packets.add(d.packets);
                self.stats.tap_tx_bytes.add(d.bytes);
                self.stats.write_errors.add(d.errors);
                self.stats.record_batch(n);
                // The cross-thread bulk return: the whole list in one lock acquisition.
                put_shared(&self.shared, &batch, self.cache.stats());
                for (ud, res) in others.drain(..) {
                    self.on_cqe(ud, res, true);
                }
                self.others = others;
                self.batch = batch;
                progress += n;
            } else {
                // Nothing to write: let ready reads post their CQEs (and submit re-armed reads).
                self.ring.kick();
                self.stats.submissions.inc();
            }
            progress += self.reap(true);
            self.flush_up();
            self.arm_reads();
            if stopping {
                break;
            }
            if progress > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle < self.cfg.idle_spins {
                std::hint::spin_loop();
                continue;
            }
            // Sleep until a doorbell, a read completion, or the timeout.
            self.bell.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.links.iter().any(|l| !l.down.is_empty()) || self.stop.load(Ordering::Acquire) {
                self.bell.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            self.arm_efd();
            self.stats.sleeps.inc();
            self.stats.submissions.inc();
            if let Err(e) = self.ring.wait_timeout(self.cfg.idle_timeout) {
                log::warn!("host worker {}: io_uring wait failed: {e}", self.idx);
                std::thread::sleep(Duration::from_millis(1));
            }
            self.bell.sleeping.store(false, Ordering::SeqCst);
            idle = 0;
        }
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // Cancel the reads and the doorbell read, and wait until the kernel gave every frame back.
        if self.reads_pending > 0 || self.efd_armed {
            self.ring.cancel_all(CANCEL_UD);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.reads_pending > 0 || self.efd_armed {
            if Instant::now() > deadline {
                log::error!(
                    "host worker {}: {} reads still in flight after cancel; leaking their frames rather than reusing memory the kernel may still write",
                    self.idx,
                    self.reads_pending
                );
                self.reads.iter_mut().for_each(|r| *r = NO_FRAME);
                // The efd buffer and ring stay valid: leak them too.
                std::mem::forget(std::mem::replace(&mut self.efd_buf, Box::new(0)));
                break;
            }
            let _ = self.ring.wait_timeout(Duration::from_millis(10));
            self.reap(false);
        }
        // Frames staged for the datapath go back to our cache.
        for w in 0..self.up_stage.len() {
            for i in 0..self.up_stage[w].len() {
                let a = self.up_stage[w][i].addr;
                self.cache.put(a);
            }
            self.up_stage[w].clear();
        }
        let shared = self.shared.clone();
        let stats = self.cache.stats().clone();
        for link in &self.links {
            link.exit(false, |ds| put_shared(&shared, ds, &stats));
        }
        self.cache.drain();
        let _ = &self.fd;
    }
}

/// The host port: the TAP, its host worker threads and their stats. Dropping it stops them.
pub struct HostPort {
    tap: TapDevice,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    bells: Vec<Arc<Doorbell>>,
    links: Vec<Vec<Arc<Link>>>,
    stats: Arc<TapStats>,
    features: Vec<UringFeatures>,
    manage_link: bool,
}

impl std::fmt::Debug for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPort").field("tap", &self.tap.name()).field("host_workers", &self.threads.len()).finish()
    }
}

impl HostPort {
    /// Starts `cfg.host_workers` host worker threads over `tap` (one TAP queue each) and returns
    /// the port with one [`HostPortQueue`] per datapath worker (index = datapath worker).
    ///
    /// Every io_uring is set up inside its worker thread before this returns; a refused setup
    /// is an error, refused options (fixed buffers, registered file, single issuer, defer
    /// taskrun) fall back and show in [`features`](Self::features).
    pub fn start(
        mut tap: TapDevice,
        pool: &Arc<SharedPool>,
        cfg: &HostConfig,
    ) -> Result<(HostPort, Vec<HostPortQueue>), TapError> {
        if cfg.host_workers == 0 || cfg.datapath_workers == 0 {
            return Err(TapError::Config("need at least one host worker and one datapath worker".into()));
        }
        if cfg.host_workers != tap.queues() {
            return Err(TapError::Config(format!(
                "{} host workers but the TAP has {} queues (create it with queues = host_workers)",
                cfg.host_workers,
                tap.queues()
            )));
        }
        if !(1..=MAX_BULK).contains(&cfg.bulk) {
            return Err(TapError::Config(format!("bulk {} must be 1..={MAX_BULK}", cfg.bulk)));
        }
        let umem = pool.umem().clone();
        let max_mtu = umem.frame_size() - HEADROOM as u32 - 14;
        if tap.mtu() > max_mtu {
            return Err(TapError::BadMtu { mtu: tap.mtu(), max: max_mtu });
        }
        let (m, nw) = (cfg.host_workers, cfg.datapath_workers);
        // links[w][h]
        let links: Vec<Vec<Arc<Link>>> =
            (0..nw).map(|_| (0..m).map(|_| Arc::new(Link::new(cfg.ring_size))).collect()).collect();
        let bells: Vec<Arc<Doorbell>> = (0..m).map(|_| Doorbell::new().map(Arc::new)).collect::<Result<_, _>>()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut stats = TapStats::default();
        let mut fds = Vec::new();
        for h in 0..m {
            fds.push(tap.take_queue(h).ok_or_else(|| TapError::Config(format!("TAP queue {h} already taken")))?);
        }
        let mut port = HostPort {
            threads: Vec::new(),
            stop: stop.clone(),
            bells: bells.clone(),
            links: links.clone(),
            stats: Arc::default(),
            features: Vec::new(),
            manage_link: cfg.manage_link,
            tap,
        };
        for (h, fd) in fds.into_iter().enumerate() {
            let wstats = Arc::new(HostWorkerStats::default());
            stats.workers.push(wstats.clone());
            let (tx, rx) = mpsc::channel();
            let my_links: Vec<Arc<Link>> = links.iter().map(|l| l[h].clone()).collect();
            let (cfg2, bell, shared, umem2, stop2) =
                (cfg.clone(), bells[h].clone(), pool.clone(), umem.clone(), stop.clone());
            let t = std::thread::Builder::new()
                .name(format!("host-worker-{h}"))
                .spawn(move || {
                    let ring = match HostRing::new(fd.as_raw_fd(), umem2.clone(), &cfg2.uring) {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(ring.features()));
                    let mut w = HostWorker {
                        ring,
                        fd,
                        idx: h,
                        links: my_links,
                        bell,
                        cache: PoolCache::new(shared.clone(), cfg2.rx_cache, AllocMode::Recycling),
                        shared,
                        umem: umem2,
                        stats: wstats,
                        stop: stop2,
                        batch: Vec::with_capacity(MAX_BULK),
                        others: Vec::with_capacity(64),
                        reads: vec![NO_FRAME; cfg2.reads_in_flight],
                        reads_pending: 0,
                        read_error_streak: 0,
                        efd_buf: Box::new(0),
                        efd_armed: false,
                        up_stage: (0..cfg2.datapath_workers)
                            .map(|_| Vec::with_capacity(cfg2.reads_in_flight))
                            .collect(),
                        rr: 0,
                        cfg: cfg2,
                    };
                    w.run();
                })
                .map_err(|e| TapError::io("spawning a host worker", port.tap.name(), e))?;
            port.threads.push(t);
            match rx.recv() {
                Ok(Ok(f)) => port.features.push(f),
                Ok(Err(e)) => return Err(e), // `port` drops: the started workers stop
                Err(_) => return Err(TapError::Config("host worker died during setup".into())),
            }
        }
        let queues = (0..nw)
            .map(|w| {
                let qs = Arc::new(HostQueueStats::default());
                stats.queues.push(qs.clone());
                HostPortQueue {
                    worker: w,
                    umem: umem.clone(),
                    shared: pool.clone(),
                    links: links[w].clone(),
                    bells: bells.clone(),
                    bq: (0..m).map(|_| Vec::with_capacity(cfg.bulk)).collect(),
                    pushed: vec![false; m],
                    bulk: cfg.bulk,
                    to_free: Vec::with_capacity(cfg.ring_size),
                    stats: qs,
                    rr: 0,
                    released: false,
                }
            })
            .collect();
        port.stats = Arc::new(stats);
        if cfg.manage_link {
            port.tap.set_up(true)?;
        }
        Ok((port, queues))
    }

    pub fn tap(&self) -> &TapDevice {
        &self.tap
    }

    pub fn stats(&self) -> &Arc<TapStats> {
        &self.stats
    }

    /// What each host worker's io_uring got from the kernel (index = host worker).
    pub fn features(&self) -> &[UringFeatures] {
        &self.features
    }

    /// Frames sitting in the rings right now (neither side holds them).
    pub fn frames_in_rings(&self) -> usize {
        self.links.iter().flatten().map(|l| l.down.len() + l.up.len()).sum()
    }

    /// Stops the host workers: sets the link down, lets each finish its current list, cancels
    /// its reads, returns every frame and joins it. Call after the datapath workers have shut
    /// down (`Pipeline::shutdown`), so that nothing is enqueued any more; frames enqueued later
    /// are still reclaimed by the last side to stop, never lost.
    pub fn stop(&mut self) {
        if self.manage_link && !self.threads.is_empty() {
            let _ = self.tap.set_up(false);
        }
        self.stop.store(true, Ordering::SeqCst);
        for b in &self.bells {
            b.sleeping.store(true, Ordering::SeqCst);
            b.ring();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("a host worker of {} panicked", self.tap.name());
            }
        }
    }
}

impl Drop for HostPort {
    fn drop(&mut self) {
        self.stop();
    }
}
