//! The `wasmswitch` command: the daemon (`wasmswitch-daemon`, re-exported here), the control
//! API's client, `check`, `plugin`, and the tooling (`wasmswitch-lab`: bench, demo, lab).

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub, missing_docs)]

pub mod check;
pub mod client;
pub mod plugin_cmd;

pub use wasmswitch_daemon::{
    api, config, daemon, dataplane, drivers, error_text, metrics, notify, plugins, privileges, schema,
};
pub use wasmswitch_lab::{bench, demo, lab};
