//! The L2 keys: a port's `vlan:` and `storm:`, the `mirrors:` sessions and `fdb.static`, their
//! checks, and what they become in the datapath ([`PortL2`]).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::vlan::{PortL2, PortVlan, StormLimits, Vid};
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::PortId;

use super::{or_loc, Config, ConfigError, Mac};

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
    #[serde(default)]
    pub broadcast_pps: Option<Spanned<u32>>,
    #[serde(default)]
    pub multicast_pps: Option<Spanned<u32>>,
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

    fn check(
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

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
    #[default]
    Both,
}

/// One `mirrors:` session: copies of what `sources` receive and/or send go to `destination`.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MirrorSection {
    pub name: Spanned<String>,
    pub sources: Spanned<Vec<String>>,
    #[serde(default)]
    pub direction: Direction,
    /// A port (the host port allowed) that takes no part in switching while it is one.
    pub destination: Spanned<String>,
}

/// One `fdb.static` entry.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct StaticEntry {
    pub mac: Spanned<Mac>,
    #[serde(default = "default_vlan")]
    pub vlan: Spanned<u16>,
    pub port: Spanned<String>,
}

fn default_vlan() -> Spanned<u16> {
    Spanned::new(Vid::DEFAULT.get(), Location::UNKNOWN, Location::UNKNOWN)
}

/// Storm limits are at most this (a 100 GbE port's line rate of 64-byte frames is 149 Mpps).
pub const STORM_PPS_MAX: u32 = 1_000_000_000;

/// A VLAN id key's value as a [`Vid`], or an error naming `key` and the range.
fn vid(err: &impl Fn(Location, String) -> ConfigError, key: &str, v: &Spanned<u16>) -> Result<Vid, ConfigError> {
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
    fn limits(&self) -> StormLimits {
        let v = |x: &Option<Spanned<u32>>| x.as_ref().map(|s| s.value);
        StormLimits { pps: [v(&self.broadcast_pps), v(&self.multicast_pps), v(&self.unknown_unicast_pps)] }
    }

    fn check(&self, err: &impl Fn(Location, String) -> ConfigError, port: &str) -> Result<(), ConfigError> {
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

/// What [`check`] learned: each port's VLANs by name.
pub type Memberships = HashMap<String, PortVlan>;

/// Checks every L2 key of `cfg` (called by `Config::check`).
pub fn check(cfg: &Config, err: &impl Fn(Location, String) -> ConfigError) -> Result<(), ConfigError> {
    let mut vlans: Memberships = HashMap::new();
    for p in &cfg.ports {
        let name = &p.name.value;
        if let Some(s) = &p.storm {
            s.check(err, name)?;
        }
        if let Some(f) = &p.fdb {
            f.check(err, name, cfg.fdb.capacity.value)?;
        }
        let v = match &p.vlan {
            Some(v) => v.resolve(err, name)?,
            None => PortVlan::default(),
        };
        vlans.insert(name.clone(), v);
    }
    if let Some(h) = &cfg.host {
        let v = match &h.vlan {
            Some(v) => v.resolve(err, &h.name.value)?,
            None => PortVlan::default(),
        };
        vlans.insert(h.name.value.clone(), v);
    }
    let known = |n: &str| cfg.port_index(n).is_some();
    let mut names: HashMap<&str, Location> = HashMap::new();
    let mut sources: HashMap<&str, &str> = HashMap::new();
    let mut destinations: HashMap<&str, &str> = HashMap::new();
    for m in &cfg.mirrors {
        let name = m.name.value.as_str();
        if let Some(first) = names.insert(name, m.name.referenced) {
            return Err(err(
                m.name.referenced,
                format!("duplicate mirror name `{name}` (first defined at line {})", first.line()),
            ));
        }
        if m.sources.value.is_empty() {
            return Err(err(m.sources.referenced, format!("mirror `{name}`: `sources` is empty")));
        }
        let dest = m.destination.value.as_str();
        if !known(dest) {
            return Err(err(m.destination.referenced, format!("mirror `{name}`: destination `{dest}` is not a port")));
        }
        for s in &m.sources.value {
            if !known(s) {
                return Err(err(m.sources.referenced, format!("mirror `{name}`: source `{s}` is not a port")));
            }
            if s == dest {
                return Err(err(m.sources.referenced, format!("mirror `{name}`: port `{s}` cannot mirror to itself")));
            }
            sources.insert(s, name);
        }
        destinations.insert(dest, name);
    }
    for (dest, session) in &destinations {
        if let Some(other) = sources.get(dest) {
            return Err(err(
                cfg.mirrors.iter().find(|m| m.name.value == *session).map_or(Location::UNKNOWN, |m| m.destination.referenced),
                format!(
                    "mirror `{session}`: destination `{dest}` is a source of mirror `{other}`: a mirror's destination takes no part in switching, so it cannot be mirrored"
                ),
            ));
        }
    }
    // The entries go into a table of the configured capacity here, so that one beyond the
    // static budget (its bucket's or the table's) is refused by `check` rather than by `run`.
    let table = Fdb::new(cfg.fdb.capacity.value, 1);
    let mut seen: HashMap<(u16, u64), Location> = HashMap::new();
    for e in &cfg.fdb.statics {
        let v = vid(err, "fdb.static vlan", &e.vlan)?;
        let at = or_loc(e.mac.referenced, e.port.referenced);
        if !e.mac.value.0.is_station() {
            return Err(err(
                at,
                format!("fdb.static: {} is a group or all-zero address, not a station", e.mac.value.0),
            ));
        }
        let port = &e.port.value;
        let Some(members) = vlans.get(port) else {
            return Err(err(e.port.referenced, format!("fdb.static: `{port}` is not a port")));
        };
        if let Some(why) = cfg.host_address_elsewhere(e.mac.value.0, port) {
            return Err(err(at, format!("fdb.static: {why}")));
        }
        if destinations.contains_key(port.as_str()) {
            return Err(err(e.port.referenced, format!("fdb.static: `{port}` is a mirror's destination")));
        }
        if !members.members.contains(v.get()) {
            return Err(err(e.port.referenced, format!("fdb.static: port `{port}` does not carry VLAN {v}")));
        }
        if let Some(first) = seen.insert((v.get(), e.mac.value.0.to_u64()), at) {
            return Err(err(
                at,
                format!("fdb.static: {} in VLAN {v} is already defined at line {}", e.mac.value.0, first.line()),
            ));
        }
        if let Err(why) = table.add_static(v.get(), e.mac.value.0, 0) {
            return Err(err(at, format!("fdb.static: {} in VLAN {v}: {why}", e.mac.value.0)));
        }
    }
    Ok(())
}

impl Config {
    /// Port `name`'s limit on learned FDB entries (`ports[].fdb.max_macs`), 0 for none (the
    /// host port has none).
    pub fn max_macs(&self, name: &str) -> u32 {
        self.ports
            .iter()
            .find(|p| p.name.value == name)
            .and_then(|p| p.fdb.as_ref())
            .map_or(0, PortFdbSection::max_macs)
    }

    /// Why a static FDB entry for `mac` on `port` is refused because `mac` is `host.mac` and
    /// `port` not the host port (it would pull the host's traffic there, which the datapath's
    /// learning never lets a frame do); `None` for any other entry.
    pub fn host_address_elsewhere(&self, mac: MacAddr, port: &str) -> Option<String> {
        let host = self.host.as_ref().filter(|h| h.mac.value.0 == mac && h.name.value != port)?;
        Some(format!(
            "{mac} is the host port's own address (host.mac): it is on `{}`, and an entry on `{port}` would pull the host's traffic there",
            host.name.value
        ))
    }

    /// Ports whose generated traffic (`sim.traffic`) their own VLANs would drop whole, each
    /// said: `check` warns (a lab config may mean it; nothing would be forwarded). Call on a
    /// checked config.
    pub fn traffic_filtered_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.switch.mode != super::Mode::L2 {
            return out;
        }
        for p in &self.ports {
            let Some(t) = p.sim.as_ref().and_then(|s| s.value.traffic.as_ref()) else { continue };
            let name = &p.name.value;
            let vlan = self.port_l2(name, 1, &|_| None).vlan;
            let tags: Vec<Option<u16>> = match &t.vlan {
                Some(v) => v.value.expand("vlan").unwrap_or_default().iter().map(|v| Some(v.get())).collect(),
                None => vec![None],
            };
            let dropped: Vec<String> = tags
                .iter()
                .filter(|&&tag| vlan.classify(tag).is_none())
                .map(|tag| tag.map_or("untagged".to_string(), |v| format!("tagged {v}")))
                .collect();
            if !dropped.is_empty() {
                out.push(format!(
                    "port `{name}`: its generated frames {} would all be dropped as vlan_filtered: its VLANs do not admit them",
                    dropped.join(", ")
                ));
            }
        }
        out
    }

    /// The L2 settings of port `name` (a configured port or the host port) for a worker that
    /// polls `share` of the workers' share of its traffic: storm limits are divided among the
    /// workers that poll the port. Mirror ports are resolved with `id_of`. Call on a checked
    /// config.
    pub fn port_l2(&self, name: &str, share: u32, id_of: &dyn Fn(&str) -> Option<PortId>) -> PortL2 {
        let (vlan, storm) = match self.ports.iter().find(|p| p.name.value == name) {
            Some(p) => (p.vlan.as_ref(), p.storm.as_ref()),
            None => (self.host.as_ref().and_then(|h| h.vlan.as_ref()), None),
        };
        let never = |_: Location, m: String| ConfigError { file: self.file.clone(), line: 0, column: 0, message: m };
        let mut vlan = vlan.and_then(|v| v.resolve(&never, name).ok()).unwrap_or_default();
        let mut storm = storm.map(StormSection::limits).unwrap_or_default();
        for l in storm.pps.iter_mut().flatten() {
            *l = l.div_ceil(share.max(1));
        }
        let mut l2 = PortL2::default();
        for m in &self.mirrors {
            let Some(dest) = id_of(&m.destination.value) else { continue };
            if m.destination.value == name {
                l2.mirror_destination = true;
            }
            if m.sources.value.iter().any(|s| s == name) {
                if m.direction != Direction::Egress && !l2.mirror_ingress.contains(&dest) {
                    l2.mirror_ingress.push(dest);
                }
                if m.direction != Direction::Ingress && !l2.mirror_egress.contains(&dest) {
                    l2.mirror_egress.push(dest);
                }
            }
        }
        if l2.mirror_destination {
            vlan = PortVlan::none();
            storm = StormLimits::default();
        }
        PortL2 { vlan, storm, ..l2 }
    }
}
