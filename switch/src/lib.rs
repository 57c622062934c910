//! The wasmswitch daemon: configuration, worker threads, metrics and control API, CLI commands.
//!
//! The datapath itself lives in `wasmswitch-core` (I/O-free) and the drivers; this crate wires
//! them to threads, files, sockets and signals.

pub mod config;
pub mod dataplane;
pub mod metrics;
pub mod api;
pub mod daemon;
pub mod bench;
pub mod demo;
pub mod lab;
pub mod plugins;
