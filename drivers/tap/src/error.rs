//! Errors of the TAP driver, each saying what went wrong and what to do about it.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("/dev/net/tun does not exist: load the tun module (`modprobe tun`) or run where TUN/TAP is available")]
    NoTunDevice,
    #[error("creating TAP {name:?}: permission denied (needs CAP_NET_ADMIN, i.e. root or `setcap cap_net_admin+ep`)")]
    PermissionDenied { name: String },
    #[error("interface name {name:?} is already taken by another interface")]
    NameTaken { name: String },
    #[error("bad interface name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    #[error("bad MAC address {mac}: {why}")]
    BadMac { mac: String, why: &'static str },
    #[error("bad MTU {mtu}: must be between 68 and {max} (frame size minus headroom minus the Ethernet header)")]
    BadMtu { mtu: u32, max: u32 },
    #[error("{what} on {name:?}: {source}")]
    Io {
        what: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("io_uring {what}: {source}")]
    Uring {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("bad host port configuration: {0}")]
    Config(String),
}

impl TapError {
    pub(crate) fn io(what: &'static str, name: &str, source: io::Error) -> Self {
        TapError::Io { what, name: name.to_string(), source }
    }
}
