//! Per-packet verdicts, and the stage that produces them.

use crate::types::{Desc, PortId};
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

impl Verdict {
    /// The kinds of verdict, as metrics and the API name them, in [`Verdict::kind`] order.
    pub const KINDS: [&'static str; 5] = ["pass", "drop", "redirect", "host", "host_copy"];

    /// This verdict's index in [`Verdict::KINDS`] (a redirect's target aside).
    #[inline]
    pub fn kind(self) -> usize {
        match self {
            Verdict::Pass => 0,
            Verdict::Drop => 1,
            Verdict::Redirect(_) => 2,
            Verdict::Host => 3,
            Verdict::HostCopy => 4,
        }
    }
}

/// A view of one ingress batch handed to the verdict stage.
pub struct BatchView<'a> {
    /// The port the batch arrived on.
    pub in_port: PortId,
    /// That port's queue index, as metrics report it.
    pub queue: u16,
    /// The memory the descriptors point into.
    pub umem: &'a Umem,
    /// The batch's packets.
    pub descs: &'a [Desc],
    /// Each packet's parsed headers, at the same index as its descriptor.
    pub meta: &'a [PacketMeta],
}

/// Produces verdicts for a whole batch in one call (one virtual call per batch, never per
/// packet). Plugins implement this; so do test stages.
pub trait VerdictStage: Send {
    /// Fills `verdicts[i]` for each packet `i` of `batch`. Entries arrive pre-set to `Pass`;
    /// packets already dropped by the parser are not in the batch.
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]);

    /// Called on the worker when this stage replaces `old` on the same port (a reload), before
    /// its first batch: it may take over parts of `old` (plugin instances whose component and
    /// config did not change keep their state). Once per reload, never on the data path.
    fn take_over(&mut self, _old: &mut dyn VerdictStage) {}

    /// The concrete stage, for [`VerdictStage::take_over`] and control commands (a downcast per
    /// command, never per batch). `None` when the stage has nothing to offer.
    fn as_any_mut(&mut self) -> Option<&mut dyn core::any::Any> {
        None
    }

    /// Packet `packet` of the last batch got `Redirect(to)` and `to` is not a port that is up,
    /// so the frame was dropped (`bad_redirect`): lets the stage say which of its plugins did
    /// it. Called only on that error path.
    fn bad_redirect(&mut self, _packet: usize, _to: PortId) {}
}
