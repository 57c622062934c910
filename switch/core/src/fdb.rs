//! The forwarding database: (VLAN, MAC) → port, learned from traffic, aged out when silent.
//!
//! Lock-free and shared by all workers. The table is an array of 128-byte buckets of eight
//! 16-byte entries. An entry's key (MAC, VLAN, static flag) is one `AtomicU64`; its port shares
//! an `AtomicU32` with a 16-bit generation that every rewrite of the slot advances, and its
//! last-seen tick is the other `AtomicU32`: key, port and tick in one cache line, so a learn or
//! a lookup whose entry is among its bucket's first four touches one line, not two. A writer that
//! changes a slot's key parks it on `CLAIMED`, writes the port word (next generation), then
//! publishes the key; a lookup reads the port word, the key and the port word again, and takes
//! the port only when both reads agree, so it never pairs a key with the port of another entry
//! that held the slot in between (an ABA would need 65,536 rewrites of one slot inside three
//! loads). Learning writes only when something changes: a new MAC, a MAC that
//! moved, or a last-seen tick that advanced (ticks are coarse, one second by default), so
//! steady traffic costs no stores and no cache-line bouncing between workers. A full bucket
//! evicts its stalest learned entry.
//!
//! Learning is per VLAN (IVL, as the Linux bridge with `vlan_filtering 1`): one MAC can be on
//! different ports in different VLANs. Static entries (from the config or the API) are never
//! aged, moved by learning or evicted.
//!
//! Statics have a budget, so that learning always has room: at most
//! [`MAX_STATICS_PER_BUCKET`] of a bucket's eight slots, and at most [`STATIC_SHARE_PERCENT`] %
//! of the table ([`max_statics`]). An add beyond either is refused ([`StaticError`]), never
//! made by evicting learned entries until nothing can be learned.
//!
//! A port may have a limit on its learned entries ([`Fdb::set_max_learned`], `fdb.max_macs`
//! in the config), as the Linux bridge's `fdb_max_learned`: statics do not count, and at the
//! limit a new address is not learned ([`Learned::Limited`]: its frames are still forwarded, and
//! frames to it flooded). Each port's count changes only on the slow paths (a new entry, an
//! eviction, a move, a removal), never on the known-address fast path. It is exact: every
//! change of a slot's key or port goes through one atomic read-modify-write of it, and the
//! count follows the winner (see `Fdb::take` and `Fdb::put`). It may read one above the table
//! per learn in flight (a learn reserves before it writes); it never goes below 0.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::counter::Counter;
use crate::types::PortId;
use crate::vlan::{Vid, VlanSet};
use crate::wire::MacAddr;

const SLOTS: usize = 8;
/// The most static entries one bucket may hold: two of its eight slots are always left to
/// learning, so a bucket full of statics never stops a station from being learned (each of
/// these two keeps its freshest learned entries by the usual eviction).
pub const MAX_STATICS_PER_BUCKET: usize = 6;
/// The most static entries a table may hold, in percent of its capacity ([`max_statics`]):
/// the other half is learning's whatever the statics' hashes, which the per-bucket cap alone
/// (75 %) would not leave it.
pub const STATIC_SHARE_PERCENT: usize = 50;
/// Ports whose learned entries a table counts and may limit (port ids below this; a port id
/// above is learned without a count or limit). The switch's port ids are fewer.
pub const COUNTED_PORTS: usize = 128;
const MAC_MASK: u64 = (1 << 48) - 1;
/// The I/G bit of the MAC in a key (the first byte's lowest, as [`MacAddr::to_u64`] puts it).
const GROUP_BIT: u64 = 1 << 40;
const VID_SHIFT: u32 = 48;
/// Set in every live key, so a key is never 0 (an empty slot).
const LIVE: u64 = 1 << 63;
const STATIC: u64 = 1 << 62;
/// A slot being (re)written: no lookup matches it, no other writer takes it.
const CLAIMED: u64 = LIVE | (0xfff << VID_SHIFT) | MAC_MASK;

/// One entry: its key and, in the same 16 bytes, its port word and last-seen tick, so a learn
/// or lookup that finds its key in one of a bucket's first four slots touches one cache line.
#[repr(C)]
#[derive(Default)]
struct Slot {
    key: AtomicU64,
    /// Generation (high 16 bits) and port + 1 (low 16 bits; 0 before the first claim).
    port: AtomicU32,
    seen: AtomicU32,
}

/// Eight entries: two adjacent cache lines, prefetched together.
#[repr(align(128))]
#[derive(Default)]
struct Bucket {
    slots: [Slot; SLOTS],
}

// Four slots to a cache line, a bucket two lines: what the prefetch and the module's cache
// figures assume.
const _: () = assert!(std::mem::size_of::<Slot>() == 16 && std::mem::size_of::<Bucket>() == 128);

impl Slot {
    /// The slot's (key, port), read consistently: port word, key, port word; `None` if the
    /// slot was rewritten in between (then a lookup floods, once) or never held an entry.
    #[inline]
    fn read(&self) -> Option<(u64, PortId)> {
        let w1 = self.port.load(Ordering::Acquire);
        let v = self.key.load(Ordering::Acquire);
        let w2 = self.port.load(Ordering::Acquire);
        (w1 == w2 && port_of(w1) != 0).then(|| (v, PortId(port_of(w1) - 1)))
    }
}

/// Where one (VLAN, MAC) lives in one table: its key and bucket, from [`Fdb::place`]. A
/// resized table is a new `Fdb`; a place is only ever used with the table that made it, within
/// one batch. `Place::default()` is the place of no address (a live key is never 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place {
    key: u64,
    bucket: u32,
}

impl Place {
    /// The key and bucket, for a batch that stores places packed ([`crate::batch::L2Header`]).
    #[inline]
    pub(crate) fn parts(self) -> (u64, u32) {
        (self.key, self.bucket)
    }

    /// The place of [`Place::parts`].
    #[inline]
    pub(crate) fn from_parts(key: u64, bucket: u32) -> Place {
        Place { key, bucket }
    }

    /// True for the place of the same (VLAN, MAC) as `other`.
    #[inline]
    pub fn same_address(self, other: Place) -> bool {
        self.key == other.key
    }

    /// The MAC of the address, as [`MacAddr::to_u64`] gives it.
    #[inline]
    pub fn mac_bits(self) -> u64 {
        self.key & MAC_MASK
    }

    /// True for a group (multicast or broadcast) address.
    #[inline]
    pub fn is_group(self) -> bool {
        self.key & GROUP_BIT != 0
    }

    /// True when the address is a station's: not a group address and not all zeros. What a
    /// source must be.
    #[inline]
    pub fn is_station(self) -> bool {
        // One test for both: the I/G bit (40) rotated into the sign bit, so the MAC is positive
        // exactly when it is individual and not all zeros.
        const { assert!(GROUP_BIT == 1 << 40) };
        ((self.key & MAC_MASK).rotate_left(63 - 40) as i64) > 0
    }
}

/// The most static entries a table of `capacity` may hold ([`STATIC_SHARE_PERCENT`] of the
/// slots it has, `capacity` rounded up to whole buckets).
pub fn max_statics(capacity: usize) -> usize {
    buckets_for(capacity) * SLOTS * STATIC_SHARE_PERCENT / 100
}

/// What a learn call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Known, same port (or a static entry); nothing written but the last-seen tick.
    Known,
    /// New entry.
    New,
    /// Known on another port; moved.
    Moved,
    /// New entry that evicted a stale one from a full bucket.
    Evicted,
    /// Nowhere to put it: the bucket is all static entries (which the static budget never
    /// lets a bucket be: [`MAX_STATICS_PER_BUCKET`]).
    Full,
    /// Not learned: the port has as many learned entries as its limit allows
    /// ([`Fdb::set_max_learned`]). The frame is forwarded all the same.
    Limited,
    /// Not learned from this frame: another writer was rewriting the entry's slot (or
    /// inserting the same address) at that instant. A later frame learns it.
    Busy,
}

/// Why a static entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticError {
    /// The entry's bucket already holds [`MAX_STATICS_PER_BUCKET`] static entries.
    BucketFull,
    /// The table already holds [`max_statics`] static entries (`max` of a table of `capacity`).
    TableFull {
        /// The table's static budget, [`max_statics`] of its capacity.
        max: usize,
        /// The table's capacity in entries.
        capacity: usize,
    },
    /// A group (multicast) or all-zero address cannot be a station.
    GroupAddress,
}

impl std::fmt::Display for StaticError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaticError::BucketFull => write!(
                f,
                "its hash bucket already holds {MAX_STATICS_PER_BUCKET} static entries, the most a bucket may (the other {} of its {SLOTS} slots are for learning; raise fdb.capacity)",
                SLOTS - MAX_STATICS_PER_BUCKET
            ),
            StaticError::TableFull { max, capacity } => write!(
                f,
                "the table already holds {max} static entries, the most a table of {capacity} may ({STATIC_SHARE_PERCENT} %; the rest is for learning; raise fdb.capacity)"
            ),
            StaticError::GroupAddress => f.write_str("a multicast, broadcast or all-zero address cannot be an FDB entry"),
        }
    }
}

/// One port's learned entries and limit, on a cache line of its own (a flood from one port
/// bounces only its own line, and only on the slow path).
#[repr(align(64))]
#[derive(Debug, Default)]
struct PortLearned {
    learned: AtomicU32,
    /// 0 for no limit.
    max: AtomicU32,
}

/// One entry, as [`Fdb::entries`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// The VLAN it was learned or added in.
    pub vlan: Vid,
    /// The station's address.
    pub mac: MacAddr,
    /// The port frames to it leave by.
    pub port: PortId,
    /// Ticks since last seen (0 for static entries).
    pub age: u32,
    /// Added by the config or the API: never aged, moved or evicted.
    pub is_static: bool,
}

/// The first bytes of a MAC, none to all six (`02:00:5e`): what a listing's MAC filter takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MacPrefix {
    /// The prefix's bits where `mask` has ones, in the MAC's 48 bits as [`MacAddr::to_u64`]
    /// puts them.
    bits: u64,
    mask: u64,
}

impl MacPrefix {
    /// True when `mac` (48 bits, as [`MacAddr::to_u64`] gives it) begins with the prefix.
    #[inline]
    pub fn matches(self, mac: u64) -> bool {
        mac & self.mask == self.bits
    }
}

impl std::str::FromStr for MacPrefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let expected = "expected 1 to 6 hex bytes separated by `:`, like 02:00:5e";
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 6 {
            return Err(format!("`{s}` is not a MAC prefix ({expected})"));
        }
        let (mut bits, mut mask) = (0u64, 0u64);
        for (i, p) in parts.iter().enumerate() {
            // One or two hex digits, as a MAC's bytes (`from_str_radix` alone takes `+c`).
            if !(1..=2).contains(&p.len()) || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("`{s}` is not a MAC prefix (bad byte `{p}`: {expected})"));
            }
            let byte = u8::from_str_radix(p, 16).map_err(|_| format!("`{s}` is not a MAC prefix ({expected})"))?;
            let shift = 40 - 8 * i;
            bits |= u64::from(byte) << shift;
            mask |= 0xff << shift;
        }
        Ok(MacPrefix { bits, mask })
    }
}

/// Which entries a listing ([`Fdb::page`]) returns: every condition given must hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Select {
    /// Only entries on this port.
    pub port: Option<PortId>,
    /// Only entries in this VLAN.
    pub vlan: Option<Vid>,
    /// Every MAC begins with the empty prefix (the default).
    pub mac: MacPrefix,
}

/// Which entries a flush removes: every condition given must hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flush {
    /// Only entries on this port.
    pub port: Option<PortId>,
    /// Only entries in this VLAN.
    pub vlan: Option<Vid>,
    /// Static entries too (learned ones always).
    pub statics: bool,
}

/// Counters of the table as a whole, each written by one thread at a time.
#[derive(Debug, Default)]
pub struct FdbStats {
    /// Entries the aging sweep removed (its thread).
    pub aged: Counter,
    /// Learned entries a resize into a smaller table had no room for (the reload's thread).
    pub resize_dropped: Counter,
}

/// The table: (VLAN, MAC) → port, shared lock-free by every worker (see the module docs).
pub struct Fdb {
    buckets: Box<[Bucket]>,
    mask: usize,
    /// Read only by the aging sweep, so an atomic (relaxed) costs the datapath nothing and lets
    /// a reload change it on a running table.
    aging_ticks: AtomicU32,
    /// Held by each edit from outside the datapath (static adds and removes, removes, flushes):
    /// each reads a slot, then rewrites it, so two at once could both give one static address a
    /// slot, or one remove the entry the other had just put in its place. Workers never take it.
    edits: Mutex<()>,
    /// Static entries in the table, changed only under `edits` (for the total budget).
    statics: AtomicUsize,
    /// Learned entries and limit of each port id below [`COUNTED_PORTS`].
    ports: Box<[PortLearned]>,
    /// Tells this table from every other one (a resize makes a new table): a listing's cursor
    /// names the table its position is in. Random, so a cursor from before a restart is not
    /// taken for one of the new process's tables.
    id: u64,
    /// Entries the last aging sweep counted ([`Fdb::counted`]).
    counted: AtomicUsize,
    /// Counts of the aging sweep and of resizes.
    pub stats: FdbStats,
}

impl std::fmt::Debug for Fdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fdb").field("capacity", &self.capacity()).field("aging_ticks", &self.aging_ticks()).finish()
    }
}

#[inline]
fn key(vlan: Vid, mac: MacAddr) -> u64 {
    key_bits(vlan, mac.to_u64())
}

/// [`key`] of a MAC as [`MacAddr::to_u64`] gives it (48 bits).
#[inline]
fn key_bits(vlan: Vid, mac: u64) -> u64 {
    debug_assert!(mac <= MAC_MASK, "a MAC is 48 bits");
    // A VID is 12 bits (1-4094).
    LIVE | (u64::from(vlan.get()) << VID_SHIFT) | mac
}

#[inline]
fn same_entry(v: u64, k: u64) -> bool {
    v & !STATIC == k
}

/// Ticks from `seen` to `now`, 0 when `seen` is the later. Each worker keeps its own clock, so
/// an entry that one worker refreshed on the next tick can be read by a thread still on this
/// one; counted unsigned, that entry would look 136 years old, and the aging sweep or an
/// eviction would take the freshest entry of all.
#[inline]
fn ticks_since(seen: u32, now: u32) -> u32 {
    (now.wrapping_sub(seen) as i32).max(0) as u32
}

/// The port + 1 of a port word.
#[inline]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the low 16 bits are the port + 1; the generation above is dropped on purpose"
)]
fn port_of(w: u32) -> u16 {
    w as u16
}

fn unpack(v: u64) -> (Vid, MacAddr, bool) {
    let vid = ((v >> VID_SHIFT) & 0xfff) as u16;
    // Only a `Vid` is ever packed into a key (`key_bits`).
    (Vid::from_valid(vid), MacAddr::from_u64(v & MAC_MASK), v & STATIC != 0)
}

/// A new table's [`Fdb::id`]: a serial, hashed with this process's random keys.
fn table_id() -> u64 {
    use std::hash::BuildHasher;
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(SERIAL.fetch_add(1, Ordering::Relaxed))
}

/// Buckets of a table with room for at least `capacity` MACs (a power of two).
fn buckets_for(capacity: usize) -> usize {
    capacity.div_ceil(SLOTS).next_power_of_two().max(1)
}

/// The bucket of key `k` in a table of `mask + 1` buckets. Fibonacci hashing: MACs of one
/// vendor differ in the low bytes only.
#[inline]
fn bucket_index(k: u64, mask: usize) -> usize {
    ((k.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 40) as usize & mask
}

impl Fdb {
    /// A table with room for at least `capacity` MACs, forgetting entries silent for more than
    /// `aging_ticks` ticks.
    pub fn new(capacity: usize, aging_ticks: u32) -> Self {
        let buckets = buckets_for(capacity);
        Self {
            buckets: (0..buckets).map(|_| Bucket::default()).collect(),
            mask: buckets - 1,
            aging_ticks: AtomicU32::new(aging_ticks),
            edits: Mutex::new(()),
            statics: AtomicUsize::new(0),
            ports: (0..COUNTED_PORTS).map(|_| PortLearned::default()).collect(),
            id: table_id(),
            counted: AtomicUsize::new(0),
            stats: FdbStats::default(),
        }
    }

    /// Limits `port`'s learned entries to `max` (0: no limit). Entries it has above a lowered
    /// limit stay until they age, move or are flushed; none is added while it is at or above.
    /// A port id of [`COUNTED_PORTS`] or more is never limited.
    pub fn set_max_learned(&self, port: PortId, max: u32) {
        if let Some(c) = self.ports.get(port.index()) {
            c.max.store(max, Ordering::Relaxed);
        }
    }

    /// `port`'s limit on learned entries (0: none).
    pub fn max_learned(&self, port: PortId) -> u32 {
        self.ports.get(port.index()).map_or(0, |c| c.max.load(Ordering::Relaxed))
    }

    /// `port`'s learned entries (static ones do not count).
    pub fn learned_on(&self, port: PortId) -> u32 {
        self.ports.get(port.index()).map_or(0, |c| c.learned.load(Ordering::Relaxed))
    }

    /// Static entries in the table.
    pub fn statics(&self) -> usize {
        self.statics.load(Ordering::Relaxed)
    }

    /// Counts one more learned entry on `port` unless it is at its limit (then false, and
    /// nothing written: a flood of new addresses at the limit only reads the count). Slow path.
    fn reserve(&self, port: PortId) -> bool {
        let Some(c) = self.ports.get(port.index()) else { return true };
        let max = c.max.load(Ordering::Relaxed);
        if max != 0 && c.learned.load(Ordering::Relaxed) >= max {
            return false;
        }
        // Two learns at the limit less one can both pass the check above: the add decides.
        if c.learned.fetch_add(1, Ordering::Relaxed) >= max && max != 0 {
            self.release(port);
            return false;
        }
        true
    }

    /// One learned entry fewer on `port`; never below 0.
    fn release(&self, port: PortId) {
        if let Some(c) = self.ports.get(port.index()) {
            let _ = c.learned.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// What leaves with the entry whose key was `v` and port word `w`: one learned entry of
    /// its port, or one static entry.
    fn forget(&self, v: u64, w: u32) {
        if v & STATIC != 0 {
            let _ = self.statics.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        } else {
            self.release(PortId(port_of(w).wrapping_sub(1)));
        }
    }

    /// Empties slot `s` if it still holds key `v`; false if another writer changed it first.
    /// Claims the key, then advances the port word's generation in one read-modify-write that
    /// returns the port the entry had at that instant: a move racing this either landed before
    /// (and moved the count) or fails its compare-exchange, so the count of the right port goes.
    fn take(&self, s: &Slot, v: u64) -> bool {
        if s.key.compare_exchange(v, CLAIMED, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        let w = s.port.fetch_add(1 << 16, Ordering::AcqRel);
        s.key.store(0, Ordering::Release);
        self.forget(v, w);
        true
    }

    /// This table's identity (see the field).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Entries in the table as the last aging sweep counted them ([`Fdb::age`] walks every
    /// slot anyway, every tenth of a second in the daemon): a count that costs its readers no
    /// walk, some 100 ms old; 0 before the first sweep.
    pub fn counted(&self) -> usize {
        self.counted.load(Ordering::Relaxed)
    }

    /// The lock of the edits from outside the datapath (see the field).
    fn edit(&self) -> MutexGuard<'_, ()> {
        self.edits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ticks an entry may stay silent before the sweep forgets it.
    pub fn aging_ticks(&self) -> u32 {
        self.aging_ticks.load(Ordering::Relaxed)
    }

    /// Changes the aging time; the next sweep uses it.
    pub fn set_aging_ticks(&self, ticks: u32) {
        self.aging_ticks.store(ticks, Ordering::Relaxed);
    }

    /// Entries the table has slots for: whole buckets, at least the capacity asked for.
    pub fn capacity(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    #[inline]
    fn bucket_of(&self, k: u64) -> usize {
        bucket_index(k, self.mask)
    }

    /// The bucket of `at` and its index. Masked rather than bounds-checked (one instruction
    /// instead of a compare and branch per learn and lookup): a place made by another table,
    /// which the pipeline never uses, would read a wrong bucket, never out of bounds.
    #[inline]
    fn bucket_at(&self, at: Place) -> (&Bucket, usize) {
        let i = at.bucket as usize & self.mask;
        // SAFETY: `buckets.len() == mask + 1` (both set in `new`, never changed), so `i` is in
        // bounds.
        (unsafe { self.buckets.get_unchecked(i) }, i)
    }

    /// Where the entry for (`vlan`, `mac`) lives. The pipeline works it out once per address
    /// of a packet, as it parses the frame, and hands it to the learn and the lookup.
    #[inline]
    pub fn place(&self, vlan: Vid, mac: MacAddr) -> Place {
        self.place_bits(vlan, mac.to_u64())
    }

    /// [`Fdb::place`] of a MAC as [`MacAddr::to_u64`] gives it (as the parser reads it).
    #[inline]
    pub fn place_bits(&self, vlan: Vid, mac: u64) -> Place {
        let key = key_bits(vlan, mac);
        #[expect(clippy::cast_possible_truncation, reason = "`bucket_index` keeps 24 bits of the hash")]
        let bucket = self.bucket_of(key) as u32;
        Place { key, bucket }
    }

    /// Starts loading the bucket of `at` into cache (the parser prefetches every lookup of a
    /// batch before the forwarding pass uses any, so their cache misses overlap).
    #[inline]
    pub fn prefetch(&self, at: Place) {
        // Address arithmetic, not an index: a prefetch reads nothing, so it needs no bounds check.
        let b: *const Bucket = self.buckets.as_ptr().wrapping_add(at.bucket as usize);
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // A bucket is 128 bytes: the second cache line starts 64 bytes in, still inside it.
            let second = b.cast::<i8>().wrapping_add(64);
            // SAFETY: prefetch is a hint with no memory effects and cannot fault, whatever the
            // address (it is a live bucket's for a place of this table).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(b.cast()) };
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(second) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = b;
    }

    /// The port `mac` was learned on in `vlan`.
    #[inline]
    pub fn lookup(&self, vlan: Vid, mac: MacAddr) -> Option<PortId> {
        self.lookup_at(self.place(vlan, mac))
    }

    /// [`Fdb::lookup`] of a [`Fdb::place`] of this table.
    #[inline]
    pub fn lookup_at(&self, at: Place) -> Option<PortId> {
        let k = at.key;
        let (b, _) = self.bucket_at(at);
        for s in &b.slots {
            if same_entry(s.key.load(Ordering::Relaxed), k) {
                return s.read().filter(|&(v, _)| same_entry(v, k)).map(|(_, p)| p);
            }
        }
        None
    }

    /// Records that `mac` was seen in `vlan` on `port` at tick `now`.
    #[inline]
    pub fn learn(&self, vlan: Vid, mac: MacAddr, port: PortId, now: u32) -> Learned {
        self.learn_at(self.place(vlan, mac), port, now)
    }

    /// [`Fdb::learn`] at a [`Fdb::place`] of this table.
    #[inline]
    pub fn learn_at(&self, at: Place, port: PortId, now: u32) -> Learned {
        let k = at.key;
        let (b, bi) = self.bucket_at(at);
        let want = port.0 + 1;
        // The common case, a known address on its port seen this tick, only reads. An empty slot
        // (key 0) never matches a live key, so the scan need not look for one here.
        for s in &b.slots {
            let v = s.key.load(Ordering::Acquire);
            if same_entry(v, k) {
                if v & STATIC != 0 {
                    return Learned::Known;
                }
                let w = s.port.load(Ordering::Acquire);
                if port_of(w) == want && s.seen.load(Ordering::Relaxed) == now {
                    return Learned::Known;
                }
                return self.refresh(s, v, w, want, now);
            }
        }
        self.learn_slow(bi, k, want, now)
    }

    /// A learned entry seen again: its tick advanced, its port changed if it moved. Out of
    /// line: once per entry per tick, or on a move.
    #[inline(never)]
    fn refresh(&self, s: &Slot, v: u64, w: u32, want: u16, now: u32) -> Learned {
        // The slot may have been emptied and given to another address since its key was read:
        // its tick is not this address's to advance.
        if s.key.load(Ordering::Acquire) != v {
            return Learned::Busy;
        }
        let moved = port_of(w) != want;
        // A move onto a port at its limit is refused whole: the entry stays where it was and is
        // not kept fresh by the frames of the port that may not have it (if the station did
        // move, the entry ages out and frames to it are flooded).
        if moved && !self.reserve(PortId(want - 1)) {
            return Learned::Limited;
        }
        // Forward only: another worker's clock may be a tick ahead of this one's.
        if ticks_since(s.seen.load(Ordering::Relaxed), now) > 0 {
            s.seen.store(now, Ordering::Relaxed);
        }
        if !moved {
            return Learned::Known;
        }
        // Moved (same key and generation; a lookup in between sees the two port words differ
        // and floods once): last writer wins if two workers see it on two ports at once. Only a
        // slot whose port word nobody rewrote since `w` (a new entry, or a removal, advances the
        // generation), and that still held this key above, takes the port.
        if s.port.compare_exchange(w, (w & 0xffff_0000) | want as u32, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            self.release(PortId(want - 1));
            return Learned::Busy;
        }
        self.release(PortId(port_of(w).wrapping_sub(1)));
        Learned::Moved
    }

    #[cold]
    fn learn_slow(&self, bi: usize, k: u64, want: u16, now: u32) -> Learned {
        let b = &self.buckets[bi];
        let empty = b.slots.iter().position(|s| s.key.load(Ordering::Acquire) == 0);
        // Two workers that see a new address at once both get here: one address must never
        // take two slots (a remove would take one and leave the other forwarding). So a bucket
        // with a slot being rewritten is left alone, and whoever loses the race for a slot
        // stops there instead of evicting another entry.
        if b.slots.iter().any(|s| s.key.load(Ordering::Acquire) == CLAIMED) {
            return Learned::Busy;
        }
        if !self.reserve(PortId(want - 1)) {
            return Learned::Limited;
        }
        let (i, old, learned) = match empty {
            Some(i) => (i, 0, Learned::New),
            None => {
                // Bucket full: evict the stalest learned entry.
                let oldest = (0..SLOTS)
                    .filter(|&i| b.slots[i].key.load(Ordering::Relaxed) & STATIC == 0)
                    .max_by_key(|&i| ticks_since(b.slots[i].seen.load(Ordering::Relaxed), now));
                let Some(i) = oldest else {
                    self.release(PortId(want - 1));
                    return Learned::Full;
                };
                let v = b.slots[i].key.load(Ordering::Acquire);
                if v == CLAIMED || v & STATIC != 0 {
                    self.release(PortId(want - 1));
                    return Learned::Busy;
                }
                (i, v, Learned::Evicted)
            }
        };
        if !self.put(b, i, old, k, want, now) {
            self.release(PortId(want - 1));
            return Learned::Busy;
        }
        // Two writers that both saw no claim can still put the address into two different
        // slots. Each looks for the other's copy after publishing its own (the fence makes sure
        // at least one of the two sees the other) and withdraws its own when it finds one.
        std::sync::atomic::fence(Ordering::SeqCst);
        let doubled = b.slots.iter().enumerate().any(|(j, s)| j != i && same_entry(s.key.load(Ordering::Acquire), k));
        if doubled {
            // Its count goes with it (`take`), as it would with whoever else took the slot.
            self.take(&b.slots[i], k);
            return Learned::Busy;
        }
        learned
    }

    /// Rewrites slot `i` from key `old` to key `k` on port `want - 1`: claim, port, publish.
    /// Counts what it replaced (an evicted learned entry, a static one) gone and a static `k`
    /// in; a learned `k` the caller has counted (`reserve`).
    fn put(&self, b: &Bucket, i: usize, old: u64, k: u64, want: u16, now: u32) -> bool {
        let s = &b.slots[i];
        if s.key.compare_exchange(old, CLAIMED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        // Tick first so the aging sweep never sees the new entry with a stale time.
        s.seen.store(now, Ordering::Relaxed);
        // The next generation in one read-modify-write, as `take` does: the port the evicted
        // entry had is read where no move can slip in after it (a move's compare-exchange on
        // the old word fails from here).
        let w = s.port.fetch_add(1 << 16, Ordering::AcqRel).wrapping_add(1 << 16);
        s.port.store((w & 0xffff_0000) | want as u32, Ordering::Release);
        s.key.store(k, Ordering::Release);
        if old != 0 {
            self.forget(old, w);
        }
        if k & STATIC != 0 {
            self.statics.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Adds (or replaces) a static entry: never aged, never moved by learning or evicted. A
    /// new one beyond the static budget ([`MAX_STATICS_PER_BUCKET`] in its bucket,
    /// [`max_statics`] in the table) is refused; replacing one (another port) always works.
    pub fn add_static(&self, vlan: Vid, mac: MacAddr, port: PortId) -> Result<(), StaticError> {
        if !mac.is_station() {
            return Err(StaticError::GroupAddress);
        }
        let _edit = self.edit();
        let k = key(vlan, mac);
        let b = &self.buckets[self.bucket_of(k)];
        loop {
            let keys: [u64; SLOTS] = std::array::from_fn(|i| b.slots[i].key.load(Ordering::Acquire));
            // Statics change only under `edits`, which this holds: the budget cannot move under it.
            if !keys.contains(&(k | STATIC)) {
                if keys.iter().filter(|&&v| v & STATIC != 0).count() >= MAX_STATICS_PER_BUCKET {
                    return Err(StaticError::BucketFull);
                }
                let max = max_statics(self.capacity());
                if self.statics() >= max {
                    return Err(StaticError::TableFull { max, capacity: self.capacity() });
                }
            }
            // The entry itself, learned or static, first; then an empty slot; then the stalest
            // learned entry.
            let slot =
                keys.iter().position(|&v| same_entry(v, k)).or_else(|| keys.iter().position(|&v| v == 0)).or_else(
                    || {
                        (0..SLOTS)
                            .filter(|&i| keys[i] & STATIC == 0 && keys[i] != CLAIMED)
                            .min_by_key(|&i| b.slots[i].seen.load(Ordering::Relaxed))
                    },
                );
            let Some(i) = slot else { return Err(StaticError::BucketFull) };
            if self.put(b, i, keys[i], k | STATIC, port.0 + 1, 0) {
                // A learn of the same address, racing this, may have put it into another slot
                // (each saw the other's slot empty), and a lookup taking the learned copy would
                // forward past the static entry. After the fence at least one of the two sees
                // the other: a learn withdraws its own copy (`learn_slow`), this removes any
                // learned copy it sees.
                std::sync::atomic::fence(Ordering::SeqCst);
                for (j, s) in b.slots.iter().enumerate() {
                    if j != i && s.key.load(Ordering::Acquire) == k {
                        self.take(s, k);
                    }
                }
                return Ok(());
            }
        }
    }

    /// Whether this table's static entries, less `remove` (each (VLAN, MAC, port)) and those
    /// on `gone_ports`, plus `add`, would fit a table of `capacity`: within the static budget
    /// (per bucket and in all, as [`Fdb::add_static`] holds them), no group address. What a
    /// reload asks before it changes anything; it allocates only for
    /// the static entries.
    pub fn statics_fit(
        &self,
        capacity: usize,
        remove: &[(Vid, MacAddr, PortId)],
        gone_ports: &[PortId],
        add: &[(Vid, MacAddr, PortId)],
    ) -> Result<(), String> {
        let mask = buckets_for(capacity) - 1;
        let bucket = |k: u64| bucket_index(k, mask);
        let mut statics: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for b in self.buckets.iter() {
            for s in &b.slots {
                let v = s.key.load(Ordering::Acquire);
                if v == CLAIMED || v & STATIC == 0 {
                    continue;
                }
                let port = PortId(port_of(s.port.load(Ordering::Acquire)).wrapping_sub(1));
                let (vlan, mac, _) = unpack(v);
                if !remove.contains(&(vlan, mac, port)) && !gone_ports.contains(&port) {
                    statics.insert(v & !STATIC);
                }
            }
        }
        let mut per_bucket: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for &k in &statics {
            *per_bucket.entry(bucket(k)).or_default() += 1;
        }
        let max = max_statics(capacity);
        for &(vlan, mac, _) in add {
            if !mac.is_station() {
                return Err(format!("{mac} in VLAN {vlan}: {}", StaticError::GroupAddress));
            }
            let k = key(vlan, mac);
            if statics.insert(k) {
                let n = per_bucket.entry(bucket(k)).or_default();
                *n += 1;
                let why = if *n > MAX_STATICS_PER_BUCKET {
                    StaticError::BucketFull
                } else if statics.len() > max {
                    StaticError::TableFull { max, capacity }
                } else {
                    continue;
                };
                return Err(format!("{mac} in VLAN {vlan} does not fit a table of {capacity}: {why}"));
            }
        }
        if let Some((&b, &n)) = per_bucket.iter().find(|(_, &n)| n > MAX_STATICS_PER_BUCKET) {
            let (vlan, mac, _) = unpack(*statics.iter().find(|&&k| bucket(k) == b).expect("counted above"));
            return Err(format!(
                "the static entry {mac} in VLAN {vlan} does not fit a table of {capacity}: its hash bucket would hold {n} static entries, {MAX_STATICS_PER_BUCKET} at most (the other {} of its {SLOTS} slots are for learning)",
                SLOTS - MAX_STATICS_PER_BUCKET
            ));
        }
        if statics.len() > max {
            return Err(format!(
                "the {} static entries do not fit a table of {capacity}: it may hold {max} ({STATIC_SHARE_PERCENT} %; the rest is for learning)",
                statics.len()
            ));
        }
        Ok(())
    }

    /// Removes the static entry for (`vlan`, `mac`) if it is on `port`; false when there was
    /// none (a learned entry, or a static one on another port, stays).
    pub fn remove_static(&self, vlan: Vid, mac: MacAddr, port: PortId) -> bool {
        let _edit = self.edit();
        let k = key(vlan, mac);
        let b = &self.buckets[self.bucket_of(k)];
        b.slots.iter().any(|s| {
            let v = s.key.load(Ordering::Acquire);
            same_entry(v, k)
                && v & STATIC != 0
                && port_of(s.port.load(Ordering::Acquire)).wrapping_sub(1) == port.0
                && self.take(s, v)
        })
    }

    /// Removes the entry for (`vlan`, `mac`), static or learned; false when there was none.
    pub fn remove(&self, vlan: Vid, mac: MacAddr) -> bool {
        let _edit = self.edit();
        let k = key(vlan, mac);
        let b = &self.buckets[self.bucket_of(k)];
        // Every slot, not the first match: a second copy that a racing learn put in for the
        // moment (see `learn_slow`) goes too. A learn that publishes after this scan is a learn
        // after the remove.
        b.slots.iter().fold(false, |removed, s| {
            let v = s.key.load(Ordering::Acquire);
            (same_entry(v, k) && self.take(s, v)) || removed
        })
    }

    /// Removes the entries `what` selects; returns how many.
    pub fn flush(&self, what: Flush) -> usize {
        self.flush_where(what.statics, |vlan, port| {
            what.vlan.is_none_or(|x| x == vlan) && what.port.is_none_or(|x| x == port)
        })
    }

    /// Removes the learned entries of `port` in the VLANs outside `kept` (those a reload took
    /// from it), as the bridge flushes a port's entries of a VLAN it leaves and only those;
    /// returns how many.
    pub fn flush_port_outside(&self, port: PortId, kept: &VlanSet) -> usize {
        self.flush_where(false, |vlan, p| p == port && !kept.contains(vlan.get()))
    }

    /// Removes the learned entries (and the static ones too with `statics`) for whose VLAN and
    /// port `selected` holds; returns how many.
    fn flush_where(&self, statics: bool, selected: impl Fn(Vid, PortId) -> bool) -> usize {
        let _edit = self.edit();
        let mut n = 0;
        for b in self.buckets.iter() {
            for s in &b.slots {
                let v = s.key.load(Ordering::Acquire);
                if v == 0 || v == CLAIMED || (v & STATIC != 0 && !statics) {
                    continue;
                }
                let (vlan, _, _) = unpack(v);
                let port = port_of(s.port.load(Ordering::Acquire)).wrapping_sub(1);
                if selected(vlan, PortId(port)) && self.take(s, v) {
                    n += 1;
                }
            }
        }
        n
    }

    /// Removes learned entries silent for longer than the aging time; returns how many. Run by
    /// one housekeeping thread (it owns `stats.aged`).
    /// Counts the entries it leaves, for [`Fdb::counted`].
    pub fn age(&self, now: u32) -> usize {
        let (mut aged, mut left) = (0, 0);
        let aging_ticks = self.aging_ticks();
        for b in self.buckets.iter() {
            for s in &b.slots {
                let v = s.key.load(Ordering::Acquire);
                if v == 0 || v == CLAIMED {
                    continue;
                }
                let seen = s.seen.load(Ordering::Relaxed);
                if v & STATIC == 0 && ticks_since(seen, now) > aging_ticks && self.take(s, v) {
                    aged += 1;
                } else {
                    left += 1;
                }
            }
        }
        self.stats.aged.add(aged as u64);
        self.counted.store(left, Ordering::Relaxed);
        aged
    }

    /// Forgets every learned entry on `port` (port went down or went away).
    pub fn flush_port(&self, port: PortId) {
        self.flush(Flush { port: Some(port), ..Flush::default() });
    }

    /// Every entry, sorted by VLAN and MAC. Allocates for the whole table: for a reload, not
    /// for what a client asks ([`Fdb::page`]).
    pub fn entries(&self, now: u32) -> Vec<Entry> {
        let mut out = Vec::new();
        self.page(0, usize::MAX, usize::MAX, Select::default(), now, &mut out);
        out.sort();
        out
    }

    /// Appends to `out` the entries `select` selects, in table order from slot `from` (0 to
    /// start, then what the last call returned): at most `limit` of them, after looking at
    /// `scan` slots at most, so a call costs the same whether the table is full or the filter
    /// matches nothing. Returns the slot to go on from, `None` once the walk has passed the
    /// table's last slot. Takes no lock and writes nothing, so neither the datapath nor the
    /// edits wait for it. Entries do not move between slots: one that is in the table for the
    /// whole walk is listed exactly once (with the port it has when its slot is read); one
    /// learned, aged or removed meanwhile may be listed or not, and one removed and learned
    /// again into a later slot of its bucket may be listed twice.
    pub fn page(
        &self,
        from: usize,
        limit: usize,
        scan: usize,
        select: Select,
        now: u32,
        out: &mut Vec<Entry>,
    ) -> Option<usize> {
        let end = self.capacity().min(from.saturating_add(scan.max(1)));
        let (mut at, mut found) = (from, 0);
        while at < end && found < limit {
            let s = &self.buckets[at / SLOTS].slots[at % SLOTS];
            at += 1;
            let Some((v, port)) = s.read() else { continue };
            if v == 0 || v == CLAIMED {
                continue;
            }
            let (vlan, mac, is_static) = unpack(v);
            if select.vlan.is_some_and(|x| x != vlan)
                || select.port.is_some_and(|x| x != port)
                || !select.mac.matches(v & MAC_MASK)
            {
                continue;
            }
            let age = if is_static { 0 } else { ticks_since(s.seen.load(Ordering::Relaxed), now) };
            out.push(Entry { vlan, mac, port, age, is_static });
            found += 1;
        }
        (at < self.capacity()).then_some(at)
    }

    /// Number of entries (walks the table: for metrics, not the data path).
    pub fn len(&self) -> usize {
        self.buckets
            .iter()
            .flat_map(|b| &b.slots)
            .filter(|s| !matches!(s.key.load(Ordering::Relaxed), 0 | CLAIMED))
            .count()
    }

    /// Whether the table has no entry (walks it, as [`Fdb::len`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A table of `capacity` with this one's aging time, entries (each with its last-seen
    /// tick), counters and ports' limits: what a reload that changes `fdb.capacity` swaps in.
    /// Static entries go first, and one that does not fit is an error (nothing is swapped in); learned ones
    /// that do not fit a smaller table are dropped stalest first by the usual eviction, counted
    /// in `resize_dropped`.
    pub fn resized(&self, capacity: usize, now: u32) -> Result<Fdb, String> {
        let new = Fdb::new(capacity, self.aging_ticks());
        let mut entries = self.entries(now);
        // Statics first, then stalest first, so the freshest win where buckets overflow.
        entries.sort_by_key(|e| (!e.is_static, std::cmp::Reverse(e.age)));
        for e in entries {
            if e.is_static {
                new.add_static(e.vlan, e.mac, e.port).map_err(|why| {
                    format!("the static entry {} in VLAN {} does not fit a table of {capacity}: {why}", e.mac, e.vlan)
                })?;
            } else if let Learned::Evicted | Learned::Full = new.learn(e.vlan, e.mac, e.port, now.wrapping_sub(e.age)) {
                new.stats.resize_dropped.inc();
            }
        }
        // The ports' limits after their entries: what the old table held, the new one holds
        // (counted anew), even above a limit lowered since.
        for (to, from) in new.ports.iter().zip(self.ports.iter()) {
            to.max.store(from.max.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        new.stats.aged.add(self.stats.aged.get());
        new.stats.resize_dropped.add(self.stats.resize_dropped.get());
        new.counted.store(new.len(), Ordering::Relaxed);
        Ok(new)
    }
}

/// The table the switch uses now, for the threads that are not workers (aging, metrics, API);
/// a reload that changes the capacity puts a [`Fdb::resized`] one here and in every worker.
#[derive(Debug)]
pub struct CurrentFdb {
    table: RwLock<Arc<Fdb>>,
    edits: RwLock<()>,
}

impl CurrentFdb {
    /// Starts with `fdb` as the current table.
    pub fn new(fdb: Arc<Fdb>) -> Self {
        Self { table: RwLock::new(fdb), edits: RwLock::new(()) }
    }

    /// The current table.
    pub fn get(&self) -> Arc<Fdb> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `fdb` the current table (a resize; the workers get it separately).
    pub fn set(&self, fdb: Arc<Fdb>) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = fdb;
    }

    /// Read-held by whatever changes the table's entries from outside the datapath (the API's
    /// edits, which may run together, the table being lock-free; the aging sweep; the flush of
    /// a port whose link went) and write-held by a reload from its check of the static entries
    /// to its new config in place. Otherwise an edit checked against the old VLANs after that
    /// check would leave a static entry outside its port's (refusing every later reload), and
    /// an edit, a sweep or a flush on the old table after a resize copied it would be lost (a
    /// delete would come back, `aged` would go backwards, a gone port's entries would stay).
    /// The lock prefers the writer, so a flood of edits cannot hold a reload off.
    pub fn edits(&self) -> &RwLock<()> {
        &self.edits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// VLAN `v` (a valid VID in every test).
    /// Port `n` (a small number in every test).
    fn port<T: TryInto<u16>>(n: T) -> PortId
    where
        T::Error: std::fmt::Debug,
    {
        PortId(n.try_into().unwrap())
    }

    fn vid(v: u16) -> Vid {
        Vid::new(v).unwrap()
    }

    fn mac(i: u64) -> MacAddr {
        MacAddr::from_u64(0x0200_0000_0000 | i)
    }

    #[test]
    fn a_place_is_a_station_as_its_mac_is() {
        let f = Fdb::new(64, 300);
        let edges = [0, 1, 0x0100_0000_0000, 0x0100_0000_0001, 0xfeff_ffff_ffff, 0xffff_ffff_ffff, 0x0200_0000_0001];
        // Every single bit too: `is_station` rotates the MAC's bits, so each must land right.
        let single = (0..48).map(|b| 1u64 << b);
        let with_group = (0..48).map(|b| 1u64 << b | 0x0100_0000_0000);
        for bits in edges.into_iter().chain(single).chain(with_group) {
            for vlan in [Vid::MIN, 2, Vid::MAX].map(vid) {
                let m = MacAddr::from_u64(bits);
                assert_eq!(f.place(vlan, m).is_station(), m.is_station(), "{m} in VLAN {vlan}");
            }
        }
    }

    #[test]
    fn learn_lookup_move() {
        let f = Fdb::new(1024, 300);
        assert_eq!(f.lookup(vid(1), mac(1)), None);
        assert_eq!(f.learn(vid(1), mac(1), PortId(3), 0), Learned::New);
        assert_eq!(f.learn(vid(1), mac(1), PortId(3), 0), Learned::Known);
        assert_eq!(f.lookup(vid(1), mac(1)), Some(PortId(3)));
        assert_eq!(f.learn(vid(1), mac(1), PortId(0), 1), Learned::Moved);
        assert_eq!(f.lookup(vid(1), mac(1)), Some(PortId(0)));
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn learning_is_per_vlan() {
        let f = Fdb::new(1024, 300);
        assert_eq!(f.learn(vid(10), mac(1), PortId(1), 0), Learned::New);
        assert_eq!(f.learn(vid(20), mac(1), PortId(2), 0), Learned::New, "same MAC, other VLAN: its own entry");
        assert_eq!(f.lookup(vid(10), mac(1)), Some(PortId(1)));
        assert_eq!(f.lookup(vid(20), mac(1)), Some(PortId(2)));
        assert_eq!(f.lookup(vid(30), mac(1)), None);
        let e = f.entries(0);
        assert_eq!((e[0].vlan, e[0].port, e[1].vlan, e[1].port), (vid(10), PortId(1), vid(20), PortId(2)));
    }

    #[test]
    fn aging_forgets_silent_macs_only() {
        let f = Fdb::new(64, 10);
        f.learn(vid(1), mac(1), PortId(1), 0);
        f.learn(vid(1), mac(2), PortId(2), 0);
        f.learn(vid(1), mac(2), PortId(2), 8); // refreshed
        assert_eq!(f.age(11), 1);
        assert_eq!(f.lookup(vid(1), mac(1)), None);
        assert_eq!(f.lookup(vid(1), mac(2)), Some(PortId(2)));
        assert_eq!(f.stats.aged.get(), 1);
        // A longer aging time set on the running table applies to the next sweep.
        f.set_aging_ticks(100);
        assert_eq!(f.age(50), 0);
        assert_eq!(f.lookup(vid(1), mac(2)), Some(PortId(2)));
        f.set_aging_ticks(5);
        assert_eq!(f.age(50), 1);
    }

    #[test]
    fn full_bucket_evicts_stalest_learned_entry_never_a_static_one() {
        let f = Fdb::new(8, 100); // one bucket
        f.add_static(vid(1), mac(50), PortId(4)).unwrap();
        for i in 0..7 {
            f.learn(vid(1), mac(i), PortId(1), 10 + u32::try_from(i).unwrap());
        }
        assert_eq!(f.learn(vid(1), mac(100), PortId(2), 20), Learned::Evicted);
        assert_eq!(f.lookup(vid(1), mac(0)), None, "the stalest learned entry went");
        assert_eq!(f.lookup(vid(1), mac(50)), Some(PortId(4)), "the static one stayed (seen at tick 0)");
        assert_eq!(f.lookup(vid(1), mac(100)), Some(PortId(2)));
        assert_eq!(f.lookup(vid(1), mac(6)), Some(PortId(1)));
    }

    /// Edits from outside the datapath race each other (the API's run together; a reload's run
    /// beside them): two adds of one static address give it one slot, and a remove of its entry
    /// on one port never takes the entry another add just put on another.
    #[test]
    fn racing_static_edits_leave_one_entry_where_the_last_put_it() {
        use std::sync::Barrier;
        const ROUNDS: usize = 30_000;
        let f = Arc::new(Fdb::new(64, 100));
        let start = Arc::new(Barrier::new(3));
        let done = Arc::new(Barrier::new(3));
        let worker = |edit: fn(&Fdb)| {
            let (f, start, done) = (f.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    edit(&f);
                    done.wait();
                }
            })
        };
        let a = worker(|f| {
            f.add_static(vid(1), mac(1), PortId(1)).unwrap();
            let _ = f.remove_static(vid(1), mac(2), PortId(1));
        });
        let b = worker(|f| {
            f.add_static(vid(1), mac(1), PortId(2)).unwrap();
            f.add_static(vid(1), mac(2), PortId(2)).unwrap();
        });
        for round in 0..ROUNDS {
            // Two adds of mac 1; a remove of mac 2 on port 1 beside an add of it on port 2.
            f.add_static(vid(1), mac(2), PortId(1)).unwrap();
            start.wait();
            done.wait();
            let copies = f.entries(0).iter().filter(|e| e.mac == mac(1)).count();
            assert_eq!(copies, 1, "round {round}: mac 1 in {copies} slots");
            assert_eq!(f.lookup(vid(1), mac(2)), Some(PortId(2)), "round {round}: the add on port 2 was undone");
            assert!(f.remove(vid(1), mac(1)) && f.remove(vid(1), mac(2)));
            assert!(f.is_empty(), "round {round}: a copy outlived the remove");
        }
        a.join().unwrap();
        b.join().unwrap();
    }

    /// Each worker keeps its own tick, so a thread on tick N meets entries another worker
    /// refreshed on N + 1. They are the freshest: not aged, not the one evicted, 0 ticks old,
    /// and a worker on N does not move their tick back.
    #[test]
    fn an_entry_seen_on_a_later_tick_than_the_readers_is_the_freshest() {
        let f = Fdb::new(8, 5); // one bucket
        f.learn(vid(1), mac(0), PortId(1), 101);
        assert_eq!(f.age(100), 0, "seen one tick after the sweep's clock: not 136 years old");
        assert_eq!(f.entries(100)[0].age, 0);
        assert_eq!(f.learn(vid(1), mac(0), PortId(1), 100), Learned::Known);
        assert_eq!(f.entries(101)[0].age, 0, "a worker a tick behind does not move the tick back");
        for i in 1..8 {
            f.learn(vid(1), mac(i), PortId(1), 95 + u32::try_from(i).unwrap());
        }
        assert_eq!(f.learn(vid(1), mac(100), PortId(2), 100), Learned::Evicted);
        assert_eq!(f.lookup(vid(1), mac(0)), Some(PortId(1)), "the entry seen on the later tick stays");
        assert_eq!(f.lookup(vid(1), mac(1)), None, "the stalest went");
        assert_eq!(f.age(107), 7, "all but the entry seen on tick 102");
        assert_eq!(f.lookup(vid(1), mac(7)), Some(PortId(1)));
    }

    #[test]
    fn static_entries_do_not_age_move_or_flush_unless_asked() {
        let f = Fdb::new(64, 10);
        f.add_static(vid(10), mac(1), PortId(3)).unwrap();
        assert_eq!(f.learn(vid(10), mac(1), PortId(5), 0), Learned::Known, "learning does not move a static entry");
        assert_eq!(f.lookup(vid(10), mac(1)), Some(PortId(3)));
        assert_eq!(f.age(1000), 0);
        f.learn(vid(10), mac(2), PortId(3), 0);
        f.learn(vid(20), mac(3), PortId(4), 0);
        assert_eq!(f.flush(Flush { port: Some(PortId(3)), ..Flush::default() }), 1, "learned on port 3 only");
        assert_eq!(f.lookup(vid(10), mac(1)), Some(PortId(3)));
        assert_eq!(f.flush(Flush { vlan: Some(vid(20)), ..Flush::default() }), 1);
        assert_eq!(f.flush(Flush { statics: true, ..Flush::default() }), 1);
        assert!(f.is_empty());
        assert_eq!(f.add_static(vid(1), MacAddr::BROADCAST, PortId(1)), Err(StaticError::GroupAddress));
        assert_eq!(
            f.add_static(vid(1), MacAddr([0; 6]), PortId(1)),
            Err(StaticError::GroupAddress),
            "all zeros is no station"
        );
        f.add_static(vid(1), mac(9), PortId(1)).unwrap();
        f.add_static(vid(1), mac(9), PortId(2)).unwrap();
        assert_eq!(f.lookup(vid(1), mac(9)), Some(PortId(2)), "adding again replaces");
        assert!(f.remove(vid(1), mac(9)));
        assert!(!f.remove(vid(1), mac(9)));
    }

    /// MACs whose entries in VLAN 1 fall into bucket `bucket` of `f`, from `from` on.
    fn macs_in_bucket(f: &Fdb, bucket: u32, from: u64) -> impl Iterator<Item = MacAddr> + '_ {
        (from..).map(mac).filter(move |&m| f.place(vid(1), m).parts().1 == bucket)
    }

    #[test]
    fn learning_keeps_room_with_the_statics_at_their_budget() {
        // The table's budget: statics until the table refuses one, then every new address is
        // still learned and found.
        let f = Fdb::new(1024, 300);
        let max = max_statics(1024);
        assert_eq!(max, 512);
        // Twice the table's capacity in adds: the budget refuses every one past it.
        let (mut bucket_full, mut refused) = (0, None);
        for i in 0..2048 {
            match f.add_static(vid(1), mac(i), PortId(1)) {
                Ok(()) => {}
                Err(StaticError::BucketFull) => bucket_full += 1,
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        let refused = refused.expect("the table's budget refused some");
        assert_eq!(refused, StaticError::TableFull { max, capacity: 1024 });
        assert_eq!((f.statics(), f.len()), (max, max));
        assert!(refused.to_string().contains("already holds 512 static entries"), "{refused}");
        // Replacing one (another port) is no new static: allowed at the budget.
        f.add_static(vid(1), mac(0), PortId(2)).unwrap();
        for b in f.buckets.iter() {
            let statics = b.slots.iter().filter(|s| s.key.load(Ordering::Relaxed) & STATIC != 0).count();
            assert!(statics <= MAX_STATICS_PER_BUCKET, "a bucket of {statics} statics");
        }
        for j in 0..2048u64 {
            let m = MacAddr::from_u64(0x0400_0000_0000 + j);
            let r = f.learn(vid(1), m, PortId(3), u32::try_from(j).unwrap());
            assert!(matches!(r, Learned::New | Learned::Evicted), "{m}: {r:?}");
            assert_eq!(f.lookup(vid(1), m), Some(PortId(3)), "{m} learned and found");
        }
        assert_eq!(f.statics(), max, "no static was evicted");
        eprintln!("{bucket_full} statics refused by their bucket on the way to {max}");

        // One bucket's budget: six statics in it, the seventh refused, and stations that hash
        // there are learned and found, each evicting the stalest learned one.
        let f = Fdb::new(1024, 300);
        let mut same = macs_in_bucket(&f, 5, 0);
        for _ in 0..MAX_STATICS_PER_BUCKET {
            f.add_static(vid(1), same.next().unwrap(), PortId(1)).unwrap();
        }
        let seventh = same.next().unwrap();
        let err = f.add_static(vid(1), seventh, PortId(1)).unwrap_err();
        assert_eq!(err, StaticError::BucketFull);
        assert!(err.to_string().contains("already holds 6 static entries"), "{err}");
        assert_eq!(f.lookup(vid(1), seventh), None);
        for (t, m) in std::iter::once(seventh).chain(same.take(10)).enumerate() {
            let r = f.learn(vid(1), m, PortId(2), u32::try_from(t).unwrap());
            assert!(matches!(r, Learned::New | Learned::Evicted), "{m}: {r:?}");
            assert_eq!(f.lookup(vid(1), m), Some(PortId(2)));
        }
        assert_eq!(f.statics(), MAX_STATICS_PER_BUCKET, "the statics stay");
        assert_eq!(f.len(), SLOTS, "two learned entries beside them");

        // The API refuses either way; `statics_fit` (what `check` and a reload ask) agrees.
        assert!(f
            .statics_fit(1024, &[], &[], &[(vid(1), seventh, PortId(1))])
            .unwrap_err()
            .contains("already holds 6"));
        let one = Fdb::new(8, 10);
        for i in 0..4 {
            one.add_static(vid(1), mac(i), PortId(1)).unwrap();
        }
        assert_eq!(one.add_static(vid(1), mac(99), PortId(1)), Err(StaticError::TableFull { max: 4, capacity: 8 }));
        assert_eq!(one.learn(vid(1), mac(99), PortId(1), 0), Learned::New);
    }

    #[test]
    fn a_port_at_its_limit_learns_nothing_new_and_the_count_follows_every_change() {
        let f = Fdb::new(1024, 10);
        f.set_max_learned(PortId(1), 5);
        f.add_static(vid(1), mac(1000), PortId(1)).unwrap();
        let learned: Vec<Learned> = (0..10).map(|i| f.learn(vid(1), mac(i), PortId(1), 0)).collect();
        assert_eq!(&learned[..5], &[Learned::New; 5]);
        assert_eq!(&learned[5..], &[Learned::Limited; 5], "statics do not count");
        assert_eq!((f.learned_on(PortId(1)), f.lookup(vid(1), mac(7))), (5, None));
        assert_eq!(f.learn(vid(1), mac(0), PortId(1), 1), Learned::Known, "a known address is no new one");
        // Another port learns freely; a station of it seen on the full port stays where it is,
        // and is not kept fresh by that port's frames.
        for i in 100..120 {
            assert_eq!(f.learn(vid(1), mac(i), PortId(2), 0), Learned::New);
        }
        assert_eq!(f.learn(vid(1), mac(100), PortId(1), 5), Learned::Limited);
        assert_eq!((f.lookup(vid(1), mac(100)), f.learned_on(PortId(2))), (Some(PortId(2)), 20));
        assert_eq!(f.entries(5).iter().find(|e| e.mac == mac(100)).unwrap().age, 5);
        // A move off the port makes room, a move onto it takes it.
        assert_eq!(f.learn(vid(1), mac(0), PortId(2), 6), Learned::Moved);
        assert_eq!((f.learned_on(PortId(1)), f.learned_on(PortId(2))), (4, 21));
        assert_eq!(f.learn(vid(1), mac(101), PortId(1), 6), Learned::Moved);
        assert_eq!((f.learned_on(PortId(1)), f.learned_on(PortId(2))), (5, 20));
        // Removal, flush and aging give room back; the static one is never counted.
        assert!(f.remove(vid(1), mac(1)));
        assert_eq!(f.learned_on(PortId(1)), 4);
        assert_eq!(f.learn(vid(1), mac(50), PortId(1), 6), Learned::New);
        assert_eq!(f.age(11), 3 + 19, "the entries last seen at 0");
        assert_eq!((f.learned_on(PortId(1)), f.learned_on(PortId(2))), (2, 1), "mac 101 and 50 on 1, mac 0 on 2");
        f.flush_port(PortId(1));
        assert_eq!((f.learned_on(PortId(1)), f.lookup(vid(1), mac(1000))), (0, Some(PortId(1))));
        // A static put over a learned entry, and an eviction, take the count of its port.
        f.learn(vid(1), mac(3), PortId(1), 20);
        f.add_static(vid(1), mac(3), PortId(4)).unwrap();
        assert_eq!(f.learned_on(PortId(1)), 0);
        let one = Fdb::new(8, 100);
        one.set_max_learned(PortId(1), 100);
        for i in 0..8 {
            one.learn(vid(1), mac(i), PortId(1), u32::try_from(i).unwrap());
        }
        assert_eq!(one.learn(vid(1), mac(8), PortId(2), 9), Learned::Evicted);
        assert_eq!((one.learned_on(PortId(1)), one.learned_on(PortId(2))), (7, 1));
        // Lowered below what it has: nothing goes, nothing new comes; raised: room again.
        one.set_max_learned(PortId(1), 3);
        assert_eq!((one.learn(vid(1), mac(20), PortId(1), 9), one.learned_on(PortId(1))), (Learned::Limited, 7));
        one.set_max_learned(PortId(1), 0);
        assert_eq!(one.learn(vid(1), mac(20), PortId(1), 9), Learned::Evicted);
        // A resized table keeps the limit, the count made anew.
        let big = one.resized(1024, 9).unwrap();
        assert_eq!((big.max_learned(PortId(1)), big.learned_on(PortId(1)), big.learned_on(PortId(2))), (0, 7, 1));
        f.set_max_learned(PortId(3), 2);
        let g = f.resized(64, 20).unwrap();
        assert_eq!(g.max_learned(PortId(3)), 2);
    }

    /// Workers learning, moving and evicting at once beside the aging sweep and flushes: each
    /// port's count is exactly its entries at the end, and never over its limit on the way.
    #[test]
    fn the_per_port_counts_stay_exact_under_racing_learns_moves_and_removals() {
        use std::sync::atomic::AtomicBool;
        let f = Arc::new(Fdb::new(256, 2));
        for p in 0..4 {
            f.set_max_learned(PortId(p), 100);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3u64)
            .map(|w| {
                let (f, stop) = (f.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut x = w.wrapping_mul(0x9e37_79b9) | 1;
                    let mut now = 0u32;
                    let mut over = 0;
                    while !stop.load(Ordering::Relaxed) {
                        // xorshift: 600 addresses over 4 ports in 256 slots, so they move and evict.
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let port = port(x % 4);
                        f.learn(vid(1), mac((x >> 8) % 600), port, now);
                        now = (now + u32::from(x.is_multiple_of(3))) % 1000;
                        over += usize::from((0..4).any(|p| f.learned_on(PortId(p)) > 100 + 3));
                    }
                    over
                })
            })
            .collect();
        // For a second (a few hundred thousand learns, moves and evictions on a busy machine).
        let start = std::time::Instant::now();
        let mut round = 0u32;
        while start.elapsed() < std::time::Duration::from_secs(1) {
            f.age(round % 1000);
            if round.is_multiple_of(50) {
                f.flush_port(port(round / 50 % 4));
                let _ = f.remove(vid(1), mac(round as u64 % 600));
            }
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let over: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let entries = f.entries(0);
        for p in 0..4 {
            let n = entries.iter().filter(|e| e.port == PortId(p) && !e.is_static).count();
            assert_eq!(f.learned_on(PortId(p)) as usize, n, "port {p}");
            assert!(n <= 100, "port {p}: {n} learned, the limit is 100");
        }
        assert_eq!(over, 0, "a count above the limit (plus one learn in flight per worker)");
    }

    /// Every page of a listing, each call starting where the last one said.
    fn listing(f: &Fdb, limit: usize, scan: usize, select: Select) -> (Vec<Entry>, usize) {
        let (mut all, mut pages, mut at) = (Vec::new(), 0, Some(0));
        while let Some(from) = at {
            let before = all.len();
            at = f.page(from, limit, scan, select, 0, &mut all);
            assert!(all.len() - before <= limit, "a page holds `limit` entries at most");
            assert!(at.is_none_or(|a| a > from && a - from <= scan), "each page moves on, by `scan` slots at most");
            pages += 1;
        }
        all.sort();
        (all, pages)
    }

    #[test]
    fn pages_list_every_entry_once_whatever_the_limit() {
        let f = Fdb::new(1024, 300);
        for i in 0..700u64 {
            f.learn(vid((i % 3) as u16 + 1), mac(i), port(i % 5), 0);
        }
        f.add_static(vid(7), mac(5000), PortId(2)).unwrap();
        let all = f.entries(0);
        for limit in [1, 7, 8, 9, 100, 10_000] {
            let (listed, pages) = listing(&f, limit, usize::MAX, Select::default());
            assert_eq!(listed, all, "limit {limit}");
            assert!(pages >= all.len().div_ceil(limit), "limit {limit}: {pages} pages");
        }
        // The scan bound cuts pages short, never loses an entry.
        let (listed, pages) = listing(&f, 10_000, 64, Select::default());
        assert_eq!((listed, pages), (all, f.capacity() / 64));
    }

    #[test]
    fn a_page_looks_at_scan_slots_at_most_even_when_nothing_matches() {
        let f = Fdb::new(4096, 300);
        for i in 0..2000u64 {
            f.learn(vid(1), mac(i), PortId(1), 0);
        }
        let nothing = Select { vlan: Some(vid(99)), ..Select::default() };
        let mut out = Vec::new();
        assert_eq!(f.page(0, 10, 512, nothing, 0, &mut out), Some(512), "an empty page and where to go on");
        assert_eq!(f.page(512, 10, 512, nothing, 0, &mut out), Some(1024));
        assert_eq!(f.page(f.capacity() - 100, 10, 512, nothing, 0, &mut out), None, "the table's end");
        assert!(out.is_empty());
        // A full page stops where its last entry was, and the next goes on from there.
        let mut first = Vec::new();
        let next = f.page(0, 10, usize::MAX, Select::default(), 0, &mut first).unwrap();
        assert_eq!(first.len(), 10);
        let mut second = Vec::new();
        f.page(next, 10, usize::MAX, Select::default(), 0, &mut second);
        assert!(second.iter().all(|e| !first.contains(e)));
        // A position past the end (no page returns one) lists nothing and ends the walk.
        assert_eq!(f.page(f.capacity() + 5, 10, 512, Select::default(), 0, &mut out), None);
        assert!(out.is_empty());
    }

    #[test]
    fn pages_select_by_port_vlan_and_mac_prefix() {
        let f = Fdb::new(4096, 300);
        for i in 0..256u64 {
            f.learn(vid(10 + (i % 2) as u16), MacAddr::from_u64(0x0200_5e00_0000 | i << 8 | i), port(i % 4), 0);
            f.learn(vid(10), MacAddr::from_u64(0x0a00_0000_0000 | i), PortId(9), 0);
        }
        let all = f.entries(0);
        let select = |s: Select| listing(&f, 50, 100, s).0;
        let by = |keep: &dyn Fn(&Entry) -> bool| all.iter().copied().filter(|e| keep(e)).collect::<Vec<_>>();
        assert_eq!(select(Select { port: Some(PortId(3)), ..Select::default() }), by(&|e| e.port == PortId(3)));
        assert_eq!(select(Select { vlan: Some(vid(11)), ..Select::default() }), by(&|e| e.vlan == vid(11)));
        let p = |s: &str| s.parse::<MacPrefix>().unwrap();
        assert_eq!(select(Select { mac: p("0a"), ..Select::default() }), by(&|e| e.mac.0[0] == 0x0a));
        assert_eq!(select(Select { mac: p("02:00:5e:00:07"), ..Select::default() }).len(), 1);
        assert_eq!(select(Select { mac: p("02:00:5e:00:07:07"), ..Select::default() })[0].mac.0[5], 7);
        let three = Select { port: Some(PortId(1)), vlan: Some(vid(11)), mac: p("2:0:5e") };
        let want = by(&|e| e.port == PortId(1) && e.vlan == vid(11) && e.mac.0[..3] == [2, 0, 0x5e]);
        assert!(!want.is_empty());
        assert_eq!(select(three), want, "every condition holds");
    }

    #[test]
    fn mac_prefixes_parse_one_to_six_bytes_or_say_why_not() {
        let p = |s: &str| s.parse::<MacPrefix>();
        assert!(p("02").unwrap().matches(0x02ab_cdef_0123) && !p("02").unwrap().matches(0x03ab_cdef_0123));
        assert!(p("02:ab:cd:ef:01:23").unwrap().matches(0x02ab_cdef_0123));
        assert!(!p("02:ab:cd:ef:01:24").unwrap().matches(0x02ab_cdef_0123));
        for bad in ["", "02:", ":02", "0x2", "+2", "002", "02:ab:cd:ef:01:23:45", "zz", "02-ab"] {
            let err = p(bad).expect_err(bad);
            assert!(err.contains("is not a MAC prefix") && err.contains("1 to 6 hex bytes"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_sweep_counts_what_it_leaves_and_each_table_has_its_own_id() {
        let f = Fdb::new(1024, 10);
        assert_eq!(f.counted(), 0, "no sweep yet");
        for i in 0..50u64 {
            f.learn(vid(1), mac(i), PortId(1), if i < 20 { 0 } else { 15 });
        }
        f.add_static(vid(1), mac(999), PortId(1)).unwrap();
        assert_eq!(f.age(20), 20);
        assert_eq!(f.counted(), 31, "30 learned entries left and a static one");
        let big = f.resized(4096, 20).unwrap();
        assert_eq!(big.counted(), 31, "a resized table starts with its copy counted");
        assert!(f.id() != big.id() && f.id() != Fdb::new(1024, 10).id());
    }

    #[test]
    fn port_zero_and_mac_zero_are_valid() {
        let f = Fdb::new(64, 10);
        f.learn(vid(1), MacAddr([0; 6]), PortId(0), 0);
        assert_eq!(f.lookup(vid(1), MacAddr([0; 6])), Some(PortId(0)));
    }

    #[test]
    fn concurrent_learning_is_consistent() {
        let f = std::sync::Arc::new(Fdb::new(65536, 100));
        let hs: Vec<_> = (0..2)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        f.learn(vid(1), mac(i * 2 + t), port(t), 0);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        for i in 0..4000u64 {
            assert_eq!(f.lookup(vid(1), mac(i)), Some(port(i % 2)));
        }
    }

    #[test]
    fn lookups_never_pair_a_key_with_another_entrys_port() {
        // One bucket, a writer cycling MACs through it (evictions), readers checking that each
        // MAC is only ever found on its own port.
        let f = std::sync::Arc::new(Fdb::new(8, 1000));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (f, stop) = (f.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut t = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..32u64 {
                        t += 1;
                        f.learn(vid(1), mac(i), port(i % 60), t);
                    }
                }
            })
        };
        for _ in 0..200_000 {
            for i in 0..32u64 {
                if let Some(p) = f.lookup(vid(1), mac(i)) {
                    assert_eq!(p, port(i % 60));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }

    #[test]
    fn a_move_never_lands_on_the_entry_that_took_the_slot_since() {
        // One bucket. A mover flips M between ports 1 and 2 while the main thread removes M and
        // learns X (on 5) in the slot M just left: X must never be found on the mover's port.
        let f = std::sync::Arc::new(Fdb::new(8, 300));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, x) = (mac(1), mac(2));
        let mover = {
            let (f, stop) = (f.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut p = 1;
                while !stop.load(Ordering::Relaxed) {
                    f.learn(vid(1), m, PortId(p), 0);
                    p = 3 - p;
                }
            })
        };
        let mut wrong = 0;
        for _ in 0..300_000 {
            f.remove(vid(1), m);
            f.learn(vid(1), x, PortId(5), 0);
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            if !matches!(f.lookup(vid(1), x), Some(PortId(5)) | None) {
                wrong += 1;
            }
            f.remove(vid(1), x);
        }
        stop.store(true, Ordering::Relaxed);
        mover.join().unwrap();
        assert_eq!(wrong, 0, "X was found on the port of the MAC that moved");
    }

    #[test]
    fn two_workers_learning_one_new_address_leave_one_entry() {
        // Two threads learn the same new address into a half-full bucket at once: it must end
        // in one slot at most (never evicting a live entry for a second copy), and a remove must
        // take it out of the table.
        use std::sync::{Arc, Barrier};
        let f = Arc::new(Fdb::new(8, 300));
        let k = mac(0xaa);
        let rounds = 20_000;
        let (go, done) = (Arc::new(Barrier::new(3)), Arc::new(Barrier::new(3)));
        let workers: Vec<_> = (1..=2u16)
            .map(|p| {
                let (f, go, done) = (f.clone(), go.clone(), done.clone());
                std::thread::spawn(move || {
                    for _ in 0..rounds {
                        go.wait();
                        f.learn(vid(1), k, PortId(p), 7);
                        done.wait();
                    }
                })
            })
            .collect();
        let (mut doubled, mut evicted, mut left) = (0, 0, 0);
        for _ in 0..rounds {
            f.flush(Flush { statics: true, ..Flush::default() });
            for i in 1..=4 {
                f.learn(vid(1), mac(0x100 + i), PortId(9), 7);
            }
            go.wait();
            done.wait();
            let e = f.entries(7);
            doubled += usize::from(e.iter().filter(|x| x.mac == k).count() > 1);
            evicted += usize::from(e.iter().filter(|x| x.mac != k).count() < 4);
            f.remove(vid(1), k);
            left += usize::from(f.lookup(vid(1), k).is_some());
        }
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(
            (doubled, evicted, left),
            (0, 0, 0),
            "(rounds with two copies, with an entry evicted, still found after remove)"
        );
    }

    #[test]
    fn a_static_entry_added_while_the_address_is_learned_is_the_only_entry() {
        // A worker learns an address at the instant the control plane makes it static, just as
        // another entry leaves the bucket: the two writers then see different first empty slots.
        // The static entry must end up the only one, so every lookup takes its port. The two
        // threads start each round by spinning on one counter, so their steps overlap.
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let f = Arc::new(Fdb::new(8, 300));
        let (k, other) = (mac(0xaa), mac(0xbb));
        let rounds = 100_000;
        let (go, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let worker = {
            let (f, go, done) = (f.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                for r in 1..=rounds {
                    while go.load(Ordering::Acquire) != r {
                        std::hint::spin_loop();
                    }
                    f.remove(vid(1), other);
                    f.learn(vid(1), k, PortId(2), 7);
                    done.store(r, Ordering::Release);
                }
            })
        };
        let (mut doubled, mut wrong_port) = (0, 0);
        for r in 1..=rounds {
            f.flush(Flush { statics: true, ..Flush::default() });
            f.learn(vid(1), other, PortId(3), 7);
            go.store(r, Ordering::Release);
            f.add_static(vid(1), k, PortId(5)).unwrap();
            while done.load(Ordering::Acquire) != r {
                std::hint::spin_loop();
            }
            doubled += usize::from(f.entries(7).iter().filter(|x| x.mac == k).count() != 1);
            wrong_port += usize::from(f.lookup(vid(1), k) != Some(PortId(5)));
        }
        worker.join().unwrap();
        assert_eq!(
            (doubled, wrong_port),
            (0, 0),
            "(rounds with other than one entry, with a lookup not on the static port)"
        );
    }

    #[test]
    fn a_resized_table_keeps_entries_ages_and_counters() {
        let old = Fdb::new(64, 300);
        for i in 0..40u64 {
            old.learn(vid(1), MacAddr::from_u64(0x0200_0000_0000 + i), port(i % 3), u32::try_from(i).unwrap());
        }
        old.add_static(vid(7), mac(1000), PortId(2)).unwrap();
        old.stats.aged.add(7);
        let big = old.resized(4096, 100).unwrap();
        assert_eq!(big.entries(100), old.entries(100));
        assert_eq!(big.stats.aged.get(), 7);
        assert_eq!(big.aging_ticks(), 300);
        let small = old.resized(8, 100).unwrap();
        assert!(small.len() <= small.capacity() && !small.is_empty());
        // What did not fit is counted, and the count carries over to the next table.
        assert_eq!(usize::try_from(small.stats.resize_dropped.get()).unwrap(), old.len() - small.len());
        assert_eq!(small.resized(4096, 100).unwrap().stats.resize_dropped.get(), small.stats.resize_dropped.get());
        assert_eq!(small.lookup(vid(7), mac(1000)), Some(PortId(2)), "static entries go first");
        // What was kept is what the old table said.
        for e in small.entries(100) {
            assert!(old.entries(100).contains(&e));
        }
        // Static entries are never dropped to fit: more of them than a table holds is an error.
        for i in 0..20u64 {
            old.add_static(vid(3), mac(2000 + i), PortId(1)).unwrap();
        }
        let err = old.resized(8, 100).map(|_| ()).expect_err("21 static entries do not fit a table of 8");
        assert!(err.contains("does not fit a table of 8"), "{err}");
    }

    #[test]
    fn statics_fit_agrees_with_adding_them() {
        let f = Fdb::new(64, 300);
        // Statics until one does not fit: statics_fit says so for that one, and not before.
        let mut added = Vec::new();
        let full = (0..1000u64)
            .find(|&i| {
                let fits = f.statics_fit(64, &[], &[], &[(vid(1), mac(i), PortId(0))]).is_ok();
                assert_eq!(fits, f.add_static(vid(1), mac(i), PortId(0)).is_ok(), "entry {i}");
                if fits {
                    added.push((vid(1), mac(i), PortId(0)));
                }
                !fits
            })
            .expect("a 64-entry table fills up");
        let err = f.statics_fit(64, &[], &[], &[(vid(1), mac(full), PortId(1))]).unwrap_err();
        assert!(err.contains("does not fit a table of 64"), "{err}");
        // Room made by a removal, or by a larger table; a group address never fits.
        assert!(
            f.statics_fit(64, &added, &[], &[(vid(1), mac(full), PortId(1))]).is_ok(),
            "every other static removed"
        );
        assert!(f.statics_fit(4096, &[], &[], &[(vid(1), mac(full), PortId(1))]).is_ok());
        assert!(f.statics_fit(4096, &[], &[], &[(vid(1), MacAddr::BROADCAST, PortId(1))]).is_err());
        // The statics of a port that goes away make room too (they go with it).
        assert!(f.statics_fit(64, &[], &[PortId(0)], &[(vid(1), mac(full), PortId(1))]).is_ok(), "port 0 removed");
        assert!(
            f.statics_fit(64, &[], &[PortId(1)], &[(vid(1), mac(full), PortId(1))]).is_err(),
            "another port removed"
        );
        // Fewer slots than statics.
        assert!(f.statics_fit(8, &[], &[], &[]).unwrap_err().contains("does not fit a table of 8"));
    }

    #[test]
    fn remove_static_takes_only_the_static_entry_on_that_port() {
        let f = Fdb::new(64, 300);
        f.add_static(vid(1), mac(1), PortId(2)).unwrap();
        f.learn(vid(1), mac(2), PortId(2), 0);
        assert!(!f.remove_static(vid(1), mac(1), PortId(3)), "on another port");
        assert!(!f.remove_static(vid(1), mac(2), PortId(2)), "learned, not static");
        assert_eq!((f.lookup(vid(1), mac(1)), f.lookup(vid(1), mac(2))), (Some(PortId(2)), Some(PortId(2))));
        assert!(f.remove_static(vid(1), mac(1), PortId(2)));
        assert_eq!(f.lookup(vid(1), mac(1)), None);
    }
}
