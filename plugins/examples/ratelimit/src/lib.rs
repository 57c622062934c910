//! `ratelimit`: a token bucket per source IP address.
//!
//! Config: `rate=<packets per second> burst=<packets> [action=drop|host] [slots=<power of two>]`
//! on one line, e.g. `rate=1000 burst=50`. Each source address (IPv4 or IPv6) gets a bucket
//! of `burst` tokens (1..=16777216; default `rate`, as far as that goes) refilled at `rate`
//! (1..=1e9) per second; a packet takes one token, and a packet that finds its bucket empty
//! gets `action` (default drop). Buckets live in a fixed table of
//! `slots` entries (default 4096), direct-mapped by a hash of the address: a new source
//! evicts the one in its slot (starting with a full bucket), so memory is bounded whatever
//! the traffic. Non-IP frames pass. The clock is read once per batch.
//!
//! Counters: `ratelimit_limited`.

use wasmswitch_plugin_sdk::config;
use wasmswitch_plugin_sdk::{export_plugin, now_ns, Batch, Counter, Plugin, Verdict, Verdicts};

const NANO: u64 = 1_000_000_000;
/// The largest bucket: `burst * NANO` tokens, plus a refill, stay far inside a `u64`.
const MAX_BURST: u64 = 1 << 24;

#[derive(Clone, Copy, Default)]
struct Bucket {
    addr: u128,
    /// Tokens in units of 1e-9 packet.
    tokens: u64,
    last_ns: u64,
    used: bool,
}

pub struct RateLimit {
    rate: u64,
    burst: u64,
    action: Verdict,
    table: Vec<Bucket>,
    limited: Option<Counter>,
}

impl RateLimit {
    pub fn parse(cfg: &str) -> Result<Self, String> {
        let (mut rate, mut burst, mut action, mut slots) = (None, None, Verdict::Drop, 4096usize);
        for (n, line) in config::lines(cfg) {
            for w in line.split_whitespace() {
                let (k, v) = config::kv(w).ok_or_else(|| format!("line {n}: expected key=value, got {w:?}"))?;
                let num = || v.parse::<u64>().map_err(|_| format!("line {n}: {k} must be a number, not {v:?}"));
                match k {
                    "rate" => rate = Some(num()?),
                    "burst" => burst = Some(num()?),
                    "slots" => slots = num()? as usize,
                    "action" => {
                        action = match v {
                            "drop" => Verdict::Drop,
                            "host" => Verdict::Host,
                            _ => return Err(format!("line {n}: action must be drop or host, not {v:?}")),
                        }
                    }
                    _ => return Err(format!("line {n}: unknown key {k:?} (expected rate, burst, action, slots)")),
                }
            }
        }
        let rate = rate.ok_or("rate=<packets per second> is required")?;
        if rate == 0 || rate > NANO {
            return Err(format!("rate must be 1..={NANO} packets per second, not {rate}"));
        }
        // By default a second's worth of packets, as much of it as a bucket holds.
        let burst = burst.unwrap_or(rate.min(MAX_BURST));
        if burst == 0 || burst > MAX_BURST {
            return Err(format!("burst must be 1..={MAX_BURST} packets, not {burst}"));
        }
        if !slots.is_power_of_two() || slots > 1 << 20 {
            return Err(format!("slots must be a power of two up to {}, not {slots}", 1 << 20));
        }
        Ok(Self { rate, burst, action, table: vec![Bucket::default(); slots], limited: None })
    }

    #[inline]
    fn slot(&self, addr: u128) -> usize {
        let h = (addr as u64 ^ (addr >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize & (self.table.len() - 1)
    }

    /// Takes a token for `addr` at time `now`; false when the bucket is empty.
    #[inline]
    pub fn take(&mut self, addr: u128, now: u64) -> bool {
        let (rate, cap) = (self.rate, self.burst * NANO);
        let i = self.slot(addr);
        let b = &mut self.table[i];
        if !b.used || b.addr != addr {
            *b = Bucket { addr, tokens: cap, last_ns: now, used: true };
        } else {
            // Cap the elapsed time so elapsed * rate cannot overflow.
            let elapsed = now.saturating_sub(b.last_ns).min(cap / rate + 1);
            b.tokens = (b.tokens + elapsed * rate).min(cap);
            b.last_ns = now;
        }
        if b.tokens >= NANO {
            b.tokens -= NANO;
            true
        } else {
            false
        }
    }
}

impl Plugin for RateLimit {
    fn init(cfg: &str) -> Result<Self, String> {
        let mut r = Self::parse(cfg)?;
        r.limited = Some(Counter::register("ratelimit_limited")?);
        Ok(r)
    }

    fn process(&mut self, batch: &Batch<'_>, verdicts: &mut Verdicts<'_>) {
        let now = now_ns();
        let mut limited = 0;
        for (i, p) in batch.packets().enumerate() {
            if let Some((src, _)) = p.ip_addrs() {
                if !self.take(u128::from_be_bytes(src), now) {
                    verdicts.set(i, self.action);
                    limited += 1;
                }
            }
        }
        if let Some(c) = self.limited {
            c.add(limited);
        }
    }
}

export_plugin!(RateLimit);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    #[test]
    fn burst_then_rate() {
        let mut h = Harness::<RateLimit>::init("rate=10 burst=3").unwrap();
        harness::set_clock_ns(1_000);
        let a = harness::udp4([10, 0, 0, 1], [10, 0, 0, 9], 1, 2);
        let b = harness::udp4([10, 0, 0, 2], [10, 0, 0, 9], 1, 2);
        let v = h.run_frames(0, &vec![a.clone(); 5]);
        assert_eq!(v, vec![Verdict::Pass, Verdict::Pass, Verdict::Pass, Verdict::Drop, Verdict::Drop]);
        assert_eq!(h.run_one(&b), Verdict::Pass, "another source has its own bucket");
        // 100 ms later one token (10/s) is back.
        harness::set_clock_ns(1_000 + 100_000_000);
        assert_eq!(h.run_frames(0, &[a.clone(), a.clone()]), vec![Verdict::Pass, Verdict::Drop]);
        assert_eq!(harness::counter("ratelimit_limited"), 3);
        // Long idle: the bucket refills to the burst, not beyond.
        harness::set_clock_ns(1_000 + 100 * NANO);
        assert_eq!(h.run_frames(0, &vec![a; 4]).iter().filter(|v| **v == Verdict::Pass).count(), 3);
    }

    #[test]
    fn ipv6_sources_and_non_ip() {
        let mut h = Harness::<RateLimit>::init("rate=1 burst=1 action=host").unwrap();
        harness::set_clock_ns(5);
        let f = harness::ip6(17, [0x20; 16], [0x30; 16], 1, 2);
        assert_eq!(h.run_frames(0, &[f.clone(), f]), vec![Verdict::Pass, Verdict::Host]);
        let arp = harness::ethernet([0xff; 6], harness::SRC_MAC, 0x0806, &[0u8; 28]);
        assert_eq!(h.run_frames(0, &[arp.clone(), arp]), vec![Verdict::Pass, Verdict::Pass]);
    }

    #[test]
    fn bad_configs() {
        assert!(RateLimit::parse("burst=3").err().unwrap().contains("rate"));
        assert!(RateLimit::parse("rate=x").err().unwrap().contains("number"));
        assert!(RateLimit::parse("rate=1 slots=1000").err().unwrap().contains("power of two"));
        assert!(RateLimit::parse("rate=1 colour=red").err().unwrap().contains("unknown key"));
        // Each bound is named with the value that broke it, at both edges.
        assert_eq!(RateLimit::parse("rate=0").err().unwrap(), "rate must be 1..=1000000000 packets per second, not 0");
        assert!(RateLimit::parse("rate=1000000001").err().unwrap().contains("not 1000000001"));
        assert_eq!(RateLimit::parse("rate=1 burst=0").err().unwrap(), "burst must be 1..=16777216 packets, not 0");
        assert!(RateLimit::parse("rate=1 burst=16777217").err().unwrap().contains("not 16777217"));
    }

    #[test]
    fn the_burst_defaults_to_the_rate_as_far_as_a_bucket_holds() {
        assert_eq!(RateLimit::parse("rate=1000").unwrap().burst, 1000);
        // A rate past the largest burst is allowed: the default burst stops at the largest.
        let r = RateLimit::parse("rate=1000000000").unwrap();
        assert_eq!((r.rate, r.burst), (NANO, MAX_BURST));
        assert_eq!(RateLimit::parse("rate=1 burst=16777216").unwrap().burst, MAX_BURST);
    }
}
