//! AF_XDP driver for wasmswitch: real NICs and veth pairs behind `wasmswitch_core::PortQueue`.
//!
//! Raw AF_XDP over `libc` (no libbpf, no C toolchain): one socket per (interface, queue), all
//! sharing one UMEM (the core's [`Umem`](wasmswitch_core::Umem)) through `XDP_SHARED_UMEM`, so a
//! frame received on one port is transmitted on another by moving its descriptor. Each socket
//! has its own fill and completion rings. A five-instruction XDP program, assembled in
//! [`bpf`], redirects each RX queue to its socket through an XSKMAP and passes traffic of
//! unmapped queues to the stack; it is attached with a bpf_link, so it disappears with the
//! process, even on SIGKILL.
//!
//! # Wiring it into the daemon
//!
//! ```no_run
//! use std::sync::Arc;
//! use wasmswitch_afxdp::{AfXdpPort, PortSpec, UmemRegistration};
//! use wasmswitch_core::Umem;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let umem = Arc::new(Umem::new(16384, 2048)?);
//! // One registration per UMEM; every port opened with it shares the UMEM.
//! let reg = UmemRegistration::new(umem.clone());
//! let mut port = AfXdpPort::open(&PortSpec::new("eth0"), &reg)?;
//! log::info!("eth0: {}", port.decision()); // "driver veth (profile veth): native XDP, copy bind, queues [0, 1] of 2"
//! for (queue_id, queue) in port.take_queues() {
//!     // Give `Box::new(queue)` to the worker that polls `queue_id` (PortSlot { queue, poll_rx: true, .. }).
//!     // A worker without a queue of its own on this port gets `queue.share_tx()` (poll_rx: false).
//!     # let _ = (queue_id, queue);
//! }
//! // Metrics: port.queue_stats() (driver counters), port.xdp_stats() (kernel XDP_STATISTICS).
//! // Shutdown: each worker's Pipeline::shutdown() calls release_all on its queues (frames go back
//! // to the pool once the socket is closed); then drop the port (detaches the program).
//! # Ok(()) }
//! ```
//!
//! Errors ([`AfXdpError`]) are checked before anything touches traffic and name the interface
//! and the fix: missing interface, queue out of range, no AF_XDP in the kernel, missing
//! privileges, zero-copy unsupported, an XDP program already attached, a queue already bound.
//!
//! # Sizing the UMEM
//!
//! Every queue keeps its fill ring full (default 1024 frames) and may have up to its TX ring
//! size in flight: [`AfXdpPort::frames_wanted`]. Add each worker's pool cache (128) and slack
//! for packets in the pipeline; a starved fill ring shows as `QueueStats::fill_starved` and as
//! `rx_dropped` in the kernel's statistics.
//!
//! # Modes
//!
//! [`profile`] picks native/generic attach and copy/zero-copy bind from the kernel driver name
//! (`mlx5_core`, `mvpp2`, `veth`, anything else); [`Overrides`] win. All sockets of one UMEM use
//! the bind mode of the first (a kernel rule); mixing zero-copy and copy ports needs two UMEMs
//! (the switch gives each bind mode its own: [`decide`] tells which a port needs).
//!
//! # Frame ownership
//!
//! The driver records every frame it posts to a fill or TX ring and clears it when the frame
//! comes back (RX or completion), so `frames_held` is exact and `release_all` can return frames
//! the kernel took from the fill ring but never delivered. Those are returned right after the
//! socket closes, never while the kernel could still write them.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
// Every public item says what it is; casts that could drop bits say why they cannot.
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]

pub mod bpf;
mod btf;
pub mod error;
pub mod profile;
pub mod queue;
pub mod ring;
pub mod sys;
pub mod xsk;

mod port;

pub use error::AfXdpError;
pub use port::{decide, preflight, probe, AfXdpPort, PortSpec, QueueMonitor, UmemRegistration};
pub use profile::{AttachMode, BindMode, Decision, Overrides, RingSizes};
pub use queue::{AfXdpQueue, QueueStats};
pub use xsk::XdpStatistics;
