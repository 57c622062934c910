//! `port-security`: a source-MAC allowlist per ingress port.
//!
//! Config, one line per restricted port, plus an optional `violation` line:
//!
//! ```text
//! port=1 02:00:00:00:00:01 02:00:00:00:00:02
//! port=2 02:00:00:00:00:10
//! violation drop                 # drop (default) or host (hand to the host for inspection)
//! ```
//!
//! A frame arriving on a listed port whose source MAC is not in that port's list gets the
//! violation verdict; ports without a line are not restricted. Needs `header-bytes` >= 12.
//!
//! Counters: `port_security_violations`.

use wasmswitch_plugin_sdk::config;
use wasmswitch_plugin_sdk::{export_plugin, Batch, Counter, Plugin, Verdict, Verdicts};

pub struct PortSecurity {
    /// Allowed MACs by port index (`None`: unrestricted). Sorted for binary search.
    allow: Vec<Option<Vec<[u8; 6]>>>,
    violation: Verdict,
    violations: Option<Counter>,
}

impl PortSecurity {
    pub fn parse(cfg: &str) -> Result<Self, String> {
        let mut s = PortSecurity { allow: Vec::new(), violation: Verdict::Drop, violations: None };
        for (n, line) in config::lines(cfg) {
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or("");
            if first == "violation" || first == "violation:" {
                s.violation = match words.next() {
                    Some("drop") => Verdict::Drop,
                    Some("host") => Verdict::Host,
                    Some(other) => return Err(format!("line {n}: violation must be drop or host, not {other:?}")),
                    None => return Err(format!("line {n}: violation needs drop or host after it")),
                };
                continue;
            }
            let port = match config::kv(first) {
                Some(("port", v)) => {
                    v.parse::<u16>().map_err(|_| format!("line {n}: bad port {v:?}: expected a port index 0-65535"))?
                }
                _ => return Err(format!("line {n}: expected `port=N MAC...` or `violation drop|host`, got {first:?}")),
            };
            let mut macs = words
                .map(|w| config::parse_mac(w).map_err(|e| format!("line {n}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            macs.sort_unstable();
            if s.allow.len() <= port as usize {
                s.allow.resize(port as usize + 1, None);
            }
            s.allow[port as usize].get_or_insert_with(Vec::new).extend(macs);
            if let Some(l) = s.allow[port as usize].as_mut() {
                l.sort_unstable();
            }
        }
        Ok(s)
    }
}

impl Plugin for PortSecurity {
    fn init(cfg: &str) -> Result<Self, String> {
        let mut s = Self::parse(cfg)?;
        s.violations = Some(Counter::register("port_security_violations")?);
        Ok(s)
    }

    fn process(&mut self, batch: &Batch<'_>, verdicts: &mut Verdicts<'_>) {
        // Every packet of a batch arrived on the same port: one lookup per batch.
        let Some(Some(allowed)) = self.allow.get(batch.in_port() as usize) else { return };
        let mut bad = 0;
        for (i, p) in batch.packets().enumerate() {
            let ok = p
                .headers()
                .get(6..12)
                .is_some_and(|m| allowed.binary_search(&[m[0], m[1], m[2], m[3], m[4], m[5]]).is_ok());
            if !ok {
                verdicts.set(i, self.violation);
                bad += 1;
            }
        }
        if let Some(c) = self.violations {
            c.add(bad);
        }
    }
}

export_plugin!(PortSecurity);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    #[test]
    fn allowlist_per_port() {
        let mut h =
            Harness::<PortSecurity>::init("port=1 02:00:00:00:00:01\nport=2 02:00:00:00:00:10 02:00:00:00:00:11")
                .unwrap();
        let good = harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2); // SRC_MAC = 02:..:01
        let other = harness::with_src_mac(good.clone(), [2, 0, 0, 0, 0, 0x11]);
        assert_eq!(h.run_frames(1, &[good.clone(), other.clone()]), vec![Verdict::Pass, Verdict::Drop]);
        assert_eq!(h.run_frames(2, &[good.clone(), other.clone()]), vec![Verdict::Drop, Verdict::Pass]);
        assert_eq!(h.run_frames(3, &[good, other]), vec![Verdict::Pass, Verdict::Pass], "port 3 is unrestricted");
        assert_eq!(harness::counter("port_security_violations"), 2);
    }

    #[test]
    fn violation_to_host_and_bad_config() {
        let mut h = Harness::<PortSecurity>::init("violation host\nport=0 02:00:00:00:00:99").unwrap();
        assert_eq!(h.run_one(&harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)), Verdict::Host);
        for (cfg, want) in [
            ("port=x 02:00:00:00:00:01", "line 1: bad port \"x\": expected a port index 0-65535"),
            ("port=70000 02:00:00:00:00:01", "bad port \"70000\": expected a port index 0-65535"),
            ("port=1 02:00:00:00:01", "line 1: bad MAC address \"02:00:00:00:01\": expected six hex octets"),
            ("port=1 02:00:00:00:00:01:03", "bad MAC address \"02:00:00:00:00:01:03\": expected six hex octets"),
        ] {
            let got = PortSecurity::parse(cfg).err().unwrap();
            assert!(got.contains(want), "{cfg}: {got}");
        }
        assert_eq!(
            PortSecurity::parse("violation maybe").err().unwrap(),
            "line 1: violation must be drop or host, not \"maybe\""
        );
        assert_eq!(PortSecurity::parse("violation").err().unwrap(), "line 1: violation needs drop or host after it");
    }
}
