//! Per-packet verdicts, and the stage that produces them.

use crate::batch::Desc;
use crate::port::PortId;
use crate::umem::Umem;
use crate::wire::PacketMeta;

/// What happens to one packet after the verdict stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Verdict {
    /// Continue to L2 forwarding.
    #[default]
    Pass,
    /// Drop (counted as a policy drop).
    Drop,
    /// Send out of this port only, skipping the FDB.
    Redirect(PortId),
    /// Deliver to the host (the switch's TAP port).
    Host,
    /// Forward as `Pass` and also send a copy to the host (sampling, monitoring).
    HostCopy,
}

/// A view of one ingress batch handed to the verdict stage.
pub struct BatchView<'a> {
    pub in_port: PortId,
    pub queue: u16,
    pub umem: &'a Umem,
    pub descs: &'a [Desc],
    pub meta: &'a [PacketMeta],
}

/// Produces verdicts for a whole batch in one call (one virtual call per batch, never per
/// packet). Plugins implement this; so do test stages.
pub trait VerdictStage: Send {
    /// Fills `verdicts[i]` for each packet `i` of `batch`. Entries arrive pre-set to `Pass`;
    /// packets already dropped by the parser are not in the batch.
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]);
}
