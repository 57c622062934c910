//! Per-plugin, per-worker counters, read by the daemon's metrics collector.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use wasmswitch_core::counter::{Counter, Gauge};

use crate::text::one_line;

/// Most named counters one plugin instance may register (the SDK enforces the same limit).
pub const MAX_NAMED: usize = 64;

/// Why a batch call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultReason {
    /// The guest trapped (panic, unreachable, out-of-bounds access, ...).
    Trap,
    /// The call used more than the plugin's deadline of CPU time (epoch interruption).
    Deadline,
    /// The guest asked for memory beyond its limit and then trapped.
    Memory,
    /// The guest returned verdicts of the wrong length or with an unknown kind.
    BadOutput,
    /// A fresh instance could not be created after an earlier fault (or its init failed).
    Instantiate,
}

impl FaultReason {
    /// Every reason, in declaration order.
    pub const ALL: [FaultReason; 5] = [
        FaultReason::Trap,
        FaultReason::Deadline,
        FaultReason::Memory,
        FaultReason::BadOutput,
        FaultReason::Instantiate,
    ];

    /// Label value for metrics (`reason="..."`).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultReason::Trap => "trap",
            FaultReason::Deadline => "deadline",
            FaultReason::Memory => "memory",
            FaultReason::BadOutput => "bad_output",
            FaultReason::Instantiate => "instantiate",
        }
    }
}

/// Counters of one plugin on one worker. Every field is written by that worker only
/// (single-writer [`Counter`]s); any thread may read them. Sum across workers at scrape time.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Batch calls attempted (including ones answered by the on-error policy).
    pub batches: Counter,
    /// Packets in those batches.
    pub packets: Counter,
    /// Packets given `Pass`, by the plugin or by the on-error policy.
    pub verdict_pass: Counter,
    /// Packets given `Drop`, by the plugin or by the on-error policy.
    pub verdict_drop: Counter,
    /// Packets the plugin redirected to a port.
    pub verdict_redirect: Counter,
    /// Packets the plugin sent to the host.
    pub verdict_host: Counter,
    /// Packets the plugin forwarded and copied to the host.
    pub verdict_host_copy: Counter,
    /// Faults of [`FaultReason::Trap`].
    pub faults_trap: Counter,
    /// Faults of [`FaultReason::Deadline`].
    pub faults_deadline: Counter,
    /// Faults of [`FaultReason::Memory`].
    pub faults_memory: Counter,
    /// Faults of [`FaultReason::BadOutput`].
    pub faults_bad_output: Counter,
    /// Faults of [`FaultReason::Instantiate`].
    pub faults_instantiate: Counter,
    /// Packets whose verdict came from the on-error policy (fault or quarantine).
    pub policy_packets: Counter,
    /// 1 while the plugin is quarantined on this worker.
    pub quarantined: Gauge,
    /// Fresh instances created after faults.
    pub reinstantiations: Counter,
    /// Log lines dropped by the rate limiter.
    pub log_suppressed: Counter,
    /// Quarantines lifted by a reload (the counters carry over; see
    /// `PluginFactory::instantiate_with_stats`).
    pub quarantine_lifted: Counter,
    /// TSC cycles spent in batch calls (encode + call + decode).
    pub call_cycles: Counter,
    /// Calls whose wall time passed twice their deadline (see `stage::CPU_WATCH_CALLS`).
    pub wall_overruns: Counter,
    /// Frames dropped because the plugin was shown their IP header but not their ports
    /// (`codec::ports_unseen`).
    pub ports_unseen: Counter,
    /// The plugin's own counters.
    pub named: NamedCounters,
}

impl PluginStats {
    /// The fault counter of reason `r`.
    pub fn faults(&self, r: FaultReason) -> &Counter {
        match r {
            FaultReason::Trap => &self.faults_trap,
            FaultReason::Deadline => &self.faults_deadline,
            FaultReason::Memory => &self.faults_memory,
            FaultReason::BadOutput => &self.faults_bad_output,
            FaultReason::Instantiate => &self.faults_instantiate,
        }
    }

    /// All faults, any reason.
    pub fn faults_total(&self) -> u64 {
        FaultReason::ALL.iter().map(|r| self.faults(*r).get()).sum()
    }

    /// Adds `other`'s totals to these counters (what an instance counted in staging; see
    /// [`PluginStats::absorb_staged`]). The owning worker only.
    pub fn absorb(&self, other: &PluginStats) {
        let pairs = [
            (&self.batches, &other.batches),
            (&self.packets, &other.packets),
            (&self.verdict_pass, &other.verdict_pass),
            (&self.verdict_drop, &other.verdict_drop),
            (&self.verdict_redirect, &other.verdict_redirect),
            (&self.verdict_host, &other.verdict_host),
            (&self.verdict_host_copy, &other.verdict_host_copy),
            (&self.faults_trap, &other.faults_trap),
            (&self.faults_deadline, &other.faults_deadline),
            (&self.faults_memory, &other.faults_memory),
            (&self.faults_bad_output, &other.faults_bad_output),
            (&self.faults_instantiate, &other.faults_instantiate),
            (&self.policy_packets, &other.policy_packets),
            (&self.reinstantiations, &other.reinstantiations),
            (&self.log_suppressed, &other.log_suppressed),
            (&self.quarantine_lifted, &other.quarantine_lifted),
            (&self.call_cycles, &other.call_cycles),
            (&self.wall_overruns, &other.wall_overruns),
            (&self.ports_unseen, &other.ports_unseen),
        ];
        for (a, b) in pairs {
            a.add(b.get());
        }
        for (name, v) in other.named.snapshot() {
            if let Ok(id) = self.named.register(&name) {
                self.named.add(id, v);
            }
        }
    }

    /// Fresh counters for a new instance of a plugin that is to count into these ones once
    /// installed (a reload's changed version): its `init` registers and counts there, off the
    /// worker, so a reload refused after it leaves these untouched. They start empty, not with
    /// these names: the new version gets room for its own [`MAX_NAMED`] names whatever the
    /// earlier versions registered (see [`PluginStats::absorb_staged`]).
    pub fn staging(&self) -> PluginStats {
        PluginStats::default()
    }

    /// Takes what an instance counted into [`PluginStats::staging`] before its install (the
    /// owning worker only, at the install, when it replaces the stage that counted here). The
    /// names it did not register end here ([`NamedCounters::retain`]), so their series leave
    /// `/metrics` and their room goes to the new version's names. The instance goes on with
    /// the ids it was given there: `None` when each is the same here, else its id → the id here
    /// (`u32::MAX`, which no counter has, for a name there was no room for).
    pub fn absorb_staged(&self, staged: &PluginStats) -> Option<Vec<u32>> {
        let names = staged.named.names();
        self.named.retain(&names);
        self.absorb(staged);
        let ids = names.iter().map(|name| self.named.register(name).unwrap_or(u32::MAX)).collect();
        id_map(ids)
    }
}

/// `ids` (an instance's counter ids → its stats' ids) as an instance keeps them: `None` when
/// each is the same.
pub(crate) fn id_map(ids: Vec<u32>) -> Option<Vec<u32>> {
    let same = ids.iter().enumerate().all(|(i, &id)| id as usize == i);
    (!same).then_some(ids)
}

/// Counter `id` of an instance as its stats number it: `ids` maps an instance's ids (`None`:
/// the same; see [`PluginStats::absorb_staged`]).
#[inline]
pub(crate) fn counter_id(ids: Option<&[u32]>, id: u32) -> u32 {
    match ids {
        None => id,
        Some(ids) => ids.get(id as usize).copied().unwrap_or(u32::MAX),
    }
}

/// Named counters a plugin registered (`register-counter`). The data path adds by id without
/// a lock; the name table is locked only when a name is registered (in `init`) and when the
/// metrics collector reads it.
#[derive(Debug)]
pub struct NamedCounters {
    /// By id; an empty name is a slot freed by [`NamedCounters::retain`], for the next name.
    names: Mutex<Vec<String>>,
    /// How many names are registered: an id at or past it names no counter.
    registered: AtomicUsize,
    values: Box<[Counter]>,
}

impl Default for NamedCounters {
    fn default() -> Self {
        Self {
            names: Mutex::new(Vec::new()),
            registered: AtomicUsize::new(0),
            values: (0..MAX_NAMED).map(|_| Counter::default()).collect(),
        }
    }
}

impl NamedCounters {
    /// Id for `name`, registering it if new.
    pub fn register(&self, name: &str) -> Result<u32, String> {
        if name.is_empty()
            || name.len() > 64
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            let shown = one_line(name, 80);
            return Err(format!("bad counter name {shown:?}: use 1 to 64 characters from [a-z0-9_]"));
        }
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = names.iter().position(|n| n == name) {
            return Ok(i as u32);
        }
        if let Some(i) = names.iter().position(String::is_empty) {
            // Zeroed when freed, and no instance holds its id since.
            names[i] = name.to_owned();
            return Ok(i as u32);
        }
        if names.len() >= MAX_NAMED {
            return Err(format!("too many counters (at most {MAX_NAMED})"));
        }
        names.push(name.to_owned());
        self.registered.store(names.len(), Ordering::Release);
        Ok(names.len() as u32 - 1)
    }

    /// Adds to counter `id` (the owning worker only). Unknown ids are ignored, also those below
    /// the limit that no name has yet: a delta parked there would show up in the series of the
    /// name registered there later. Saturating: a plugin's delta is whatever it says, and a
    /// wrapping sum would read as the counter going backwards (a reset, to Prometheus).
    #[inline]
    pub fn add(&self, id: u32, delta: u64) {
        let registered = &self.values[..self.registered.load(Ordering::Acquire)];
        if let Some(c) = registered.get(id as usize) {
            c.add_saturating(delta);
        }
    }

    /// Frees the slots of every name not in `keep`, zeroed, for later names (the owning worker
    /// only, when a stage that registered just `keep` takes these counters over from the one
    /// that counted here, which is gone then). A version that drops or renames a counter ends
    /// its series, and versions that rename counters never run out of the [`MAX_NAMED`] slots.
    pub fn retain(&self, keep: &[String]) {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for (i, n) in names.iter_mut().enumerate() {
            if !n.is_empty() && !keep.contains(n) {
                n.clear();
                self.values[i].reset();
            }
        }
    }

    /// Every registered name, by id (an empty one for a freed slot).
    pub fn names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `(name, value)` of every registered counter.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let named = names.iter().enumerate().filter(|(_, n)| !n.is_empty());
        named.map(|(i, n)| (n.clone(), self.values[i].get())).collect()
    }

    /// Value of the named counter, if registered.
    pub fn get(&self, name: &str) -> Option<u64> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.iter().position(|n| n == name).map(|i| self.values[i].get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_counter_saturates_instead_of_going_backwards() {
        let n = NamedCounters::default();
        let id = n.register("w").unwrap();
        n.add(id, 1 << 63);
        n.add(id, 1 << 63);
        assert_eq!(n.get("w"), Some(u64::MAX), "a wrapping sum would read 0");
        n.add(id, 5);
        assert_eq!(n.get("w"), Some(u64::MAX));
        n.add(99, 1);
        assert_eq!(n.snapshot(), vec![("w".to_string(), u64::MAX)], "an unknown id is ignored");
    }

    #[test]
    fn a_new_version_takes_over_with_room_for_its_own_names() {
        let running = PluginStats::default();
        for i in 0..MAX_NAMED {
            let id = running.named.register(&format!("old_{i}")).unwrap();
            running.named.add(id, 7);
        }
        assert!(running.named.register("one_more").is_err(), "full");
        // The next version keeps `old_3` and adds two names of its own.
        let staged = running.staging();
        let (a, b, c) = (
            staged.named.register("new_a").unwrap(),
            staged.named.register("old_3").unwrap(),
            staged.named.register("new_b").unwrap(),
        );
        assert_eq!((a, b, c), (0, 1, 2), "the staging is the new version's own");
        staged.named.add(b, 1);
        staged.named.add(a, 5);
        let ids = running.absorb_staged(&staged).expect("mapped: old_3 keeps its slot");
        assert!(ids.iter().all(|&id| id != u32::MAX), "every new name found room: {ids:?}");
        let mut now = running.named.snapshot();
        now.sort();
        let want = [("new_a", 5), ("new_b", 0), ("old_3", 8)];
        assert_eq!(now, want.map(|(n, v)| (n.to_string(), v)).to_vec(), "old names gone, old_3 goes on");
        // A freed slot starts at 0 for its new name.
        running.named.add(ids[2], 2);
        assert_eq!(running.named.get("new_b"), Some(2));
    }

    #[test]
    fn a_delta_to_an_unregistered_id_is_not_kept_for_a_later_name() {
        let n = NamedCounters::default();
        n.register("a").unwrap();
        n.add(1, 1000);
        let b = n.register("b").unwrap();
        assert_eq!(b, 1);
        n.add(b, 3);
        assert_eq!(n.get("b"), Some(3), "b starts at 0, not at what was sent to its id before");
    }
}
