//! `sampler`: copies one packet in N to the host (verdict `host-copy`: the packet is still
//! forwarded normally), e.g. for sFlow-style monitoring on the host's TAP port.
//!
//! Config: `every=N` (default 100). Sampling is deterministic per worker (every Nth packet that
//! worker sees), so with W workers the host receives about one in N overall. Works with
//! `header-bytes: 0` (it looks at nothing but the count).
//!
//! Counters: `sampler_copies`.

use wasmswitch_plugin_sdk::config;
use wasmswitch_plugin_sdk::{export_plugin, Batch, Counter, Plugin, Verdict, Verdicts};

pub struct Sampler {
    every: u64,
    /// Packets until the next sample (1 = the next packet).
    countdown: u64,
    copies: Option<Counter>,
}

impl Sampler {
    pub fn parse(cfg: &str) -> Result<Self, String> {
        let mut every = 100;
        for (n, line) in config::lines(cfg) {
            for w in line.split_whitespace() {
                match config::kv(w) {
                    Some(("every", v)) => {
                        every = v.parse().map_err(|_| format!("line {n}: every must be a number, not {v:?}"))?
                    }
                    _ => return Err(format!("line {n}: expected every=N, got {w:?}")),
                }
            }
        }
        if every == 0 {
            return Err("every must be at least 1".into());
        }
        Ok(Self { every, countdown: every, copies: None })
    }
}

impl Plugin for Sampler {
    fn init(cfg: &str) -> Result<Self, String> {
        let mut s = Self::parse(cfg)?;
        s.copies = Some(Counter::register("sampler_copies")?);
        Ok(s)
    }

    fn process(&mut self, batch: &Batch<'_>, verdicts: &mut Verdicts<'_>) {
        // Jump from sample to sample instead of testing every packet.
        let n = batch.len() as u64;
        let mut i = self.countdown - 1;
        let mut copies = 0;
        while i < n {
            verdicts.set(i as usize, Verdict::HostCopy);
            copies += 1;
            i += self.every;
        }
        self.countdown = i - n + 1;
        if let Some(c) = self.copies {
            c.add(copies);
        }
    }
}

export_plugin!(Sampler);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    #[test]
    fn one_in_n_across_batches() {
        let mut h = Harness::<Sampler>::init("every=3").unwrap();
        let f = harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let mut all = Vec::new();
        for size in [1, 2, 5, 64, 7] {
            all.extend(h.run_frames(0, &vec![f.clone(); size]));
        }
        for (i, v) in all.iter().enumerate() {
            let want = if i % 3 == 2 { Verdict::HostCopy } else { Verdict::Pass };
            assert_eq!(*v, want, "packet {i}");
        }
        assert_eq!(harness::counter("sampler_copies"), (all.len() / 3) as u64);
    }

    #[test]
    fn every_one_and_bad_config() {
        let mut h = Harness::<Sampler>::init("every=1").unwrap();
        let f = harness::udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        assert_eq!(h.run_frames(0, &[f.clone(), f]), vec![Verdict::HostCopy; 2]);
        assert!(Sampler::parse("every=0").is_err());
        assert!(Sampler::parse("often").err().unwrap().contains("every=N"));
    }
}
