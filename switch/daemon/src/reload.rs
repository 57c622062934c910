//! A reload: the config file read again, compared with the running one, and applied or refused
//! as a whole.
//!
//! It runs in three steps, each its own function: *plan* (what the file changes, refused by
//! name if any of it needs a restart, which ports go, come and are reopened, the config's static
//! FDB entries), *prepare* (plugins compiled, ports opened: an error here changes nothing), and
//! *apply* (the workers take every change together between two rounds; from there only a
//! worker that does not answer in time can go wrong, and the change is then applied late).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use wasmswitch_core::vlan::{Vid, VlanSet};
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::PortId;

use crate::api::{ChangeError, ReloadResult};
use crate::config::diff::{Change, Plan};
use crate::config::l2::StaticEntry;
use crate::config::{Config, Mode, PortSection, WorkerSection};
use crate::daemon::Switch;
use crate::dataplane::{storm_share, umem_group_of, AddPort, Command, PortChanges};
use crate::error_text::ErrorText;
use crate::plugins::{Role, RunningSet, Smoke, Stages};

/// How every refusal begins: the running config stays as it was.
const UNCHANGED: &str = "reload refused, nothing was changed";

/// A static FDB entry of the config: VLAN, MAC, port name.
type StaticKey = (Vid, MacAddr, String);

/// Which ports a reload takes out, puts in and reopens, and the id each port of the new config
/// runs under (running ports keep theirs, added ones get the lowest free ids).
struct PortPlan {
    /// Ids of the running ports the new file no longer names.
    removed: Vec<PortId>,
    /// Indices in the new file of the ports it adds.
    added: Vec<usize>,
    /// Indices in the new file of the ports that stay but need new queues.
    replaced: Vec<usize>,
    ids: HashMap<String, PortId>,
}

impl PortPlan {
    fn id_of(&self, name: &str) -> Option<PortId> {
        self.ids.get(name).copied()
    }

    fn opened(&self, j: usize) -> bool {
        self.added.contains(&j) || self.replaced.contains(&j)
    }
}

/// The config's static FDB entries across a reload, and the API's they meet.
struct StaticsPlan {
    /// In the old file, not in the new.
    gone: Vec<StaticKey>,
    /// To add: new in the file, or still in it but deleted from the table (restored).
    adding: Vec<StaticKey>,
    restored: Vec<StaticKey>,
    /// New in the file, already in the table on the same port through the API.
    adopted: Vec<StaticKey>,
}

fn named(c: &Config, name: &str) -> Option<usize> {
    c.ports.iter().position(|p| p.name.value == name)
}

impl Switch {
    /// Re-reads the config file and applies it, or refuses it and changes nothing.
    ///
    /// Applied live (see [`crate::config::diff::applies_live`]): ports added and removed
    /// (matched by name; an AF_XDP port's sockets are opened before anything changes and a
    /// removed one's closed once every worker has let go of it), a sim port's settings (its
    /// queues replaced), `mtu`, the plugin chains (always recompiled from their files, which
    /// may have changed even when the config did not; a plugin that stays on its port
    /// keeps its counters and is let out of quarantine), `workers[].idle`, `switch.batch` (every
    /// live plugin first passes the smoke run at the new size), `fdb.capacity` (a new table with
    /// the learned entries copied in) and `fdb.aging_seconds`.
    /// Workers take every change of one reload together between two rounds, so the ports it
    /// does not touch lose no frame. Any other changed key refuses the whole reload, naming
    /// each such key with its place in the file; the running config stays.
    ///
    /// Slow (compiles plugins, opens sockets): call it from the control thread, never from an
    /// HTTP handler.
    pub fn reload(&self) -> ReloadResult {
        match self.reload_change().map_err(ChangeError::Refused)? {
            (summary, None) => Ok(summary),
            (summary, Some(late)) => Err(ChangeError::AppliedLate(format!("{late}; {summary}"))),
        }
    }

    /// [`Switch::reload`]: `Err` when refused (nothing changed); the summary of what was
    /// applied, and why it was late if it was.
    fn reload_change(&self) -> Result<(String, Option<String>), String> {
        let new = Config::load(&self.path).map_err(|e| format!("{UNCHANGED}: {e}"))?;
        let old = self.config();
        let Plan { live, mut restart } = crate::config::diff::plan(&old, &new);
        // A port's `umem:` written out as the group it is already in changes nothing.
        restart.retain(|c| !self.same_umem_group(c, &new));
        if !restart.is_empty() {
            let keys: Vec<String> = restart.iter().map(|c| c.to_string()).collect();
            return Err(format!(
                "{UNCHANGED}: {} changed key(s) take effect only at a restart: {}",
                restart.len(),
                keys.join("; ")
            ));
        }
        let dp = &self.dataplane;
        let refuse = |e: anyhow::Error| format!("{UNCHANGED}: {}", ErrorText(&e));
        let ports = self.port_plan(&old, &new)?;
        let id_of = |n: &str| ports.id_of(n);
        // Plugins compiled and ports opened before anything changes: an error here leaves
        // everything as it was (opened ports are closed again when dropped).
        // The running plugins' counters: a plugin that stays (same port and name) keeps
        // counting into them, so /metrics never sees a counter go backwards.
        let running = self.plugin_metrics.get();
        let batch_changed = old.switch.batch.value != new.switch.batch.value;
        let smoke = if batch_changed { Smoke::All } else { Smoke::Changed };
        let (stages, next) = crate::plugins::stages(&new, &id_of, &running, smoke).map_err(refuse)?;
        // From here to the end the datapath changes: a stop waits for it, or refuses it.
        let _changing = dp.begin_change().map_err(refuse)?;
        let mut changes = PortChanges::default();
        for &j in ports.added.iter().chain(&ports.replaced) {
            let port = dp.open_port(&new, j, &id_of).map_err(refuse)?;
            let id = id_of(&new.ports[j].name.value).expect("every port of the new config has an id");
            let fresh = ports.added.contains(&j);
            if !fresh {
                changes.remove.push(id);
            }
            changes.add.push(AddPort { id, port, fresh, stages: Vec::new() });
        }
        changes.remove.extend(&ports.removed);
        // No API edit or aging of the table from here to the new config in place (see
        // `CurrentFdb::edits`).
        let no_edits = dp.fdb.edits().write().unwrap_or_else(|e| e.into_inner());
        let statics = self.statics_plan(&old, &new, &ports)?;
        // From here on nothing can fail but a worker that does not answer.
        let mut applied = Vec::new();
        let mut extra = worker_commands(&old, &new, stages, &mut changes, batch_changed, &mut applied);
        self.mtu_commands(&old, &new, &ports, &mut extra, &mut applied);
        for p in old.ports.iter().filter(|p| named(&new, &p.name.value).is_none()) {
            applied.push(format!("port `{}` removed", p.name.value));
        }
        for &j in &ports.added {
            applied.push(format!("port `{}` added", new.ports[j].name.value));
        }
        for &j in &ports.replaced {
            applied.push(format!("port `{}` reopened with its new settings", new.ports[j].name.value));
        }
        let relearn = self.l2_commands(&old, &new, &ports, &mut extra, &mut applied);
        // The port ids of the old config's statics, before a removed port's id goes.
        let gone_ids: Vec<_> = statics.gone.iter().map(|e| dp.ports.id_of(&e.2)).collect();
        let mut late = dp.change_ports(changes, extra);
        for (id, kept) in relearn {
            dp.fdb.get().flush_port_outside(id, &kept);
        }
        // Removals, the new capacity, additions: the order `statics_fit` counted in.
        self.remove_statics(&statics, &gone_ids, &ports, &mut applied);
        if old.fdb.capacity.value != new.fdb.capacity.value {
            let dropped = || dp.fdb.get().stats.resize_dropped.get();
            let before = dropped();
            late = late.and(dp.resize_fdb(new.fdb.capacity.value, &no_edits));
            let fdb = dp.fdb.get();
            let lost = match dropped() - before {
                0 => "every entry copied over".to_string(),
                n => format!("{n} learned entries it had no room for dropped, the stalest"),
            };
            applied.push(format!(
                "fdb.capacity = {} (a table of {} entries, {} in it; {lost})",
                new.fdb.capacity.value,
                fdb.capacity(),
                fdb.len()
            ));
        }
        late = late.and(self.add_statics(&statics, &ports, &mut applied));
        self.set_max_macs(&old, &new, &ports, &mut applied);
        plugin_lines(&old, &new, &next, &running, &mut applied);
        self.plugin_metrics.replace(next);
        self.other_changes(&old, &new, &ports, batch_changed, &mut applied);
        let changed: Vec<String> = live.iter().map(|c| c.to_string()).collect();
        let note = renumbered_note(&new, &ports);
        self.dataplane.set_config(Arc::new(new));
        drop(no_edits);
        let summary = format!(
            "applied: {}; changed keys: {}; everything else unchanged{note}",
            if applied.is_empty() { "nothing (no plugins, no change)".to_string() } else { applied.join("; ") },
            if changed.is_empty() { "none".to_string() } else { changed.join("; ") },
        );
        Ok((summary, late.err().map(|e| ErrorText(&e).to_string())))
    }

    /// True when `c` is a change of `ports[j].umem` that leaves running port `j` in the UMEM
    /// group it is in (its default written out, or the reverse).
    fn same_umem_group(&self, c: &Change, new: &Config) -> bool {
        let Some(j) = c.key.strip_prefix("ports[").and_then(|r| r.strip_suffix("].umem")) else { return false };
        let Some(port) = j.parse::<usize>().ok().and_then(|j| new.ports.get(j)) else { return false };
        let dp = &self.dataplane;
        dp.ports
            .id_of(&port.name.value)
            .and_then(|id| dp.ports.get(id))
            .is_some_and(|running| running.umem == umem_group_of(port))
    }

    /// Ports, matched by name: removed, added (new ids), replaced (same id, new queues); refused
    /// where the new file cannot be run without a restart.
    fn port_plan(&self, old: &Config, new: &Config) -> Result<PortPlan, String> {
        let dp = &self.dataplane;
        let removed: Vec<PortId> = old
            .ports
            .iter()
            .filter(|p| named(new, &p.name.value).is_none())
            .filter_map(|p| dp.ports.id_of(&p.name.value))
            .collect();
        let added: Vec<usize> =
            (0..new.ports.len()).filter(|&j| named(old, &new.ports[j].name.value).is_none()).collect();
        // A renamed port is one removed and one added, and a reload opens the new before it
        // closes the old: on one interface that meets the old port's XDP program.
        let interface = |p: &PortSection| p.afxdp.as_ref().map(|a| a.value.interface.value.clone());
        for &j in &added {
            let Some(i) = interface(&new.ports[j]) else { continue };
            let leaving =
                old.ports.iter().find(|p| named(new, &p.name.value).is_none() && interface(p) == Some(i.clone()));
            if let Some(gone) = leaving {
                return Err(format!(
                    "{UNCHANGED}: port `{}` on {i} takes the place of port `{}` there, and a reload opens new ports before it closes old ones: remove `{}` in one reload and add `{}` in the next, or restart",
                    new.ports[j].name.value, gone.name.value, gone.name.value, new.ports[j].name.value
                ));
            }
        }
        let replaced: Vec<usize> = (0..new.ports.len())
            .filter(|&j| {
                named(old, &new.ports[j].name.value).is_some_and(|i| needs_new_queues(&old.ports[i], &new.ports[j]))
            })
            .collect();
        let mut ids: HashMap<String, PortId> = dp
            .ports
            .snapshot()
            .into_iter()
            .filter(|(id, _)| !removed.contains(id))
            .map(|(id, p)| (p.name.clone(), id))
            .collect();
        let free = dp.free_ids(&removed, added.len()).map_err(|e| format!("{UNCHANGED}: {}", ErrorText(&e)))?;
        for (&j, id) in added.iter().zip(free) {
            ids.insert(new.ports[j].name.value.clone(), id);
        }
        let plan = PortPlan { removed, added, replaced, ids };
        check_cross_pairs(new, &plan)?;
        Ok(plan)
    }

    /// The config's static FDB entries: the ones no longer there go, new ones come. Whether
    /// they fit (at the new capacity, the API's entries included) and stay inside their ports'
    /// VLANs is asked now, so that one that does not refuses the reload before anything
    /// changes.
    fn statics_plan(&self, old: &Config, new: &Config, ports: &PortPlan) -> Result<StaticsPlan, String> {
        let dp = &self.dataplane;
        // Checked at load: every VLAN of the file's statics is a VID.
        let key = |e: &StaticEntry| Some((Vid::new(e.vlan.value)?, e.mac.value.0, e.port.value.clone()));
        let (was, now): (Vec<StaticKey>, Vec<StaticKey>) =
            (old.fdb.statics.iter().filter_map(key).collect(), new.fdb.statics.iter().filter_map(key).collect());
        let gone: Vec<StaticKey> = was.iter().filter(|e| !now.contains(e)).cloned().collect();
        let fresh: Vec<StaticKey> = now.iter().filter(|e| !was.contains(e)).cloned().collect();
        // The table's static entries, the file's and the API's, by (VLAN, MAC).
        let statics_now: Vec<_> = dp.fdb.get().entries(0).into_iter().filter(|e| e.is_static).collect();
        let in_table = |v: Vid, m: MacAddr| statics_now.iter().find(|e| (e.vlan, e.mac) == (v, m));
        let port_in_table = |v: Vid, m: MacAddr| dp.ports.get(in_table(v, m)?.port).map(|i| i.name.clone());
        // The file's statics follow the file: one the file still has but the table lost (an
        // API delete or flush took it) comes back. One the API put on another port stays there.
        let restored: Vec<StaticKey> =
            now.iter().filter(|e| was.contains(e) && in_table(e.0, e.1).is_none()).cloned().collect();
        // A new one for an address the API has put on another port would replace that entry
        // unseen: refused by name. The old file's own entry leaving now (a move) is no conflict.
        for (v, m, p) in &fresh {
            let (Some(e), Some(there)) = (in_table(*v, *m), port_in_table(*v, *m)) else { continue };
            let leaving =
                ports.removed.contains(&e.port) || gone.iter().any(|g| (g.0, g.1) == (*v, *m) && g.2 == there);
            if there != *p && !leaving {
                return Err(format!(
                    "{UNCHANGED}: fdb.static {m} in VLAN {v} on `{p}`: the table has a static entry for it on `{there}`, added through the API; delete it first (`wasmswitch fdb del {m} --vlan {v}`)"
                ));
            }
        }
        // New ones the API had already put on the same port: the file's from now on.
        let adopted: Vec<StaticKey> =
            fresh.iter().filter(|(v, m, p)| port_in_table(*v, *m).as_ref() == Some(p)).cloned().collect();
        let adding: Vec<StaticKey> = fresh.iter().chain(&restored).cloned().collect();
        if !adding.is_empty() || old.fdb.capacity.value != new.fdb.capacity.value {
            let ids = |list: &[StaticKey], of: &dyn Fn(&str) -> Option<PortId>| {
                list.iter().filter_map(|(v, m, p)| Some((*v, *m, of(p)?))).collect::<Vec<_>>()
            };
            let (remove, add) = (ids(&gone, &|p| dp.ports.id_of(p)), ids(&adding, &|p| ports.id_of(p)));
            dp.fdb
                .get()
                .statics_fit(new.fdb.capacity.value, &remove, &ports.removed, &add)
                .map_err(|e| format!("{UNCHANGED}: fdb.static: {e}"))?;
        }
        // Every static entry that stays (the API's too) must stay inside its port's VLANs: one
        // the new VLAN settings would leave outside (a black hole: never moved, never aged)
        // refuses the reload by name. The config's own are checked with the file.
        let id_of = |n: &str| ports.id_of(n);
        for e in dp.fdb.get().entries(0).into_iter().filter(|e| e.is_static && !ports.removed.contains(&e.port)) {
            let Some(info) = dp.ports.get(e.port) else { continue };
            let left = gone.iter().any(|(v, m, p)| (*v, *m) == (e.vlan, e.mac) && *p == info.name);
            if !left && !new.port_l2(&info.name, 1, &id_of).vlan.members.contains(e.vlan.get()) {
                return Err(format!(
                    "{UNCHANGED}: fdb: the static entry {} in VLAN {} on `{}` would be outside the port's VLANs; delete it first (`wasmswitch fdb del {} --vlan {}`)",
                    e.mac, e.vlan, info.name, e.mac, e.vlan
                ));
            }
        }
        Ok(StaticsPlan { gone, adding, restored, adopted })
    }

    /// A changed `mtu` of a port that keeps its queues: every worker gets its new frame limits.
    fn mtu_commands(
        &self,
        old: &Config,
        new: &Config,
        ports: &PortPlan,
        extra: &mut [Vec<Command>],
        applied: &mut Vec<String>,
    ) {
        for (j, port) in new.ports.iter().enumerate() {
            let Some(i) = named(old, &port.name.value) else { continue };
            if old.ports[i].mtu.value != port.mtu.value && !ports.replaced.contains(&j) {
                let id = ports.id_of(&port.name.value).expect("a running port has an id");
                let mtu = port.mtu.value;
                let veth = self.dataplane.ports.get(id).is_some_and(|i| i.driver.afxdp().is_some_and(|a| a.veth));
                let (max, tx_max) = (crate::drivers::max_frame(mtu), crate::drivers::max_tx_frame(mtu, veth));
                for cmds in extra.iter_mut() {
                    cmds.push(Command::SetMaxFrame(id, max, tx_max));
                }
                applied.push(format!("port `{}`: mtu {}", port.name.value, port.mtu.value));
            }
        }
    }

    /// VLANs, storm limits and mirrors of the ports that stay (added and reopened ones got
    /// theirs when opened): every worker gets the new settings of each port they changed for.
    /// Returns the ports that left VLANs, with the VLANs they keep: their learned entries in
    /// the others go once the workers have the new settings (as the bridge flushes a port's
    /// entries of a VLAN it leaves); until they aged out, they would send frames for those
    /// hosts nowhere.
    fn l2_commands(
        &self,
        old: &Config,
        new: &Config,
        ports: &PortPlan,
        extra: &mut [Vec<Command>],
        applied: &mut Vec<String>,
    ) -> Vec<(PortId, VlanSet)> {
        let dp = &self.dataplane;
        let old_id_of = |n: &str| dp.ports.id_of(n);
        let id_of = |n: &str| ports.id_of(n);
        let mut relearn = Vec::new();
        for name in new.ports.iter().map(|p| &p.name.value).chain(new.host.as_ref().map(|h| &h.name.value)) {
            if named(new, name).is_some_and(|j| ports.opened(j)) {
                continue;
            }
            let Some((id, info)) = id_of(name).and_then(|id| Some((id, dp.ports.get(id)?))) else { continue };
            let (a, b) = (
                old.port_l2(name, storm_share(&info, old), &old_id_of),
                new.port_l2(name, storm_share(&info, new), &id_of),
            );
            if a == b {
                continue;
            }
            for cmds in extra.iter_mut() {
                cmds.push(Command::SetL2(id, b.clone()));
            }
            // Only the VLANs it left: its entries in those it keeps still hold (a PVID change
            // or an added VLAN flushes nothing, as on the bridge).
            let left = a.vlan.members.iter().filter(|v| !b.vlan.members.contains(v.get())).count();
            if left > 0 {
                relearn.push((id, b.vlan.members.clone()));
            }
            // A mirror's destination carries no VLAN: becoming one is leaving them all.
            let why = if !a.mirror_destination && b.mirror_destination {
                "flushed: it became a mirror's destination".to_string()
            } else if left == 1 {
                "in the VLAN it left flushed".to_string()
            } else {
                format!("in the {left} VLANs it left flushed")
            };
            applied.push(format!(
                "port `{name}`: VLANs, storm control and mirrors as configured{}",
                if left > 0 { format!(" (its learned FDB entries {why})") } else { String::new() }
            ));
        }
        relearn
    }

    /// The old file's static entries that left it. Only the config's own entry goes: an API
    /// entry for the same address on another port stays (a removed port's entries went with
    /// it). `ids` are their ports' ids from before the workers let go of removed ports.
    fn remove_statics(
        &self,
        statics: &StaticsPlan,
        ids: &[Option<PortId>],
        ports: &PortPlan,
        applied: &mut Vec<String>,
    ) {
        for ((vlan, mac, port), id) in statics.gone.iter().zip(ids) {
            let Some(id) = *id else { continue };
            let what = if ports.removed.contains(&id) {
                "removed with its port"
            } else if self.dataplane.fdb.get().remove_static(*vlan, *mac, id) {
                "removed"
            } else {
                "left the config (the table no longer had it there)"
            };
            applied.push(format!("fdb.static {mac} in VLAN {vlan} on `{port}` {what}"));
        }
    }

    /// The new file's static entries, into the table now in use. An error only where the
    /// table changed since `statics_fit` (an API edit meanwhile): the reload is then late.
    fn add_statics(&self, statics: &StaticsPlan, ports: &PortPlan, applied: &mut Vec<String>) -> anyhow::Result<()> {
        let fdb = self.dataplane.fdb.get();
        let mut late = Ok(());
        for entry @ (vlan, mac, port) in &statics.adding {
            let r = ports
                .id_of(port)
                .context("no such port")
                .and_then(|id| fdb.add_static(*vlan, *mac, id).map_err(|e| anyhow::anyhow!("{e}")));
            let how = if statics.restored.contains(entry) {
                "restored (it had been deleted from the table)"
            } else if statics.adopted.contains(entry) {
                "added (the API's entry there, now the file's)"
            } else {
                "added"
            };
            match r {
                Ok(()) => applied.push(format!("fdb.static {mac} in VLAN {vlan} on `{port}` {how}")),
                Err(e) => late = late.and(Err(e.context(format!("fdb.static {mac} in VLAN {vlan} was not added")))),
            }
        }
        late
    }

    /// Each port's limit on learned entries, on the table now in use (a resize copied the old
    /// limits): a removed port's id goes back to none, before an added port may take it.
    fn set_max_macs(&self, old: &Config, new: &Config, ports: &PortPlan, applied: &mut Vec<String>) {
        let fdb = self.dataplane.fdb.get();
        for &id in &ports.removed {
            fdb.set_max_learned(id, 0);
        }
        for port in &new.ports {
            let name = &port.name.value;
            let Some(id) = ports.id_of(name) else { continue };
            let max = new.max_macs(name);
            fdb.set_max_learned(id, max);
            if named(old, name).is_some() && old.max_macs(name) != max {
                applied.push(match max {
                    0 => format!("port `{name}`: fdb.max_macs off (no limit on its learned entries)"),
                    n => format!(
                        "port `{name}`: fdb.max_macs = {n} (it has {} learned entries; those above the limit stay until they age)",
                        fdb.learned_on(id)
                    ),
                });
            }
        }
    }

    /// The keys the switch applies in place: `workers[].idle`, `switch.batch`,
    /// `fdb.aging_seconds`, a sim generator's rate, the control API's token.
    fn other_changes(
        &self,
        old: &Config,
        new: &Config,
        ports: &PortPlan,
        batch_changed: bool,
        applied: &mut Vec<String>,
    ) {
        let dp = &self.dataplane;
        for (w, (a, b)) in old.workers.iter().zip(&new.workers).enumerate() {
            if a.idle.value != b.idle.value {
                applied.push(format!("workers[{w}].idle = {:?}", b.idle.value).to_lowercase());
            }
        }
        if batch_changed {
            applied.push(format!(
                "switch.batch = {} (every live plugin passed the smoke run at that size)",
                new.switch.batch.value
            ));
        }
        if old.fdb.aging_seconds.value != new.fdb.aging_seconds.value {
            // The FDB's ticks are seconds (the workers' clock is start.elapsed() in seconds).
            dp.fdb.get().set_aging_ticks(new.fdb.aging_seconds.value);
            applied.push(format!("fdb.aging_seconds = {}", new.fdb.aging_seconds.value));
        }
        for (j, b) in new.ports.iter().enumerate() {
            let Some(a) = named(old, &b.name.value).map(|i| &old.ports[i]) else { continue };
            if ports.replaced.contains(&j) {
                continue;
            }
            // Only rate to rate gets here (anything else replaces the port's queues).
            if let (Some(r0), Some(r1)) = (rate(a), rate(b)) {
                if r0 != r1 {
                    let info = ports.id_of(&b.name.value).and_then(|id| dp.ports.get(id));
                    for h in info.iter().filter_map(|i| i.driver.sim()).flat_map(|s| &s.rates) {
                        h.store(r1, Ordering::Relaxed);
                    }
                    applied.push(format!("port `{}`: sim traffic rate_pps = {r1}", b.name.value));
                }
            }
        }
        // The token file is re-read at every reload, so its path need not change for this.
        let token = |c: &Config| c.control.token.as_ref().map(|t| t.as_bytes().to_vec());
        if token(old) != token(new) {
            applied.push(match new.control.token {
                Some(_) => "control API token: the one now in the token file".to_string(),
                None => "control API token: none".to_string(),
            });
        }
    }
}

/// `cross` pairs ports by id (0↔1, 2↔3, …), which at a start is their place in the file. Ids
/// stay with their ports across reloads, so a reload that would pair them otherwise than the
/// file does (ports reordered, or one removed before others) is refused.
fn check_cross_pairs(new: &Config, ports: &PortPlan) -> Result<(), String> {
    if new.switch.mode != Mode::Cross {
        return Ok(());
    }
    let name_of = |id: PortId| new.ports.iter().find(|p| ports.id_of(&p.name.value) == Some(id)).map(|p| &p.name.value);
    for (j, p) in new.ports.iter().enumerate() {
        let id = ports.id_of(&p.name.value).expect("every port of the new config has an id");
        let in_file = new.ports.get(j ^ 1).map(|q| &q.name.value);
        let running = name_of(PortId(id.0 ^ 1));
        if in_file != running {
            let said = |n: Option<&String>| n.map_or("no port".to_string(), |n| format!("`{n}`"));
            return Err(format!(
                "{UNCHANGED}: switch.mode cross pairs ports by their place in the file (0↔1, 2↔3, …): port `{}` pairs with {} in the file but would run paired with {} (ports keep their numbers across reloads); this order needs a restart",
                p.name.value,
                said(in_file),
                said(running)
            ));
        }
    }
    Ok(())
}

/// Each worker's commands besides the port changes: the plugin stages of ports that stay (an
/// added or reopened port carries its own in `changes`), a new batch size, idle mode and CPU.
fn worker_commands(
    old: &Config,
    new: &Config,
    mut stages: Stages,
    changes: &mut PortChanges,
    batch_changed: bool,
    applied: &mut Vec<String>,
) -> Vec<Vec<Command>> {
    let mut extra = Vec::new();
    for (w, worker_stages) in stages.iter_mut().enumerate() {
        let mut cmds = Vec::new();
        for (id, stage) in worker_stages.drain(..) {
            match changes.add.iter_mut().find(|a| a.id == id) {
                Some(a) => {
                    a.stages.resize_with(w + 1, || None);
                    a.stages[w] = stage;
                }
                None => cmds.push(Command::SetIngress(id, stage)),
            }
        }
        if batch_changed {
            cmds.push(Command::SetBatch(new.switch.batch.value));
        }
        if let (Some(a), Some(b)) = (old.workers.get(w), new.workers.get(w)) {
            if a.idle.value != b.idle.value {
                cmds.push(Command::SetIdle(b.idle.value));
            }
            let cpu = |x: &WorkerSection| x.cpu.as_ref().map(|c| c.value);
            if cpu(a) != cpu(b) {
                cmds.push(Command::Pin(cpu(b)));
                applied.push(match cpu(b) {
                    Some(c) => format!("workers[{w}] pinned to cpu {c}"),
                    None => format!("workers[{w}] unpinned"),
                });
            }
        }
        extra.push(cmds);
    }
    extra
}

/// One line per port whose chains are or were configured: the plugins it now runs, live and
/// in shadow, and which of them kept their state.
fn plugin_lines(old: &Config, new: &Config, next: &RunningSet, running: &RunningSet, applied: &mut Vec<String>) {
    for port in &new.ports {
        let name = &port.name.value;
        let before = named(old, name).map(|i| &old.ports[i]);
        if port.plugins.is_empty()
            && port.shadow.is_empty()
            && before.is_none_or(|b| b.plugins.is_empty() && b.shadow.is_empty())
        {
            continue;
        }
        // Worker 0 stands for all: every worker gets the same chains.
        let list = |role: Role| {
            let l: Vec<String> = next
                .plugins
                .iter()
                .filter(|r| &r.port == name && r.role == role && r.worker == 0)
                .map(|r| format!("{}{}", r.name(), if running.keeps(r) { " kept with its state" } else { "" }))
                .collect();
            if l.is_empty() {
                "none".to_string()
            } else {
                l.join(", ")
            }
        };
        let shadow = if port.shadow.is_empty() && before.is_none_or(|b| b.shadow.is_empty()) {
            String::new()
        } else {
            format!("; shadow: {}", list(Role::Shadow))
        };
        applied.push(format!("plugins of port `{name}` reloaded from their files ({}{shadow})", list(Role::Live)));
    }
}

/// Plugins see ports by id (`in-port`, `redirect`). A start numbers them by their place in the
/// file; a reload keeps running ports' ids and gives added ports the lowest free ones. Where
/// the two part, the same file would number ports otherwise after a restart: said in the
/// answer and the log, since plugin configs naming port ids are affected.
fn renumbered_note(new: &Config, ports: &PortPlan) -> String {
    let renumbered: Vec<String> = new
        .ports
        .iter()
        .enumerate()
        .filter_map(|(j, p)| {
            let id = ports.id_of(&p.name.value).filter(|&id| id.index() != j)?;
            Some(format!("`{}` runs as {id}, a restart numbers it {j}", p.name.value))
        })
        .collect();
    if renumbered.is_empty() || new.ports.iter().all(|p| p.plugins.is_empty() && p.shadow.is_empty()) {
        return String::new();
    }
    let note = format!(
        "; note: plugins see ports by id, and the file's order no longer gives the running ids: {}; \
         port ids in plugin configs follow the running ids until a restart",
        renumbered.join(", ")
    );
    log::warn!("reload{note}");
    note
}

/// A sim port's generator rate, when it has a rate-limited one.
fn rate(p: &PortSection) -> Option<u64> {
    p.sim.as_ref().and_then(|s| s.value.traffic.as_ref()).and_then(|t| t.rate_pps.as_ref()).map(|r| r.value)
}

/// True when a port that stays (same name) needs its queues replaced: anything but its plugins,
/// its mtu and a rate-to-rate change of its generator differs.
fn needs_new_queues(a: &PortSection, b: &PortSection) -> bool {
    let strip = |p: &PortSection| {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("plugins");
            o.remove("shadow");
            o.remove("mtu");
            // Applied to the running slots (`Command::SetL2`).
            o.remove("vlan");
            o.remove("storm");
            // Applied to the table (`Fdb::set_max_learned`).
            o.remove("fdb");
            // A change of UMEM group is a restart key, refused before this; what is left is the
            // group a port is already in written out (or the reverse), which changes nothing.
            // Reopened, an AF_XDP port would find its own XDP program on the interface.
            o.remove("umem");
        }
        if rate(p).is_some() {
            if let Some(r) = v.pointer_mut("/sim/traffic/rate_pps") {
                *r = serde_json::Value::Null;
            }
        }
        v
    };
    let same_pacing = rate(a).is_some() == rate(b).is_some();
    strip(a) != strip(b) || !same_pacing
}
