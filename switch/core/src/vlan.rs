//! 802.1Q VLANs as a port sees them: VLAN ids, member sets, and the per-port L2 settings the
//! pipeline applies (VLAN membership, storm control, mirroring).
//!
//! The model is the Linux bridge's with `vlan_filtering 1`: every frame is switched in exactly
//! one VLAN. A frame with an 802.1Q tag (TPID 0x8100) of a non-zero VID is switched in that
//! VLAN if the port is a member of it; an untagged or priority-tagged (VID 0) frame takes the
//! port's PVID; anything else is dropped as `vlan_filtered`. An 802.1ad outer tag (0x88a8) is
//! not the bridge's tag protocol, so such a frame is untagged here and its tag is payload. On
//! egress a frame leaves untagged on its port's PVID and tagged on every other member VLAN.

use crate::types::PortId;

/// A VLAN id a port can be a member of: 1..=4094 (0 means "priority tag only" and 4095 is
/// reserved by 802.1Q).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vid(u16);

impl Vid {
    /// VLAN 1, the PVID of a port configured without `vlan:` (the Linux bridge's default).
    pub const DEFAULT: Vid = Vid(1);
    /// The lowest VID a port can be a member of.
    pub const MIN: u16 = 1;
    /// The highest VID a port can be a member of (4095 is reserved).
    pub const MAX: u16 = 4094;

    /// `v` as a VID; `None` outside [`Vid::MIN`]..=[`Vid::MAX`].
    pub const fn new(v: u16) -> Option<Vid> {
        if v >= Self::MIN && v <= Self::MAX {
            Some(Vid(v))
        } else {
            None
        }
    }

    /// The VID as a number.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// A VID read back from where only a [`Vid`] was written (an FDB key's 12 bits, a member
    /// of a [`VlanSet`]).
    #[inline]
    pub(crate) const fn from_valid(v: u16) -> Vid {
        debug_assert!(v >= Self::MIN && v <= Self::MAX);
        Vid(v)
    }
}

impl std::fmt::Display for Vid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A set of VLAN ids: one bit per VID (512 bytes), so membership is one load and a mask.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet([u64; 64]);

impl Default for VlanSet {
    fn default() -> Self {
        VlanSet([0; 64])
    }
}

impl std::fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter().map(Vid::get)).finish()
    }
}

impl VlanSet {
    /// Adds `v` to the set.
    pub fn insert(&mut self, v: Vid) {
        self.0[v.0 as usize >> 6] |= 1 << (v.0 & 63);
    }

    /// Whether the raw VID `v` (any 12-bit value) is in the set.
    #[inline]
    pub fn contains(&self, v: u16) -> bool {
        let v = v & 0x0fff;
        self.0[v as usize >> 6] & (1 << (v & 63)) != 0
    }

    /// The VIDs in the set, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = Vid> + '_ {
        (Vid::MIN..=Vid::MAX).filter(|&v| self.contains(v)).map(Vid)
    }

    /// Whether the set has no VID.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
}

impl FromIterator<Vid> for VlanSet {
    fn from_iter<I: IntoIterator<Item = Vid>>(it: I) -> Self {
        let mut s = VlanSet::default();
        for v in it {
            s.insert(v);
        }
        s
    }
}

/// A port's VLAN membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortVlan {
    /// The VLAN of untagged and priority-tagged frames, and the one this port sends untagged;
    /// `None` on a trunk without a native VLAN (untagged frames are dropped).
    pub pvid: Option<Vid>,
    /// Every VLAN the port carries (the PVID included).
    pub members: VlanSet,
}

impl Default for PortVlan {
    /// An access port of VLAN 1.
    fn default() -> Self {
        Self::access(Vid::DEFAULT)
    }
}

impl PortVlan {
    /// Carries `vid` only, untagged.
    pub fn access(vid: Vid) -> Self {
        Self { pvid: Some(vid), members: [vid].into_iter().collect() }
    }

    /// Carries `allowed` tagged and `native` (when given) untagged.
    pub fn trunk(allowed: impl IntoIterator<Item = Vid>, native: Option<Vid>) -> Self {
        let mut members: VlanSet = allowed.into_iter().collect();
        if let Some(n) = native {
            members.insert(n);
        }
        Self { pvid: native, members }
    }

    /// Member of no VLAN: takes no part in switching (a mirror's destination).
    pub fn none() -> Self {
        Self { pvid: None, members: VlanSet::default() }
    }

    /// The VLAN a frame that arrived here is switched in: the VID of its 802.1Q tag (`tag`,
    /// the raw 12-bit VID) or, untagged or priority-tagged, the PVID; `None` when the port
    /// does not carry it.
    #[inline]
    pub fn classify(&self, tag: Option<u16>) -> Option<Vid> {
        match tag {
            // A member is a VID (0 and 4095 never are).
            Some(v) if v != 0 => self.members.contains(v).then_some(Vid(v)),
            _ => self.pvid,
        }
    }

    /// Whether a frame of VLAN `v` leaves this port untagged.
    #[inline]
    pub fn untagged(&self, v: u16) -> bool {
        self.pvid.is_some_and(|p| p.0 == v)
    }
}

/// Flood classes storm control limits, in the order of [`StormLimits::pps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum FloodClass {
    /// To ff:ff:ff:ff:ff:ff.
    Broadcast,
    /// To any other group address (link-local ones aside: they are never flooded).
    Multicast,
    /// To a station the FDB has no port for, or one learned on a port that is down.
    UnknownUnicast,
}

/// Storm control: at most this many flooded frames of each class per second enter the switch
/// on a port (counted per worker: the daemon divides a port's limit among the workers that
/// poll it). Like IOS storm control, a one-second window: what exceeds is dropped as `storm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StormLimits {
    /// Per [`FloodClass`]; `None`: unlimited.
    pub pps: [Option<u32>; 3],
}

/// A worker's storm-control window for one port.
#[derive(Clone, Copy, Debug, Default)]
pub struct StormState {
    window: u32,
    used: [u32; 3],
}

impl StormState {
    /// Takes one frame of `class` at tick `now` (seconds); false when over `limits`.
    #[inline]
    pub fn admit(&mut self, limits: &StormLimits, class: FloodClass, now: u32) -> bool {
        let Some(limit) = limits.pps[class as usize] else { return true };
        if self.window != now {
            self.window = now;
            self.used = [0; 3];
        }
        let used = &mut self.used[class as usize];
        if *used >= limit {
            return false;
        }
        *used += 1;
        true
    }
}

/// Everything the L2 stage needs to know about one port beyond its queues. Swapped as a whole
/// by a reload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortL2 {
    /// The VLANs the port carries, and which one it sends untagged.
    pub vlan: PortVlan,
    /// Its storm-control limits on flooded frames it receives.
    pub storm: StormLimits,
    /// Ports that get a copy of every frame this port receives (before any filtering).
    pub mirror_ingress: Vec<PortId>,
    /// Ports that get a copy of every frame this port sends (as it leaves).
    pub mirror_egress: Vec<PortId>,
    /// A mirror's destination: nothing is switched to it and what it receives is dropped.
    pub mirror_destination: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vid(v: u16) -> Vid {
        Vid::new(v).unwrap()
    }

    #[test]
    fn vid_range_edges() {
        assert_eq!(Vid::new(0), None);
        assert_eq!(Vid::new(1).map(Vid::get), Some(1));
        assert_eq!(Vid::new(4094).map(Vid::get), Some(4094));
        assert_eq!(Vid::new(4095), None);
    }

    #[test]
    fn access_and_trunk_classify_like_the_linux_bridge() {
        let access = PortVlan::access(vid(10));
        assert_eq!(access.classify(None), Some(vid(10)));
        assert_eq!(access.classify(Some(0)), Some(vid(10)), "priority tag takes the PVID");
        assert_eq!(access.classify(Some(10)), Some(vid(10)), "its own VID tagged is accepted");
        assert_eq!(access.classify(Some(20)), None);
        assert!(access.untagged(10));

        let trunk = PortVlan::trunk((20..=29).map(vid), Some(vid(1)));
        assert_eq!(trunk.classify(None), Some(vid(1)));
        assert_eq!(trunk.classify(Some(25)), Some(vid(25)));
        assert_eq!(trunk.classify(Some(30)), None);
        assert_eq!(trunk.classify(Some(4095)), None);
        assert!(trunk.untagged(1) && !trunk.untagged(25));

        let bare = PortVlan::trunk([vid(20)], None);
        assert_eq!(bare.classify(None), None, "no native VLAN: untagged frames are filtered");
        assert_eq!(bare.classify(Some(0)), None);
        assert_eq!(PortVlan::none().classify(Some(1)), None);
        assert_eq!(bare.members.iter().map(Vid::get).collect::<Vec<_>>(), vec![20]);
    }

    #[test]
    fn storm_window_admits_the_limit_per_second() {
        let limits = StormLimits { pps: [Some(3), None, Some(0)] };
        let mut s = StormState::default();
        let n = (0..10).filter(|_| s.admit(&limits, FloodClass::Broadcast, 5)).count();
        assert_eq!(n, 3);
        assert!(s.admit(&limits, FloodClass::Multicast, 5), "unlimited class");
        assert!(!s.admit(&limits, FloodClass::UnknownUnicast, 5), "a limit of 0 admits nothing");
        assert!(s.admit(&limits, FloodClass::Broadcast, 6), "a new second, a new window");
    }
}
