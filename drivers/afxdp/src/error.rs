//! Operator-facing errors: each names the interface and says what to do.

use std::io;

use crate::profile::BindMode;

/// Why the AF_XDP driver could not open or run a port.
#[derive(Debug, thiserror::Error)]
pub enum AfXdpError {
    /// The interface does not exist in this network namespace.
    #[error("interface {iface:?} does not exist in this network namespace: check the port's interface name (`ip link show`)")]
    InterfaceMissing {
        /// The interface's name.
        iface: String,
    },

    /// A queue to open is past the interface's channels.
    #[error(
        "interface {iface}: queue {queue} does not exist, the interface has {channels} queue(s) (0..={last}); \
         remove it from the port's queue list, or raise the channel count (`ethtool -L {iface} combined N`)",
        last = channels.saturating_sub(1)
    )]
    QueueOutOfRange {
        /// The interface's name.
        iface: String,
        /// The queue id asked for.
        queue: u32,
        /// Queues the interface has.
        channels: u32,
    },

    /// The kernel has no AF_XDP sockets.
    #[error("interface {iface}: this kernel has no AF_XDP sockets (socket(AF_XDP) failed with EAFNOSUPPORT); use a kernel built with CONFIG_XDP_SOCKETS=y (5.10 or newer)")]
    NoAfXdp {
        /// The interface's name.
        iface: String,
    },

    /// A syscall was refused for want of privilege.
    #[error("interface {iface}: {what} was refused ({source}): run as root or grant {}", needs(what))]
    Permission {
        /// The interface's name.
        iface: String,
        /// The operation, as its caller named it.
        what: &'static str,
        /// The refusal (`EPERM` or `EACCES`).
        source: io::Error,
    },

    /// Registering the UMEM ran into the locked-memory limit.
    #[error("interface {iface}: {what} failed ({source}): the UMEM is locked memory; grant CAP_IPC_LOCK or raise the memlock limit (`ulimit -l`, systemd `LimitMEMLOCK=infinity`)")]
    MemLock {
        /// The interface's name.
        iface: String,
        /// The operation, as its caller named it.
        what: &'static str,
        /// The failure (`ENOBUFS` or `ENOMEM`).
        source: io::Error,
    },

    /// A zero-copy bind was refused on a queue.
    #[error("interface {iface} (driver {driver}): AF_XDP zero-copy is not supported on queue {queue} ({source}); set `bind: copy` for this port to fall back to copy mode")]
    ZeroCopyUnsupported {
        /// The interface's name.
        iface: String,
        /// The kernel driver's name.
        driver: String,
        /// The queue id.
        queue: u32,
        /// The bind's error.
        source: io::Error,
    },

    /// Zero-copy was asked for and the driver does not declare it.
    #[error("interface {iface} (driver {driver}) does not offer AF_XDP zero-copy (the XDP features it declares: {features}); set `bind: copy` for this port, or leave `bind` out for its driver's profile")]
    NoZeroCopy {
        /// The interface's name.
        iface: String,
        /// The kernel driver's name.
        driver: String,
        /// The XDP features it declares, by their uapi names.
        features: String,
    },

    /// Attaching the program in native (driver) mode was refused.
    #[error(
        "interface {iface} (driver {driver}): native XDP was refused ({source}); set `mode: generic` in this port's afxdp section"
    )]
    NativeUnsupported {
        /// The interface's name.
        iface: String,
        /// The kernel driver's name.
        driver: String,
        /// The attach's error.
        source: io::Error,
    },

    /// Another XDP program is attached to the interface.
    #[error(
        "interface {iface} already has an XDP program attached ({mode}, program id {prog_id}); \
         stop whatever owns it, or detach it with `ip link set dev {iface} xdp off` (a bpf_link owner must close its link)"
    )]
    AlreadyAttached {
        /// The interface's name.
        iface: String,
        /// That program's id.
        prog_id: u32,
        /// How it is attached (`native`, `generic`, `offloaded`, ...).
        mode: &'static str,
    },

    /// Another AF_XDP socket has the queue bound.
    #[error("interface {iface}: queue {queue} is already bound by another AF_XDP socket (another switch, OVS?): stop it or choose other queues")]
    QueueBusy {
        /// The interface's name.
        iface: String,
        /// The queue id.
        queue: u32,
    },

    /// The port's bind mode is not the one its shared UMEM is bound in.
    #[error(
        "interface {iface}: bind mode {wanted} conflicts with the shared UMEM, which {first} bound in {have} mode; \
         every socket of one UMEM uses the same mode: set `bind: {}` for this port or put it in another UMEM group \
         (the port's `umem:` key; by default each bind mode has its own)",
        .have.config_value()
    )]
    UmemModeMismatch {
        /// The interface's name.
        iface: String,
        /// The mode this port asked for.
        wanted: BindMode,
        /// The mode the UMEM's sockets use.
        have: BindMode,
        /// The socket that bound the UMEM first (`<interface> queue <id>`).
        first: String,
    },

    /// The UMEM's frame size in bytes is not one AF_XDP takes.
    #[error(
        "UMEM frame size {0} cannot be used by AF_XDP (aligned mode needs 2048 up to the page size, a power of two)"
    )]
    BadFrameSize(u32),

    /// A ring size is not a power of two from 64 to 65536.
    #[error("interface {iface}: ring size {size} for the {ring} ring is not a power of two between 64 and 65536")]
    BadRingSize {
        /// The interface's name.
        iface: String,
        /// The ring (`rx`, `tx`, `fill` or `completion`).
        ring: &'static str,
        /// The entries asked for.
        size: u32,
    },

    /// The kernel refused the redirect program.
    #[error("interface {iface}: loading the XDP redirect program failed: {source}{}", if log.is_empty() { String::new() } else { format!("\nverifier log:\n{log}") })]
    ProgLoad {
        /// The interface's name.
        iface: String,
        /// The load's error.
        source: io::Error,
        /// The verifier's log; empty when it gave none.
        log: String,
    },

    /// Any other syscall failure.
    #[error("interface {iface}: {what} failed: {source}")]
    Io {
        /// The interface's name.
        iface: String,
        /// The operation, as its caller named it.
        what: &'static str,
        /// The failure.
        source: io::Error,
    },
}

/// The capability the operation `what` (as [`AfXdpError::sys`] is told it) needs.
fn needs(what: &str) -> &'static str {
    if what.starts_with("socket(AF_XDP)") {
        "CAP_NET_RAW"
    } else if what.contains("BPF_MAP_CREATE") || what.contains("BPF_PROG_LOAD") {
        "CAP_BPF and CAP_NET_ADMIN"
    } else if what.contains("UMEM") {
        "CAP_IPC_LOCK"
    } else if what.contains("BPF_LINK_CREATE") || what.contains("XSKMAP") {
        "CAP_NET_ADMIN and CAP_BPF"
    } else {
        "CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_IPC_LOCK (README: Least privilege)"
    }
}

impl AfXdpError {
    /// Maps a syscall failure: privilege, locked-memory and missing-AF_XDP errors get their own
    /// variant.
    pub(crate) fn sys(iface: &str, what: &'static str, e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => AfXdpError::Permission { iface: iface.into(), what, source: e },
            Some(libc::ENOBUFS) | Some(libc::ENOMEM) if what.contains("UMEM") => {
                AfXdpError::MemLock { iface: iface.into(), what, source: e }
            }
            Some(libc::EAFNOSUPPORT) => AfXdpError::NoAfXdp { iface: iface.into() },
            _ => AfXdpError::Io { iface: iface.into(), what, source: e },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_interface_and_the_fix() {
        let e = AfXdpError::sys(
            "eth9",
            "creating the XSKMAP (bpf BPF_MAP_CREATE)",
            io::Error::from_raw_os_error(libc::EPERM),
        );
        let s = e.to_string();
        assert!(s.contains("eth9") && s.contains("CAP_BPF and CAP_NET_ADMIN"), "{s}");
        // Each operation names what it needs.
        let e = AfXdpError::sys("eth9", "socket(AF_XDP)", io::Error::from_raw_os_error(libc::EPERM));
        assert!(e.to_string().ends_with("grant CAP_NET_RAW"), "{e}");
        let e =
            AfXdpError::sys("eth9", "registering the UMEM (XDP_UMEM_REG)", io::Error::from_raw_os_error(libc::ENOBUFS));
        assert!(e.to_string().contains("grant CAP_IPC_LOCK or raise the memlock limit"), "{e}");
        let e = AfXdpError::sys("eth9", "socket(AF_XDP)", io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        assert!(matches!(e, AfXdpError::NoAfXdp { .. }));
        let e = AfXdpError::QueueOutOfRange { iface: "v0".into(), queue: 4, channels: 2 };
        assert!(e.to_string().contains("queue 4 does not exist, the interface has 2 queue(s) (0..=1)"), "{e}");
        let e = AfXdpError::ZeroCopyUnsupported {
            iface: "v0".into(),
            driver: "veth".into(),
            queue: 0,
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.to_string().contains("bind: copy"), "{e}");
        // Every fix a message suggests is a key and value the config accepts.
        let e = AfXdpError::UmemModeMismatch {
            iface: "v1".into(),
            wanted: BindMode::Copy,
            have: BindMode::ZeroCopy,
            first: "eth0 queue 0".into(),
        };
        assert!(e.to_string().contains("set `bind: zerocopy`"), "{e}");
        assert!(e.to_string().contains("the port's `umem:` key"), "{e}");
        let e = AfXdpError::NativeUnsupported {
            iface: "v0".into(),
            driver: "e1000".into(),
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.to_string().contains("`mode: generic`"), "{e}");
    }
}
