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

mod link;
mod queue;
mod worker;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmswitch_core::pool::{AllocMode, PoolCache, SharedPool};

use crate::error::TapError;
use crate::stats::{HostQueueStats, HostWorkerStats, TapStats};
use crate::tap::TapDevice;
use crate::uring::{HostRing, UringFeatures, UringOptions};
use link::{Doorbell, Link};
pub use queue::HostPortQueue;
use worker::{HostWorker, NO_FRAME};

/// Bytes left free before the packet in frames the host worker reads into
/// ([`wasmswitch_core::umem::HEADROOM`]).
pub const HEADROOM: u64 = wasmswitch_core::umem::HEADROOM as u64;
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
    /// How each host worker's io_uring is set up.
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
            // One TCP flow into the host bursts a window's worth: 1024 dropped hundreds to
            // thousands of its segments in 5 s (README, "Host port").
            ring_size: 4096,
            reads_in_flight: 8,
            rx_cache: 64,
            uring: UringOptions::default(),
            idle_spins: 64,
            idle_timeout: Duration::from_millis(10),
            manage_link: true,
        }
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
        let max_mtu = umem.frame_size() - wasmswitch_core::umem::HEADROOM - 14;
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

    /// The TAP device.
    pub fn tap(&self) -> &TapDevice {
        &self.tap
    }

    /// The port's counters, for the exporter.
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
