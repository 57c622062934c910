//! The test kit every crate's tests share (a dev-dependency, never in the daemon): whether the
//! machine can run a test ([`env`]), the network-namespace lab of veth pairs ([`lab`], which the
//! demo builds too), hand-made plugin components ([`plugin`]) and helpers for running the
//! daemon and talking to it ([`daemon`]).

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
#![warn(missing_docs)]

pub mod daemon;
pub mod env;
pub mod lab;
#[cfg(feature = "plugins")]
pub mod plugin;

use std::path::{Path, PathBuf};

/// The repository's root (tests read `wit/`, `plugins/out/`, `configs/` from it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
