//! The L2 keys across the file: each port's VLANs against the mirrors and static entries that
//! name them, and what they become in the datapath ([`PortL2`]). The sections themselves are
//! `schema::l2`'s.

use std::collections::HashMap;

use serde_saphyr::Location;
use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::vlan::{PortL2, PortVlan, StormLimits};
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::PortId;

use super::{Config, ConfigError};
use crate::schema::l2::vid;
pub use crate::schema::l2::{
    Direction, MirrorSection, PortFdbSection, StaticEntry, StormSection, VidList, VlanMode, VlanSection, STORM_PPS_MAX,
};
use crate::schema::or_loc;

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
        if let Err(why) = table.add_static(v, e.mac.value.0, PortId(0)) {
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
