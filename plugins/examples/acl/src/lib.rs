//! `acl`: ordered allow/deny rules on the 5-tuple, first match wins.
//!
//! Config (one rule per line; see `wasmswitch_plugin_sdk::config` for the line format):
//!
//! ```text
//! default allow                      # action when no rule matches (default: allow)
//! deny proto=tcp dst=10.0.0.0/8 dport=22
//! allow proto=udp src=192.168.0.0/16 sport=1024-65535 dport=53
//! deny src=2001:db8::/32
//! ```
//!
//! Keys (all optional, default `any`): `proto` (`tcp`, `udp`, `icmp`, `icmpv6` or a number),
//! `src`, `dst` (IPv4 or IPv6 CIDR), `sport`, `dport` (`N` or `N-M`). A rule with a port key
//! only matches packets whose ports were parsed (TCP/UDP, first fragment). Non-IP frames (ARP,
//! LLDP) are not subject to the rules and pass. Needs `header-bytes` to cover the IP and L4
//! headers: 64 is enough for IPv4 and for IPv6 without extension headers (14 + 4 + 40 + 4 = 62 with one VLAN tag).
//!
//! Counters: `acl_allowed`, `acl_denied`.

use wasmswitch_plugin_sdk::config::{self, Cidr, PortRange};
use wasmswitch_plugin_sdk::{export_plugin, Batch, Counter, Packet, Plugin, Verdict, Verdicts};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub action: Action,
    pub proto: Option<u8>,
    pub src: Cidr,
    pub dst: Cidr,
    pub sport: PortRange,
    pub dport: PortRange,
    /// True when the rule names a port, so it needs parsed L4 ports.
    pub needs_ports: bool,
}

/// The fields a rule looks at, extracted once per packet.
#[derive(Clone, Copy, Debug)]
pub struct Tuple {
    pub proto: u8,
    pub src: u128,
    pub dst: u128,
    pub ports: Option<(u16, u16)>,
}

impl Rule {
    #[inline]
    pub fn matches(&self, t: &Tuple) -> bool {
        if let Some(p) = self.proto {
            if p != t.proto {
                return false;
            }
        }
        if !self.src.contains(t.src) || !self.dst.contains(t.dst) {
            return false;
        }
        match t.ports {
            Some((s, d)) => self.sport.contains(s) && self.dport.contains(d),
            None => !self.needs_ports,
        }
    }
}

pub struct Acl {
    pub rules: Vec<Rule>,
    pub default: Action,
    allowed: Option<Counter>,
    denied: Option<Counter>,
}

fn parse_action(s: &str) -> Option<Action> {
    match s {
        "allow" | "permit" | "pass" => Some(Action::Allow),
        "deny" | "drop" => Some(Action::Deny),
        _ => None,
    }
}

impl Acl {
    /// Parses the config (no host calls: usable anywhere).
    pub fn parse(cfg: &str) -> Result<Acl, String> {
        let mut acl = Acl { rules: Vec::new(), default: Action::Allow, allowed: None, denied: None };
        for (n, line) in config::lines(cfg) {
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or("");
            if first == "default" || first == "default:" {
                let a = words.next().unwrap_or("");
                acl.default = parse_action(a).ok_or_else(|| format!("line {n}: default must be allow or deny, not {a:?}"))?;
                continue;
            }
            let action = parse_action(first).ok_or_else(|| format!("line {n}: a rule starts with allow or deny, not {first:?}"))?;
            let mut r = Rule { action, proto: None, src: Cidr::ANY, dst: Cidr::ANY, sport: PortRange::ANY, dport: PortRange::ANY, needs_ports: false };
            for w in words {
                let (k, v) = config::kv(w).ok_or_else(|| format!("line {n}: expected key=value, got {w:?}"))?;
                let e = |m: String| format!("line {n}: {m}");
                match k {
                    "proto" => {
                        r.proto = match v {
                            "any" => None,
                            "tcp" => Some(6),
                            "udp" => Some(17),
                            "icmp" => Some(1),
                            "icmpv6" => Some(58),
                            _ => Some(v.parse().map_err(|_| e(format!("bad proto {v:?}")))?),
                        }
                    }
                    "src" => r.src = Cidr::parse(v).map_err(e)?,
                    "dst" => r.dst = Cidr::parse(v).map_err(e)?,
                    "sport" => r.sport = PortRange::parse(v).map_err(e)?,
                    "dport" => r.dport = PortRange::parse(v).map_err(e)?,
                    _ => return Err(e(format!("unknown key {k:?} (expected proto, src, dst, sport, dport)"))),
                }
            }
            r.needs_ports = r.sport != PortRange::ANY || r.dport != PortRange::ANY;
            acl.rules.push(r);
        }
        Ok(acl)
    }

    /// The action for one packet (`None` for non-IP: not subject to the ACL).
    #[inline]
    pub fn classify(&self, p: &Packet<'_>) -> Option<Action> {
        let (src, dst) = p.ip_addrs()?;
        let t = Tuple { proto: p.ip_proto().unwrap_or(0), src: u128::from_be_bytes(src), dst: u128::from_be_bytes(dst), ports: p.ports() };
        Some(self.rules.iter().find(|r| r.matches(&t)).map_or(self.default, |r| r.action))
    }
}

impl Plugin for Acl {
    fn init(cfg: &str) -> Result<Self, String> {
        let mut acl = Acl::parse(cfg)?;
        acl.allowed = Some(Counter::register("acl_allowed")?);
        acl.denied = Some(Counter::register("acl_denied")?);
        Ok(acl)
    }

    fn process(&mut self, batch: &Batch<'_>, verdicts: &mut Verdicts<'_>) {
        let mut denied = 0;
        for (i, p) in batch.packets().enumerate() {
            if self.classify(&p) == Some(Action::Deny) {
                verdicts.set(i, Verdict::Drop);
                denied += 1;
            }
        }
        if let (Some(a), Some(d)) = (self.allowed, self.denied) {
            a.add(batch.len() as u64 - denied);
            d.add(denied);
        }
    }
}

export_plugin!(Acl);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    const CFG: &str = "
        default allow
        deny proto=tcp dst=10.0.0.0/8 dport=22
        allow proto=udp src=192.168.0.0/16 sport=1024-65535 dport=53
        deny proto=udp dport=53
        deny src=2001:db8::/32
    ";

    #[test]
    fn first_match_wins() {
        let mut h = Harness::<Acl>::init(CFG).unwrap();
        assert_eq!(h.run_one(&harness::tcp4([1, 2, 3, 4], [10, 1, 1, 1], 5555, 22)), Verdict::Drop);
        assert_eq!(h.run_one(&harness::tcp4([1, 2, 3, 4], [10, 1, 1, 1], 5555, 23)), Verdict::Pass);
        assert_eq!(h.run_one(&harness::tcp4([1, 2, 3, 4], [11, 1, 1, 1], 5555, 22)), Verdict::Pass);
        // allowed by rule 2 before rule 3 denies the rest of DNS
        assert_eq!(h.run_one(&harness::udp4([192, 168, 1, 1], [8, 8, 8, 8], 40000, 53)), Verdict::Pass);
        assert_eq!(h.run_one(&harness::udp4([192, 168, 1, 1], [8, 8, 8, 8], 53, 53)), Verdict::Drop, "sport outside range");
        assert_eq!(h.run_one(&harness::udp4([172, 16, 0, 1], [8, 8, 8, 8], 40000, 53)), Verdict::Drop);
    }

    #[test]
    fn ipv6_and_non_ip() {
        let mut h = Harness::<Acl>::init(CFG).unwrap();
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(h.run_one(&harness::ip6(6, src, [0x30; 16], 1, 2)), Verdict::Drop);
        assert_eq!(h.run_one(&harness::ip6(6, [0x30; 16], src, 1, 2)), Verdict::Pass);
        let arp = harness::ethernet([0xff; 6], harness::SRC_MAC, 0x0806, &[0u8; 28]);
        assert_eq!(h.run_one(&arp), Verdict::Pass);
    }

    #[test]
    fn default_deny_and_vlan() {
        let mut h = Harness::<Acl>::init("default deny\nallow proto=udp dport=53").unwrap();
        let f = harness::with_vlan(harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 9, 53), 7);
        let g = harness::with_vlan(harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 9, 54), 7);
        assert_eq!(h.run_frames(0, &[f, g]), vec![Verdict::Pass, Verdict::Drop]);
        assert_eq!(harness::counter("acl_allowed"), 1);
        assert_eq!(harness::counter("acl_denied"), 1);
    }

    #[test]
    fn port_rules_need_ports_in_the_snapshot() {
        let mut h = Harness::<Acl>::init("deny dport=22").unwrap();
        h.header_bytes = 30; // IP header cut short: no addresses, no ports
        assert_eq!(h.run_one(&harness::tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 22)), Verdict::Pass);
        h.header_bytes = 64;
        assert_eq!(h.run_one(&harness::tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 22)), Verdict::Drop);
    }

    #[test]
    fn bad_configs_say_where() {
        for (cfg, needle) in [
            ("alow src=1.2.3.4", "line 1"),
            ("deny src=1.2.3.4/40", "prefix length"),
            ("deny\ndeny colour=red", "line 2: unknown key"),
            ("deny dport=9-1", "empty port range"),
            ("default maybe", "default must be"),
        ] {
            let e = Acl::parse(cfg).err().unwrap_or_default();
            assert!(e.contains(needle), "{cfg:?} gave {e:?}");
        }
    }
}
