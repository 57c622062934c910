//! Tooling around the daemon, kept out of it: the network-namespace lab (`lab`), the demo that
//! runs the daemon in it (`demo`) and the `sim` benchmark (`bench`). The `wasmswitch` command
//! offers `bench` and `demo` through this crate; tests build their labs with it.

pub mod bench;
pub mod demo;
pub use wasmswitch_testkit::lab;
