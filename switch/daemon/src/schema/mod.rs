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

/// A library enum the file names by word (`native`, `zerocopy`): the words are written once,
/// where the config implements this for it.
pub trait Choice: Sized + Copy + PartialEq + 'static {
    /// Every value.
    const ALL: &'static [Self];
    /// `auto` and every value's word, in order, as an error lists what it expected.
    const WORDS: &'static [&'static str];
    /// The value's word in the file.
    fn word(self) -> &'static str;
}

/// `auto` (the driver profile chooses) or one value of a library enum `T`, written as its word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Auto<T> {
    /// Chosen by the driver profile (the default).
    #[default]
    Auto,
    /// This value, whatever the profile says.
    Set(T),
}

impl<T: Copy> Auto<T> {
    /// The value asked for; `None` for `auto`.
    pub fn get(self) -> Option<T> {
        match self {
            Auto::Auto => None,
            Auto::Set(v) => Some(v),
        }
    }
}

impl<T: Choice> Serialize for Auto<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Auto::Auto => "auto",
            Auto::Set(v) => v.word(),
        })
    }
}

impl<'de, T: Choice> Deserialize<'de> for Auto<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use std::marker::PhantomData;
        // Read as an enum of unit variants, as serde's derive reads one, so that an unknown
        // word is reported where the value is written, not at its key.
        struct Word<T>(PhantomData<T>);
        impl<T: Choice> serde::de::Visitor<'_> for Word<T> {
            type Value = Auto<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "one of {}", T::WORDS.join(", "))
            }
            fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<Auto<T>, E> {
                if word == "auto" {
                    return Ok(Auto::Auto);
                }
                let found = T::ALL.iter().copied().find(|v| v.word() == word);
                found.map(Auto::Set).ok_or_else(|| E::unknown_variant(word, T::WORDS))
            }
        }
        impl<'de, T: Choice> serde::de::DeserializeSeed<'de> for Word<T> {
            type Value = Auto<T>;
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Auto<T>, D::Error> {
                d.deserialize_identifier(self)
            }
        }
        struct Enum<T>(PhantomData<T>);
        impl<'de, T: Choice> serde::de::Visitor<'de> for Enum<T> {
            type Value = Auto<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "one of {}", T::WORDS.join(", "))
            }
            fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Auto<T>, A::Error> {
                use serde::de::VariantAccess;
                let (v, variant) = data.variant_seed(Word(PhantomData))?;
                variant.unit_variant()?;
                Ok(v)
            }
        }
        d.deserialize_enum("Auto", T::WORDS, Enum(PhantomData))
    }
}
