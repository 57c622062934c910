//! The wasmswitch daemon: configuration, worker threads, metrics and control API.
//!
//! The datapath itself lives in `wasmswitch-core` (I/O-free) and the drivers; this crate wires
//! them to threads, files, sockets and signals. The `wasmswitch` command (`switch/`) runs it
//! and adds the client and the tooling (`wasmswitch-lab`: bench, demo, lab), which this crate
//! does not carry.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod drivers;
pub mod error_text;
pub mod metrics;
pub mod notify;
pub mod plugins;
pub mod privileges;
pub mod prom;
pub mod reload;
pub mod schema;
