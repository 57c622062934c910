//! The few system calls the switch makes outside a driver: a thread's CPU affinity (datapath
//! workers, the benchmark) and an interface's index by name (the drivers, the interface watch,
//! `check`). Each driver keeps its own (AF_XDP sockets and BPF in `wasmswitch-afxdp`, the TAP and
//! io_uring in `wasmswitch-tap`); what several of them need is here, once.

#![warn(unreachable_pub, missing_docs)]
#![warn(clippy::cast_possible_truncation)]

use std::ffi::CString;
use std::io;

/// `ret`, or the OS error when it is -1.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `if_nametoindex`, in the caller's network namespace.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Lets the calling thread run on every online CPU again (a worker whose `cpu` a reload took away).
pub fn unpin() -> io::Result<()> {
    #[expect(clippy::cast_possible_truncation, reason = "a CPU count, at least 1")]
    // SAFETY: sysconf has no memory effects.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    // SAFETY: cpu_set_t is plain data (a bit array); all zeroes is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..online.min(8 * std::mem::size_of::<libc::cpu_set_t>()) {
        // SAFETY: CPU_SET writes one bit inside `set`; `cpu` is within its size.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes of `set`.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// The CPUs `thread` may run on, as the kernel has them now.
///
/// # Safety
/// `thread` is a live or finished but not yet joined (or detached) thread: a `JoinHandle`
/// held unjoined guarantees it.
pub unsafe fn cpus_of(thread: libc::pthread_t) -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data (a bit array); all zeroes is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: writes at most `size` bytes into `set`; `thread` is valid (the caller's contract).
    match unsafe { libc::pthread_getaffinity_np(thread, size, &mut set) } {
        // SAFETY: CPU_ISSET reads one bit inside `set`; `c` is within its size.
        0 => Ok((0..8 * size).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// The CPUs the calling thread may run on (its affinity: what a cpuset, `taskset` or systemd's
/// `CPUAffinity=` left it, and what threads it starts inherit).
pub fn cpus_of_this_thread() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data (a bit array); all zeroes is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: writes at most `size` bytes into `set`.
    cvt(unsafe { libc::sched_getaffinity(0, size, &mut set) })?;
    // SAFETY: CPU_ISSET reads one bit inside `set`; `c` is within its size.
    Ok((0..8 * size).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Pins the calling thread to `cpu` (datapath workers, the benchmark generator).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data (a bit array); all zeroes is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_ZERO writes only inside `set`.
    unsafe { libc::CPU_ZERO(&mut set) };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: CPU_SET writes one bit inside `set`; `cpu` is within its size (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes of `set`.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_an_index_and_a_made_up_name_has_none() {
        assert!(ifindex("lo").is_some_and(|i| i > 0));
        assert_eq!(ifindex("no-such-if0"), None);
        assert_eq!(ifindex("nul\0name"), None, "a name with a NUL is no interface");
    }

    #[test]
    fn this_thread_may_run_somewhere_and_a_cpu_out_of_the_set_is_refused() {
        let cpus = cpus_of_this_thread().unwrap();
        assert!(!cpus.is_empty());
        assert_eq!(pin_to_cpu(1 << 20).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }
}
