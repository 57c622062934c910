//! Plugin host (in progress).
pub use wasmtime;
