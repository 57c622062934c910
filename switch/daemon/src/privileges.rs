//! Least privilege. Before it opens anything, and before any other thread exists, the daemon
//! switches to the configured `user` (if any), drops to the capabilities that opening ports
//! needs ([`KEPT`]: at start, on a reload that adds an AF_XDP port, and when a port is
//! re-attached to an interface that came back), drops every other one from its bounding set
//! too, and sets no-new-privileges. Capabilities are per thread: doing it first means every
//! thread the daemon starts inherits exactly these.

use std::ffi::CString;
use std::io;

use anyhow::{bail, Context, Result};

/// The capabilities the running daemon keeps, and why.
pub const KEPT: [(u32, &str, &str); 4] = [
    (12, "cap_net_admin", "attach XDP programs (bpf_link) and turn GRO/LRO off in generic mode"),
    (13, "cap_net_raw", "create AF_XDP sockets"),
    (14, "cap_ipc_lock", "register the UMEM with the kernel (pinned memory beyond RLIMIT_MEMLOCK)"),
    (39, "cap_bpf", "load the redirect program and create its XSKMAP"),
];

/// [`KEPT`] as a capability bit mask (what `/proc/PID/status` shows as `CapEff`).
pub fn kept_mask() -> u64 {
    KEPT.iter().fold(0, |m, (c, _, _)| m | 1 << c)
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn cvt(r: libc::c_long) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// (effective, permitted) of the calling thread.
fn capget() -> io::Result<(u64, u64)> {
    let mut h = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let mut d = [CapData::default(); 2];
    // SAFETY: version 3 takes a header and two data structs, both valid and writable here.
    cvt(unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) })?;
    let join = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    Ok((join(d[0].effective, d[1].effective), join(d[0].permitted, d[1].permitted)))
}

/// Sets effective and permitted to `mask`, inheritable to none.
fn capset(mask: u64) -> io::Result<()> {
    let h = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let lo = CapData { effective: mask as u32, permitted: mask as u32, inheritable: 0 };
    let hi = CapData { effective: (mask >> 32) as u32, permitted: (mask >> 32) as u32, inheritable: 0 };
    let d = [lo, hi];
    // SAFETY: version 3 reads a header and two data structs, both valid here.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &h, d.as_ptr()) })
}

fn prctl(op: libc::c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the prctl operations used here take integer arguments only.
    if unsafe { libc::prctl(op, arg, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// (uid, gid) of `user`.
pub fn lookup(user: &str) -> Result<(libc::uid_t, libc::gid_t)> {
    let name = CString::new(user).context("a user name with a NUL byte")?;
    // SAFETY: all-zero is a valid `passwd` (pointers null, integers zero); getpwnam_r fills it.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the use of `pw`'s strings
    // (none are read).
    let r = unsafe { libc::getpwnam_r(name.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 || out.is_null() {
        bail!("no user called `{user}`");
    }
    Ok((pw.pw_uid, pw.pw_gid))
}

/// Switches to `user` when given and drops to [`KEPT`] (those of them the process has), with
/// no-new-privileges. Call before any thread starts. Returns a line for the log.
pub fn drop_privileges(user: Option<&str>) -> Result<String> {
    let ids = user.map(lookup).transpose()?;
    let (_, permitted) = capget().context("capget")?;
    let keep = kept_mask() & permitted;
    // The bounding set first (needs CAP_SETPCAP, which a process started without root may
    // lack: then only the effective and permitted sets shrink). It limits what the process
    // can gain later, not what it holds now, so the user switch below still works.
    let last: u32 =
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40);
    let mut bounding = true;
    for cap in (0..=last).filter(|c| kept_mask() & 1 << c == 0) {
        if prctl(libc::PR_CAPBSET_DROP, cap.into()).is_err() {
            bounding = false;
            break;
        }
    }
    if let Some((uid, gid)) = ids {
        // Keep the permitted set across the switch; the capset below makes it effective again.
        prctl(libc::PR_SET_KEEPCAPS, 1).context("PR_SET_KEEPCAPS")?;
        let ok = |r: libc::c_int, what: &str| -> Result<()> {
            if r != 0 {
                return Err(io::Error::last_os_error()).context(what.to_string());
            }
            Ok(())
        };
        // SAFETY: an empty group list (null with length 0).
        ok(unsafe { libc::setgroups(0, std::ptr::null()) }, "setgroups")?;
        // SAFETY: integer arguments only.
        ok(unsafe { libc::setresgid(gid, gid, gid) }, "setresgid")?;
        // SAFETY: integer arguments only.
        ok(unsafe { libc::setresuid(uid, uid, uid) }, "setresuid")?;
        prctl(libc::PR_SET_KEEPCAPS, 0).context("PR_SET_KEEPCAPS")?;
    }
    capset(keep).context("capset")?;
    // Children (none today) inherit nothing.
    let _ = prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong);
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1).context("PR_SET_NO_NEW_PRIVS")?;
    let (effective, permitted) = capget().context("capget")?;
    if effective != keep || permitted != keep {
        bail!("capabilities are {effective:#x}/{permitted:#x} after dropping to {keep:#x}");
    }
    let names: Vec<&str> = KEPT.iter().filter(|(c, _, _)| keep & 1 << c != 0).map(|(_, n, _)| *n).collect();
    let missing: Vec<&str> = KEPT.iter().filter(|(c, _, _)| keep & 1 << c == 0).map(|(_, n, _)| *n).collect();
    Ok(format!(
        "privileges dropped: {}capabilities {}{}{}, no-new-privileges",
        user.map(|u| format!("user {u}, ")).unwrap_or_default(),
        if names.is_empty() { "none".to_string() } else { names.join(",") },
        if missing.is_empty() {
            String::new()
        } else {
            format!(" (started without {}: ports may fail to open)", missing.join(","))
        },
        if bounding { "" } else { " (bounding set kept: no cap_setpcap)" },
    ))
}
