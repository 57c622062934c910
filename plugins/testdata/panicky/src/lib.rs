//! `panicky`, a test plugin (built by `plugins/build.sh panicky`, not among the examples):
//! passes everything but ARP, on which it panics. The plugin host's tests use it to see what a
//! Rust plugin's panic looks like end to end (the SDK's panic hook, the trap, the fault) and
//! that `wasmswitch check`'s smoke run names the frame kind a plugin fails on.

use wasmswitch_plugin_sdk::{export_plugin, Packet, Plugin, Verdict};

pub struct Panicky;

/// The ethertype it panics on.
pub const ARP: u16 = 0x0806;

impl Plugin for Panicky {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(Panicky)
    }

    fn verdict(&mut self, p: &Packet<'_>) -> Verdict {
        if p.ethertype() == ARP {
            panic!("panicky: ARP is not handled (a {}-byte frame)", p.len());
        }
        Verdict::Pass
    }
}

export_plugin!(Panicky);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    #[test]
    fn passes_ip_and_panics_on_arp() {
        let mut h = Harness::<Panicky>::init("").unwrap();
        assert_eq!(h.run_one(&harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2)), Verdict::Pass);
        let arp = harness::ethernet([0xff; 6], harness::SRC_MAC, ARP, &[0; 46]);
        let r = std::panic::catch_unwind(move || h.run_one(&arp));
        assert!(r.is_err());
    }
}
