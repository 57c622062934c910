//! Tooling around the daemon, kept out of it: the network-namespace lab (`lab`), the demo that
//! runs the daemon in it (`demo`) and the `sim` benchmark (`bench`). The `wasmswitch` command
//! offers `bench` and `demo` through this crate; tests build their labs with it.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
#![warn(missing_docs)]

pub mod bench;
pub mod demo;
pub use wasmswitch_testkit::lab;
