//! `tap`: the switch's host port, a TAP device fed by host worker threads over io_uring.
//!
//! Frames with verdict `host` (or flooded to the host port by L2) leave a datapath worker the
//! way cpumap hands XDP frames to another CPU (seed 004): into a per-destination bulk queue of
//! 8 frames, flushed into the host worker's bounded ring when full and at the end of every
//! burst; a full ring drops (counted), nothing blocks. A host worker drains up to `bulk` frames
//! and delivers the whole list at once — N write SQEs straight from the UMEM frames, one
//! `io_uring_enter` — the `netif_receive_skb_list` of this design, then returns the frames to
//! the pool in one bulk (`SharedPool::put_bulk`). The reverse path keeps a few io_uring reads in
//! flight from the TAP into pool frames; completed reads go through a ring to a datapath worker,
//! whose host `PortQueue::rx_burst` hands them to the pipeline as ingress from the host port.
//!
//! # Wiring it into the daemon
//!
//! ```no_run
//! use std::sync::Arc;
//! use wasmswitch_core::{SharedPool, Umem};
//! use wasmswitch_tap::{HostConfig, HostPort, TapConfig, TapDevice};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), Arc::new(Umem::new(4096, 2048)?), 1024);
//! let host_workers = 1;
//! // 1. The device: non-persistent (gone when the last fd closes, also on SIGKILL), link down.
//! let tap = TapDevice::create(&TapConfig {
//!     name: "wss0".into(),
//!     mac: wasmswitch_tap::parse_mac("02:00:00:00:00:01")?,
//!     mtu: 1500,
//!     queues: host_workers, // one TAP queue (fd) per host worker
//! })?;
//! // 2. Host workers (threads) and one host PortQueue per datapath worker; sets the link up.
//! let cfg = HostConfig { datapath_workers: 2, host_workers, bulk: 8, ..HostConfig::default() };
//! let (mut host, queues) = HostPort::start(tap, &pool, &cfg)?;
//! // 3. Give queue w to datapath worker w as the only queue of the host port's `PortSlot`
//! //    (`PortSlot { queues: vec![Box::new(q)], .. }`) and set `PipelineOptions::host_port` to
//! //    that port's id. To L2 the TAP is a normal port: learned, flooded to.
//! //    Metrics: `host.stats()` (an `Arc<TapStats>`, single-writer counters, `totals()` sums).
//! # drop(queues);
//! // 4. Stop: first every datapath worker (`Pipeline::shutdown`, which calls `release_all`
//! //    on its host queue), then the host workers. Dropping `host` does the same as `stop`.
//! host.stop();
//! # Ok(()) }
//! ```
//!
//! Frame accounting: a frame is in exactly one place — a datapath worker's bulk queue or
//! drop list ([`HostPortQueue`]'s `frames_held`), a ring ([`HostPort::frames_in_rings`]), a
//! host worker's list or read in flight, or the pool. After both sides stopped, every frame is
//! back in the pool (`wasmswitch_core::pool::check_no_leak` holds); whichever side stops last
//! drains the rings between them.
//!
//! io_uring options ([`UringOptions`]): registered file, the UMEM registered as one fixed buffer
//! (`WriteFixed`/`ReadFixed`; refused when RLIMIT_MEMLOCK is too low for the UMEM — the worker
//! then falls back to plain writes and logs it), `SINGLE_ISSUER` + `DEFER_TASKRUN` (else
//! `COOP_TASKRUN`). What the kernel granted is in [`HostPort::features`]. The example
//! `host_delivery` measures each step against one `write()` per packet.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
// Every public item says what it is; casts that could drop bits say why they cannot.
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]

mod error;
mod host;
mod ring;
pub mod stats;
mod tap;
mod uring;

pub use error::TapError;
pub use host::{HostConfig, HostPort, HostPortQueue, HEADROOM, MAX_BULK};
pub use stats::{HostQueueStats, HostWorkerStats, TapStats, TapTotals, BATCH_BUCKETS, HIST_LEN};
pub use tap::{check_free, check_mac, check_name, parse_mac, TapConfig, TapDevice};
pub use uring::{Delivered, HostRing, UringFeatures, UringOptions};
