//! systemd's readiness protocol (`sd_notify`): with `Type=notify`, the service manager waits
//! for `READY=1`, shows `RELOADING=1` during a reload and `STOPPING=1` at shutdown. Without
//! `NOTIFY_SOCKET` (not under systemd) every call does nothing.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. `READY=1`) to the service manager, if there is one. Failures are
/// logged once per call and otherwise ignored: readiness is advisory.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        // A leading `@` names a socket in the abstract namespace.
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|a| UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &a));
    if let Err(e) = sent {
        log::warn!("cannot notify the service manager ({path}): {e}");
    }
}

/// `RELOADING=1` with the monotonic timestamp systemd 253+ expects alongside it.
pub fn reloading() {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which lives on our stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000;
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}
