//! The trait a plugin implements: what the switch calls, once to build it and once per batch.

use crate::abi::Verdict;
use crate::view::{Batch, Packet, Verdicts};

/// A packet policy. One value lives in each worker's instance of the plugin; the switch calls
/// `init` once and then `process` once per batch, never concurrently.
pub trait Plugin: Sized + 'static {
    /// Builds the plugin from the `config` string of its YAML entry (empty when absent).
    /// Return a message saying what is wrong to refuse the configuration; the switch reports
    /// it with the plugin's name and does not load the plugin.
    fn init(config: &str) -> Result<Self, String>;

    /// Classifies a whole batch. `verdicts` starts all [`Verdict::Pass`]. The default calls
    /// [`Plugin::verdict`] for each packet; override it for per-batch work (for example one
    /// clock read per batch).
    #[inline]
    fn process(&mut self, batch: &Batch<'_>, verdicts: &mut Verdicts<'_>) {
        for (i, p) in batch.packets().enumerate() {
            let v = self.verdict(&p);
            if v != Verdict::Pass {
                verdicts.set(i, v);
            }
        }
    }

    /// Classifies one packet (used by the default [`Plugin::process`]).
    #[inline]
    fn verdict(&mut self, _packet: &Packet<'_>) -> Verdict {
        Verdict::Pass
    }
}
