//! Per-worker statistics. Every counter has exactly one writer (its worker); the metrics
//! endpoint sums them across workers at scrape time.

use std::sync::Arc;

use crate::counter::{Counter, Gauge};
use crate::pool::PoolStats;
use crate::wire::ParseError;

/// Why a packet was dropped. Each reason is its own counter (`reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum DropReason {
    /// Shorter than an Ethernet header ([`ParseError::Runt`]).
    Runt,
    /// A VLAN tag cut short ([`ParseError::TruncatedVlan`]).
    TruncatedVlan,
    /// A bad or cut IPv4/IPv6 header ([`ParseError::BadL3`]).
    BadL3,
    /// A TCP/UDP header cut short ([`ParseError::TruncatedL4`]).
    TruncatedL4,
    /// Longer than the ingress port's maximum frame ([`ParseError::Oversize`]).
    Oversize,
    /// A plugin said `drop` (or its error policy did).
    Policy,
    /// Destination learned on the ingress port: filtered, never sent back out.
    Hairpin,
    /// Redirect to a port that does not exist or is down.
    BadRedirect,
    /// Nowhere to go: verdict `host` without a host port, or a flood with no other port up.
    NoEgress,
    /// The egress TX ring had no room.
    TxFull,
    /// A flood or mirror copy found no free frame.
    PoolEmpty,
    /// The port does not carry the frame's VLAN (ingress), or a learned or static entry sends
    /// it to a port outside the VLAN.
    VlanFiltered,
    /// Storm control: the port's limit for this flood class was used up for this second.
    Storm,
    /// A link-local frame (01:80:C2:00:00:0X) with no host port to take it.
    LinkLocal,
    /// Received on a mirror's destination port, which takes no part in switching.
    MirrorDestination,
    /// A tag had to be pushed and the frame had no headroom (a driver without headroom).
    NoHeadroom,
    /// A group (multicast, broadcast) or all-zero source address: no station sends from one
    /// (the Linux bridge drops these too).
    BadSource,
    /// Longer than the egress port sends (its MTU plus the headers its device admits), as the
    /// Linux bridge drops a frame over its egress port's MTU; counted on the egress port.
    EgressMtuExceeded,
}

impl DropReason {
    /// Every reason, in declaration order: `ALL[r as usize] == r`.
    pub const ALL: [DropReason; 18] = [
        DropReason::Runt,
        DropReason::TruncatedVlan,
        DropReason::BadL3,
        DropReason::TruncatedL4,
        DropReason::Oversize,
        DropReason::Policy,
        DropReason::Hairpin,
        DropReason::BadRedirect,
        DropReason::NoEgress,
        DropReason::TxFull,
        DropReason::PoolEmpty,
        DropReason::VlanFiltered,
        DropReason::Storm,
        DropReason::LinkLocal,
        DropReason::MirrorDestination,
        DropReason::NoHeadroom,
        DropReason::BadSource,
        DropReason::EgressMtuExceeded,
    ];
    /// How many reasons there are (the length of [`PortStats::drops`]).
    pub const COUNT: usize = Self::ALL.len();

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::Runt => "runt",
            DropReason::TruncatedVlan => "truncated_vlan",
            DropReason::BadL3 => "bad_l3_header",
            DropReason::TruncatedL4 => "truncated_l4",
            DropReason::Oversize => "oversize",
            DropReason::Policy => "policy",
            DropReason::Hairpin => "hairpin",
            DropReason::BadRedirect => "bad_redirect",
            DropReason::NoEgress => "no_egress",
            DropReason::TxFull => "tx_ring_full",
            DropReason::PoolEmpty => "pool_empty",
            DropReason::VlanFiltered => "vlan_filtered",
            DropReason::Storm => "storm",
            DropReason::LinkLocal => "link_local",
            DropReason::MirrorDestination => "mirror_destination",
            DropReason::NoHeadroom => "no_headroom",
            DropReason::BadSource => "bad_source_mac",
            DropReason::EgressMtuExceeded => "egress_mtu_exceeded",
        }
    }
}

impl From<ParseError> for DropReason {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::Runt => DropReason::Runt,
            ParseError::TruncatedVlan => DropReason::TruncatedVlan,
            ParseError::BadL3 => DropReason::BadL3,
            ParseError::TruncatedL4 => DropReason::TruncatedL4,
            ParseError::Oversize => DropReason::Oversize,
        }
    }
}

/// One worker's counters for one port (its queue on that port).
#[derive(Debug, Default)]
pub struct PortStats {
    /// Frames received (before any drop).
    pub rx_packets: Counter,
    /// Bytes of those frames (Ethernet header included, no FCS).
    pub rx_bytes: Counter,
    /// Frames the port's TX queue accepted.
    pub tx_packets: Counter,
    /// Bytes of those frames.
    pub tx_bytes: Counter,
    /// Drops of packets that entered on this port, by reason.
    pub drops: [Counter; DropReason::COUNT],
    /// TCP/UDP checksums completed on ingress (the sender had left them to offload).
    pub checksums_completed: Counter,
    /// Link-local frames (01:80:C2:00:00:0X) received: never forwarded, given to the host port.
    pub link_local: Counter,
    /// Frames received with the host port's own MAC as source (not on the host port): forwarded,
    /// never learned.
    pub own_address: Counter,
    /// Frames whose source was not learned because the port had as many learned entries as
    /// its limit (`fdb.max_macs`) allows: forwarded all the same. Once per run of one source.
    pub learn_refused: Counter,
}

impl PortStats {
    /// Counts one drop for `reason`.
    #[inline]
    pub fn drop(&self, reason: DropReason) {
        self.drops[reason as usize].inc();
    }

    /// Drops of every reason together.
    pub fn drops_total(&self) -> u64 {
        self.drops.iter().map(Counter::get).sum()
    }

    /// Zeroes every counter (the owning worker only, when its port id goes to a new port).
    pub fn reset(&self) {
        let PortStats {
            rx_packets,
            rx_bytes,
            tx_packets,
            tx_bytes,
            drops,
            checksums_completed,
            link_local,
            own_address,
            learn_refused,
        } = self;
        for c in
            [rx_packets, rx_bytes, tx_packets, tx_bytes, checksums_completed, link_local, own_address, learn_refused]
                .into_iter()
                .chain(drops)
        {
            c.reset();
        }
    }
}

/// Everything one worker counts.
#[derive(Debug)]
pub struct WorkerStats {
    /// The worker's index.
    pub worker: usize,
    /// Its counters of each port, by port id.
    pub ports: Vec<PortStats>,
    /// Its pool counters (all its pools together).
    pub pool: Arc<PoolStats>,
    /// TSC cycles spent in rounds that moved at least one packet.
    pub busy_cycles: Counter,
    /// Packets received and processed.
    pub packets: Counter,
    /// Non-empty RX bursts.
    pub batches: Counter,
    /// New FDB entries learned (evictions' replacements included).
    pub fdb_learned: Counter,
    /// Learned entries moved to another port.
    pub fdb_moved: Counter,
    /// Learned entries evicted from a full bucket to make room for a new one.
    pub fdb_evicted: Counter,
    /// Sources not learned from a frame: another worker was rewriting the slot at that instant
    /// ([`crate::fdb::Learned::Busy`]), or (which the static budget keeps from happening) the
    /// bucket was all static entries. A port's limit counts in [`PortStats::learn_refused`].
    pub fdb_not_learned: Counter,
    /// Extra copies made by flooding.
    pub flood_copies: Counter,
    /// Copies made for port mirrors.
    pub mirror_copies: Counter,
    /// Frames copied into another UMEM group's frame to leave by a port of that group.
    pub umem_copies: Counter,
    /// Frames in this worker's alloc cache of each pool, by pool id (updated per round).
    pub cache_frames: [Gauge; crate::pool::MAX_POOLS],
}

impl WorkerStats {
    /// Zeroed counters of worker `worker`, for `ports` port ids.
    pub fn new(worker: usize, ports: usize, pool: Arc<PoolStats>) -> Self {
        Self {
            worker,
            ports: (0..ports).map(|_| PortStats::default()).collect(),
            pool,
            busy_cycles: Counter::default(),
            packets: Counter::default(),
            batches: Counter::default(),
            fdb_learned: Counter::default(),
            fdb_moved: Counter::default(),
            fdb_evicted: Counter::default(),
            fdb_not_learned: Counter::default(),
            flood_copies: Counter::default(),
            mirror_copies: Counter::default(),
            umem_copies: Counter::default(),
            cache_frames: std::array::from_fn(|_| Gauge::default()),
        }
    }
}
