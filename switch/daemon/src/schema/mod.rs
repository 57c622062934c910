//! What every configuration section is built from, shared by the config and the drivers'
//! own sections: located errors, range checks, names, MAC addresses, the frame budget of an
//! MTU, and the L2 sections. A leaf: it knows no section of the file as a whole.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::umem::HEADROOM;
use wasmswitch_core::wire::MacAddr;

pub mod l2;

/// Ranges every section knows (inclusive); `config::range` lists them with the rest.
pub mod range {
    /// Configured ports.
    pub const PORTS: (usize, usize) = (1, 64);
    /// Smallest MTU of any port (IPv4's minimum datagram).
    pub const MTU_MIN: u32 = 68;
}
pub use range::MTU_MIN;

/// A configuration error with its position in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The config file the error is in.
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: u64,
    /// 1-based; 0 with `line` 0.
    pub column: u64,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}:{}: {}", self.file.display(), self.line, self.column, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A MAC address written `02:ee:00:00:00:01`, parsed when the file is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub MacAddr);

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map(Mac).map_err(serde::de::Error::custom)
    }
}

/// A port's or UMEM group's name: 1-32 letters, digits, `-`, `_` or `.`.
pub fn is_name(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A default value: it has no place in the file.
pub fn unknown<T>(v: T) -> Spanned<T> {
    Spanned::new(v, Location::UNKNOWN, Location::UNKNOWN)
}

/// `a`, or `b` when `a` is a default with no place in the file.
pub fn or_loc(a: Location, b: Location) -> Location {
    if a == Location::UNKNOWN {
        b
    } else {
        a
    }
}

/// A port's MTU when the file gives none.
pub fn default_mtu() -> Spanned<u32> {
    unknown(1500)
}

/// Largest MTU a frame of `frame_size` bytes carries: the headroom (256 bytes), Ethernet header
/// and two VLAN tags (22 bytes) come off (1770 for 2048, 3818 for 4096).
pub fn max_mtu(frame_size: u32) -> u32 {
    frame_size.saturating_sub(HEADROOM + 22)
}

/// Frames past the MTU: Ethernet header plus two VLAN tags.
pub fn max_frame(mtu: u32) -> usize {
    mtu as usize + 14 + 8
}

/// `key` out of [lo, hi]: located at the value, naming the key and the range.
pub fn within<T: PartialOrd + fmt::Display + Copy>(
    err: &impl Fn(Location, String) -> ConfigError,
    key: &str,
    v: &Spanned<T>,
    (lo, hi): (T, T),
) -> Result<(), ConfigError> {
    if v.value < lo || v.value > hi {
        return Err(err(v.referenced, format!("{key} {} is out of range: expected {lo}-{hi}", v.value)));
    }
    Ok(())
}
