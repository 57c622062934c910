//! The L2 sections: a port's `vlan:`, `storm:` and `fdb:`, the `mirrors:` sessions and
//! `fdb.static` entries, as the file writes them, each with the checks that need nothing
//! else of the file. The checks across ports and what they become in the datapath are
//! `config::l2`'s.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::vlan::{PortVlan, StormLimits, Vid};

use super::{ConfigError, Mac};

/// `vlan.mode`: how a port carries VLANs.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VlanMode {
    /// One VLAN, untagged.
    Access,
    /// The `allowed` VLANs tagged and the `native` one (if any) untagged.
    Trunk,
}

/// A port's `vlan:`. Absent, the port is an access port of VLAN 1 (the Linux bridge's default
/// PVID).
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct VlanSection {
    /// `access` (one VLAN, untagged: `vid`) or `trunk` (`allowed` tagged, `native` untagged).
    pub mode: Spanned<VlanMode>,
    /// The access port's VLAN.
    #[serde(default)]
    pub vid: Option<Spanned<u16>>,
    /// The trunk's tagged VLANs: ids and `"lo-hi"` ranges.
    #[serde(default)]
    pub allowed: Option<Spanned<VidList>>,
    /// The trunk's untagged VLAN; without it untagged frames are dropped.
    #[serde(default)]
    pub native: Option<Spanned<u16>>,
}

/// A list of VLAN ids and inclusive ranges, as written: `[10, "20-29"]` (or one id, `10`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VidList(pub Vec<(u16, u16)>);

impl Serialize for VidList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let items: Vec<String> =
            self.0.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        items.serialize(s)
    }
}

impl<'de> Deserialize<'de> for VidList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VidList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of VLAN ids and \"lo-hi\" ranges, like [10, \"20-29\"]")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<VidList, E> {
                VidItem::from_u64(v).map(|i| VidList(vec![i.0]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<VidList, E> {
                let v = u64::try_from(v).map_err(|_| vid_out_of_range(v))?;
                self.visit_u64(v)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<VidList, E> {
                VidItem::from_f64(v).map(|i| VidList(vec![i.0]))
            }
            // One id or range alone, as a number alone is: `"10"`, `"20-29"`.
            fn visit_str<E: de::Error>(self, s: &str) -> Result<VidList, E> {
                VidItem::from_str(s).map(|i| VidList(vec![i.0]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<VidList, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<VidItem>()? {
                    out.push(item.0);
                }
                Ok(VidList(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl VidList {
    /// Every id listed, ranges expanded, or an error naming `key` and the range.
    pub fn expand(&self, key: &str) -> Result<Vec<Vid>, String> {
        let mut vids = Vec::new();
        for &(a, b) in &self.0 {
            if a > b {
                return Err(format!("{key}: range {a}-{b} is backwards"));
            }
            for v in [a, b] {
                if Vid::new(v).is_none() {
                    return Err(format!("{key}: VLAN id {v} is out of range: expected {}-{}", Vid::MIN, Vid::MAX));
                }
            }
            vids.extend((a..=b).filter_map(Vid::new));
        }
        Ok(vids)
    }
}

impl VidItem {
    /// `"10"` or `"20-29"`.
    fn from_str<E: de::Error>(s: &str) -> Result<VidItem, E> {
        let bad = || E::custom(format!("`{s}` is not a VLAN id or a range like \"20-29\""));
        let (a, b) = match s.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (s.trim(), s.trim()),
        };
        let a: u16 = a.parse().map_err(|_| bad())?;
        let b: u16 = b.parse().map_err(|_| bad())?;
        Ok(VidItem((a, b)))
    }

    fn from_u64<E: de::Error>(v: u64) -> Result<VidItem, E> {
        let v = u16::try_from(v).map_err(|_| vid_out_of_range(v))?;
        Ok(VidItem((v, v)))
    }

    /// YAML reads a number past `u64`, one with a fraction, and a whole one written otherwise
    /// than plainly (`010`, `1e1`) as a float: said as what it is, not as the parser's
    /// "expected type: floating point" (nor as "10 is out of range").
    fn from_f64<E: de::Error>(v: f64) -> Result<VidItem, E> {
        Err(if v.fract() == 0.0 && !(0.0..=f64::from(Vid::MAX)).contains(&v) {
            vid_out_of_range(v)
        } else if v.fract() == 0.0 {
            E::custom(format!(
                "a VLAN id is a plain whole number: write {v} without a leading zero, exponent or decimal point"
            ))
        } else {
            E::custom(format!("{v} is not a VLAN id: expected a whole number 1-4094 or a range like \"20-29\""))
        })
    }
}

/// The one message for a VLAN id past 1-4094 that only the parser sees (a later check names
/// the key for ids that fit a `u16`).
fn vid_out_of_range<E: de::Error>(v: impl fmt::Display) -> E {
    E::custom(format!("VLAN id {v} is out of range: expected 1-4094"))
}

/// One entry of a [`VidList`]: a number or a `"lo-hi"` string (range-checked later, where the
/// error can name the key).
struct VidItem((u16, u16));

impl<'de> Deserialize<'de> for VidItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = VidItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a VLAN id (1-4094) or a range like \"20-29\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<VidItem, E> {
                VidItem::from_u64(v)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<VidItem, E> {
                u64::try_from(v).map_err(|_| vid_out_of_range(v)).and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<VidItem, E> {
                VidItem::from_f64(v)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<VidItem, E> {
                VidItem::from_str(s)
            }
        }
        d.deserialize_any(V)
    }
}

/// A port's `storm:` limits, in flooded frames per second entering on the port.
#[derive(Deserialize, Serialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct StormSection {
    /// Broadcast floods admitted per second (0-1000000000; 0 admits none); unlimited when absent.
    #[serde(default)]
    pub broadcast_pps: Option<Spanned<u32>>,
    /// Multicast floods (link-local excluded) admitted per second; unlimited when absent.
    #[serde(default)]
    pub multicast_pps: Option<Spanned<u32>>,
    /// Floods of unicast to an unknown MAC admitted per second; unlimited when absent.
    #[serde(default)]
    pub unknown_unicast_pps: Option<Spanned<u32>>,
}

/// A port's `fdb:` settings.
#[derive(Deserialize, Serialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PortFdbSection {
    /// The most learned entries the port may have in the FDB (statics do not count); at the
    /// limit a new source is not learned (its frames are forwarded, frames to it flooded).
    /// 0 or absent: no limit. As the Linux bridge's `fdb_max_learned`.
    #[serde(default)]
    pub max_macs: Option<Spanned<u32>>,
}

impl PortFdbSection {
    /// The limit, 0 for none.
    pub fn max_macs(&self) -> u32 {
        self.max_macs.as_ref().map_or(0, |m| m.value)
    }

    pub(crate) fn check(
        &self,
        err: &impl Fn(Location, String) -> ConfigError,
        port: &str,
        capacity: usize,
    ) -> Result<(), ConfigError> {
        match &self.max_macs {
            Some(m) if m.value as usize > capacity => Err(err(
                m.referenced,
                format!(
                    "port `{port}`: fdb.max_macs {} is out of range: expected 0-{capacity} (0: no limit; at most fdb.capacity)",
                    m.value
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// `mirrors[].direction`: which of the sources' frames are copied.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// What the sources receive, as received (before VLAN filtering and plugins).
    Ingress,
    /// What the sources send, as it leaves (tags included).
    Egress,
    /// Both (the default).
    #[default]
    Both,
}

/// One `mirrors:` session: copies of what `sources` receive and/or send go to `destination`.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MirrorSection {
    /// The session's name, unique among `mirrors`.
    pub name: Spanned<String>,
    /// Ports whose frames are copied: at least one, none of them a session's destination.
    pub sources: Spanned<Vec<String>>,
    /// Which of the sources' frames are copied: `ingress`, `egress` or `both` (the default).
    #[serde(default)]
    pub direction: Direction,
    /// A port (the host port allowed) that takes no part in switching while it is one.
    pub destination: Spanned<String>,
}

/// One `fdb.static` entry.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct StaticEntry {
    /// The station's address (not a group address).
    pub mac: Spanned<Mac>,
    /// The VLAN it lives in: 1-4094, carried by `port` (default 1).
    #[serde(default = "default_vlan")]
    pub vlan: Spanned<u16>,
    /// The port frames to `mac` leave by (the host port allowed; not a mirror's destination).
    pub port: Spanned<String>,
}

fn default_vlan() -> Spanned<u16> {
    Spanned::new(Vid::DEFAULT.get(), Location::UNKNOWN, Location::UNKNOWN)
}

/// Storm limits are at most this (a 100 GbE port's line rate of 64-byte frames is 149 Mpps).
pub const STORM_PPS_MAX: u32 = 1_000_000_000;

/// A VLAN id key's value as a [`Vid`], or an error naming `key` and the range.
pub(crate) fn vid(
    err: &impl Fn(Location, String) -> ConfigError,
    key: &str,
    v: &Spanned<u16>,
) -> Result<Vid, ConfigError> {
    Vid::new(v.value).ok_or_else(|| {
        err(v.referenced, format!("{key} {} is out of range: expected {}-{}", v.value, Vid::MIN, Vid::MAX))
    })
}

impl VlanSection {
    /// The membership this section describes, or the first error in it.
    pub fn resolve(&self, err: &impl Fn(Location, String) -> ConfigError, port: &str) -> Result<PortVlan, ConfigError> {
        let at = self.mode.referenced;
        match self.mode.value {
            VlanMode::Access => {
                if self.allowed.is_some() || self.native.is_some() {
                    return Err(err(
                        at,
                        format!(
                            "port `{port}`: an access port has `vid:` only (`allowed:` and `native:` are for trunks)"
                        ),
                    ));
                }
                let v = self.vid.as_ref().ok_or_else(|| {
                    err(at, format!("port `{port}`: an access port needs `vid:` (1-4094), e.g. vlan: {{ mode: access, vid: 10 }}"))
                })?;
                Ok(PortVlan::access(vid(err, &format!("port `{port}`: vlan.vid"), v)?))
            }
            VlanMode::Trunk => {
                if self.vid.is_some() {
                    return Err(err(at, format!("port `{port}`: a trunk has `allowed:` and `native:`, not `vid:`")));
                }
                let allowed = self.allowed.as_ref().ok_or_else(|| {
                    err(at, format!("port `{port}`: a trunk needs `allowed:`, e.g. allowed: [10, \"20-29\"]"))
                })?;
                let vids = allowed
                    .value
                    .expand(&format!("port `{port}`: vlan.allowed"))
                    .map_err(|e| err(allowed.referenced, e))?;
                let native = match &self.native {
                    Some(n) => Some(vid(err, &format!("port `{port}`: vlan.native"), n)?),
                    None => None,
                };
                if vids.is_empty() && native.is_none() {
                    return Err(err(allowed.referenced, format!("port `{port}`: a trunk that carries no VLAN")));
                }
                Ok(PortVlan::trunk(vids, native))
            }
        }
    }
}

impl StormSection {
    pub(crate) fn limits(&self) -> StormLimits {
        let v = |x: &Option<Spanned<u32>>| x.as_ref().map(|s| s.value);
        StormLimits { pps: [v(&self.broadcast_pps), v(&self.multicast_pps), v(&self.unknown_unicast_pps)] }
    }

    pub(crate) fn check(&self, err: &impl Fn(Location, String) -> ConfigError, port: &str) -> Result<(), ConfigError> {
        for (key, v) in [
            ("broadcast_pps", &self.broadcast_pps),
            ("multicast_pps", &self.multicast_pps),
            ("unknown_unicast_pps", &self.unknown_unicast_pps),
        ] {
            if let Some(v) = v.as_ref().filter(|v| v.value > STORM_PPS_MAX) {
                return Err(err(
                    v.referenced,
                    format!("port `{port}`: storm.{key} {} is out of range: expected 0-{STORM_PPS_MAX}", v.value),
                ));
            }
        }
        Ok(())
    }
}
