//! Errors of the TAP driver, each saying what went wrong and what to do about it.

use std::io;

/// Why the TAP driver could not create, configure or run the host port.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The kernel has no TUN/TAP device.
    #[error("/dev/net/tun does not exist: load the tun module (`modprobe tun`) or run where TUN/TAP is available")]
    NoTunDevice,
    #[error("creating TAP {name:?}: permission denied (needs CAP_NET_ADMIN, i.e. root or `setcap cap_net_admin+ep`)")]
    /// Creating or configuring the TAP needs `CAP_NET_ADMIN`.
    PermissionDenied {
        /// The TAP's name.
        name: String,
    },
    #[error("interface name {name:?} is already taken by another interface")]
    /// Another interface has the name.
    NameTaken {
        /// The name asked for.
        name: String,
    },
    #[error("bad interface name {name:?}: {why}")]
    /// The name is no valid interface name.
    BadName {
        /// The name asked for.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    #[error("bad MAC address {mac}: {why}")]
    /// The MAC address cannot be the TAP's.
    BadMac {
        /// The address as given.
        mac: String,
        /// What is wrong with it.
        why: &'static str,
    },
    #[error("bad MTU {mtu}: must be between 68 and {max} (frame size minus headroom minus the Ethernet header)")]
    /// The MTU is out of range.
    BadMtu {
        /// The MTU asked for, in bytes.
        mtu: u32,
        /// The largest MTU allowed, in bytes.
        max: u32,
    },
    #[error("{what} on {name:?}: {source}")]
    /// A syscall on the TAP failed.
    Io {
        /// The operation.
        what: &'static str,
        /// The TAP's name.
        name: String,
        /// The failure.
        #[source]
        source: io::Error,
    },
    #[error("io_uring {what}: {source}")]
    /// Setting up or using an io_uring failed.
    Uring {
        /// The operation.
        what: &'static str,
        /// The failure.
        #[source]
        source: io::Error,
    },
    #[error("bad host port configuration: {0}")]
    /// The host port's settings do not fit together (the message says how).
    Config(String),
}

impl TapError {
    pub(crate) fn io(what: &'static str, name: &str, source: io::Error) -> Self {
        TapError::Io { what, name: name.to_string(), source }
    }
}
