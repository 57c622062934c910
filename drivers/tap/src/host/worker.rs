//! The host worker: a thread that delivers the frames of its down rings to the TAP and reads
//! from the TAP into its up rings, both with io_uring.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmswitch_core::pool::{PoolCache, SharedPool};
use wasmswitch_core::{Desc, Umem};

use super::link::{flow_hash, put_shared, Doorbell, Link};
use super::{HostConfig, HEADROOM, MAX_BULK};
use crate::stats::HostWorkerStats;
use crate::uring::{HostRing, MISC_TAG, READ_TAG, TAG_MASK};

const EFD_UD: u64 = MISC_TAG | 1;
const CANCEL_UD: u64 = MISC_TAG | 2;
pub(super) const NO_FRAME: u64 = u64::MAX;

/// One host worker thread's state, built by `HostPort::start` inside the thread once its ring is set up.
pub(super) struct HostWorker {
    // Field order matters: the ring (with the UMEM registered and the fd registered) goes first.
    pub(super) ring: HostRing,
    pub(super) fd: OwnedFd,
    pub(super) idx: usize,
    pub(super) cfg: HostConfig,
    pub(super) links: Vec<Arc<Link>>,
    pub(super) bell: Arc<Doorbell>,
    pub(super) shared: Arc<SharedPool>,
    pub(super) umem: Arc<Umem>,
    pub(super) cache: PoolCache,
    pub(super) stats: Arc<HostWorkerStats>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) batch: Vec<Desc>,
    pub(super) others: Vec<(u64, i32)>,
    /// Per read slot: the frame base posted, or NO_FRAME.
    pub(super) reads: Vec<u64>,
    pub(super) reads_pending: usize,
    pub(super) read_error_streak: u32,
    pub(super) efd_buf: Box<u64>,
    pub(super) efd_armed: bool,
    pub(super) up_stage: Vec<Vec<Desc>>,
    pub(super) rr: usize,
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
        let room = self.umem.frame_size() - wasmswitch_core::umem::HEADROOM;
        for slot in 0..self.reads.len() {
            if self.reads[slot] != NO_FRAME {
                continue;
            }
            let Some(frame) = self.cache.alloc() else {
                self.stats.rx_alloc_failed.inc();
                break;
            };
            let e = self.ring.read_sqe(frame + HEADROOM, room, READ_TAG | slot as u64);
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
                            let e = std::io::Error::from_raw_os_error(-res);
                            // EBADFD: the TAP was deleted, which the dataplane reports (once,
                            // with what to do); this worker only says it stopped reading.
                            let level = if res == -libc::EBADFD { log::Level::Info } else { log::Level::Error };
                            log::log!(
                                level,
                                "host worker {}: TAP reads keep failing ({e}), no more reads posted",
                                self.idx
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

    pub(super) fn run(&mut self) {
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
