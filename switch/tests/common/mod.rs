//! Helpers shared by the daemon and lab tests.
#![allow(dead_code)]

pub mod packet_socket;

pub use wasmswitch_testkit::daemon::*;
// Each test binary uses some of these.
#[allow(unused_imports)]
pub use wasmswitch_testkit::plugin::{
    counting_plugin, example_plugin, plugin_that_faults_after, plugin_with_init_and_process, plugin_with_process,
    spinning_plugin,
};

/// Whether real-interface tests can run. Under CI=true a missing capability is a failure, not a
/// skip; elsewhere the test says why it skips.
pub fn require_lab(test: &str) -> bool {
    wasmswitch_testkit::env::ready(test, &[wasmswitch_testkit::env::Need::Lab])
}
