//! The wasmswitch daemon: configuration, worker threads, metrics and control API, CLI commands.
//!
//! The datapath itself lives in `wasmswitch-core` (I/O-free) and the drivers; this crate wires
//! them to threads, files, sockets and signals.

pub mod api;
pub mod bench;
pub mod check;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod demo;
pub mod drivers;
pub mod error_text;
pub mod lab;
pub mod metrics;
pub mod notify;
pub mod plugin_cmd;
pub mod plugins;
pub mod privileges;
