//! # wasmswitch plugin SDK
//!
//! Write a packet policy for the wasmswitch switch in Rust, test it natively with
//! `cargo test`, and build it into a WebAssembly component that the switch loads.
//!
//! ```
//! use wasmswitch_plugin_sdk::{export_plugin, Packet, Plugin, Verdict};
//!
//! /// Drops every packet to UDP port 9.
//! struct DropDiscard;
//!
//! impl Plugin for DropDiscard {
//!     fn init(_config: &str) -> Result<Self, String> {
//!         Ok(DropDiscard)
//!     }
//!
//!     fn verdict(&mut self, p: &Packet<'_>) -> Verdict {
//!         match (p.ip_proto(), p.ports()) {
//!             (Some(17), Some((_, 9))) => Verdict::Drop,
//!             _ => Verdict::Pass,
//!         }
//!     }
//! }
//!
//! export_plugin!(DropDiscard);
//! # // Natively, `export_plugin!` expands to nothing and the harness runs the plugin:
//! # use wasmswitch_plugin_sdk::harness::{self, Harness};
//! # let mut h = Harness::<DropDiscard>::init("").unwrap();
//! # assert_eq!(h.run_one(&harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 9)), Verdict::Drop);
//! # assert_eq!(h.run_one(&harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 53)), Verdict::Pass);
//! ```
//!
//! * [`Plugin`] is the trait you implement: `init` parses the config string from the switch's
//!   YAML; `verdict` classifies one packet, or override `process` to see the whole batch.
//! * [`Packet`] and [`Batch`] are zero-copy views of what the switch hands you: metadata from
//!   its parser (length, VLAN, offsets, ports) and the first N bytes of each frame, N being the
//!   plugin's `header-bytes` in the YAML.
//! * [`Counter`], [`log`] and [`now_ns`] are the only things the host offers. There is no
//!   filesystem, network, or randomness: a plugin that imports them is refused.
//! * [`export_plugin!`] generates the component exports in a Wasm build and nothing natively.
//! * [`harness`] (native builds) crafts packets and runs your plugin the way the switch would.
//!
//! The contract itself, with every byte of the layout, is `wit/plugin.wit` at the root of the
//! repository. `plugins/README.md` walks from an empty crate to a loaded plugin.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub, missing_docs)]

pub mod abi;
pub mod config;
#[cfg(not(target_arch = "wasm32"))]
pub mod harness;
pub mod host;
mod plugin;
#[doc(hidden)]
pub mod rt;
pub mod view;

pub use abi::Verdict;
pub use host::{log, now_ns, Counter, Level};
pub use plugin::Plugin;
pub use view::{Batch, Ethernet, Ipv4, Ipv6, Packet, Verdicts};

/// Exports `$ty` (a [`Plugin`]) as the plugin of this crate. Use it once, at the crate root of
/// a `cdylib`. In a native build it expands to nothing, so the same crate's unit tests run
/// on the host through [`harness`].
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            static STATE: $crate::rt::Slot<::core::option::Option<$ty>> =
                $crate::rt::Slot::new(::core::option::Option::None);

            #[unsafe(export_name = "cabi_realloc")]
            unsafe extern "C" fn __wasmswitch_realloc(
                old: *mut u8,
                old_len: usize,
                align: usize,
                new_len: usize,
            ) -> *mut u8 {
                // SAFETY: only the canonical ABI calls this export, with its contract.
                unsafe { $crate::rt::realloc(old, old_len, align, new_len) }
            }

            #[unsafe(export_name = "init")]
            unsafe extern "C" fn __wasmswitch_init(ptr: *const u8, len: usize) -> *mut u8 {
                // SAFETY: only the canonical ABI calls this export, with a lowered string.
                unsafe { $crate::rt::init::<$ty>(&STATE, ptr, len) }
            }

            #[unsafe(export_name = "process")]
            unsafe extern "C" fn __wasmswitch_process(ptr: *const u8, len: usize) -> *mut u8 {
                // SAFETY: only the canonical ABI calls this export, with a lowered list<u8>.
                unsafe { $crate::rt::process::<$ty>(&STATE, ptr, len) }
            }
        };
    };
}
