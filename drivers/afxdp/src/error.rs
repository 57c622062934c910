//! Operator-facing errors: each names the interface and says what to do.

use std::io;

use crate::profile::BindMode;

#[derive(Debug, thiserror::Error)]
pub enum AfXdpError {
    #[error("interface {iface:?} does not exist in this network namespace: check the port's interface name (`ip link show`)")]
    InterfaceMissing { iface: String },

    #[error(
        "interface {iface}: queue {queue} does not exist, the interface has {channels} queue(s) (0..={last}); \
         remove it from the port's queue list, or raise the channel count (`ethtool -L {iface} combined N`)",
        last = channels.saturating_sub(1)
    )]
    QueueOutOfRange { iface: String, queue: u32, channels: u32 },

    #[error("interface {iface}: this kernel has no AF_XDP sockets (socket(AF_XDP) failed with EAFNOSUPPORT); use a kernel built with CONFIG_XDP_SOCKETS=y (5.10 or newer)")]
    NoAfXdp { iface: String },

    #[error("interface {iface}: {what} was refused ({source}): run as root or grant {}", needs(what))]
    Permission { iface: String, what: &'static str, source: io::Error },

    #[error("interface {iface}: {what} failed ({source}): the UMEM is locked memory; grant CAP_IPC_LOCK or raise the memlock limit (`ulimit -l`, systemd `LimitMEMLOCK=infinity`)")]
    MemLock { iface: String, what: &'static str, source: io::Error },

    #[error("interface {iface} (driver {driver}): AF_XDP zero-copy is not supported on queue {queue} ({source}); set `bind: copy` for this port to fall back to copy mode")]
    ZeroCopyUnsupported { iface: String, driver: String, queue: u32, source: io::Error },

    #[error("interface {iface} (driver {driver}) does not offer AF_XDP zero-copy (the XDP features it declares: {features}); set `bind: copy` for this port, or leave `bind` out for its driver's profile")]
    NoZeroCopy { iface: String, driver: String, features: String },

    #[error(
        "interface {iface} (driver {driver}): native XDP was refused ({source}); set `mode: generic` in this port's afxdp section"
    )]
    NativeUnsupported { iface: String, driver: String, source: io::Error },

    #[error(
        "interface {iface} already has an XDP program attached ({mode}, program id {prog_id}); \
         stop whatever owns it, or detach it with `ip link set dev {iface} xdp off` (a bpf_link owner must close its link)"
    )]
    AlreadyAttached { iface: String, prog_id: u32, mode: &'static str },

    #[error("interface {iface}: queue {queue} is already bound by another AF_XDP socket (another switch, OVS?): stop it or choose other queues")]
    QueueBusy { iface: String, queue: u32 },

    #[error(
        "interface {iface}: bind mode {wanted} conflicts with the shared UMEM, which {first} bound in {have} mode; \
         every socket of one UMEM uses the same mode: set `bind: {}` for this port or put it in another UMEM group \
         (the port's `umem:` key; by default each bind mode has its own)",
        .have.config_value()
    )]
    UmemModeMismatch { iface: String, wanted: BindMode, have: BindMode, first: String },

    #[error(
        "UMEM frame size {0} cannot be used by AF_XDP (aligned mode needs 2048 up to the page size, a power of two)"
    )]
    BadFrameSize(u32),

    #[error("interface {iface}: ring size {size} for the {ring} ring is not a power of two between 64 and 65536")]
    BadRingSize { iface: String, ring: &'static str, size: u32 },

    #[error("interface {iface}: loading the XDP redirect program failed: {source}{}", if log.is_empty() { String::new() } else { format!("\nverifier log:\n{log}") })]
    ProgLoad { iface: String, source: io::Error, log: String },

    #[error("interface {iface}: {what} failed: {source}")]
    Io { iface: String, what: &'static str, source: io::Error },
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
