//! The I/O-free core of wasmswitch.
//!
//! Everything here can be driven by a test without a socket (the quinn split): frame memory and
//! its pool, packet batches, header parsing, the forwarding database, and the per-batch pipeline
//! that turns received descriptors into transmitted ones. Drivers (`drivers/`) own the syscalls
//! and implement [`port::PortQueue`]; the daemon (`switch/`) owns threads, config and metrics.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
// Every public item says what it is; casts that could drop bits say why they cannot.
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]

pub mod batch;
pub mod counter;
pub mod fdb;
pub mod pipeline;
pub mod pool;
pub mod port;
pub mod stats;
pub mod types;
pub mod umem;
pub mod verdict;
pub mod vlan;
/// Packet layouts and the parser live in their own `no_std` crate, shared with the plugin SDK.
pub use wasmswitch_wire as wire;

pub use batch::{Batch, Desc, BATCH_SIZE, DEFAULT_BATCH};
pub use pool::{BulkReturn, PoolCache, PoolStats, SharedPool};
pub use port::{PortId, PortQueue};
pub use umem::Umem;
pub use verdict::Verdict;
