//! What a reload would change: every key whose effective value differs between the running
//! config and the new file, located in the new file, and split into what can be applied live
//! and what needs a restart.
//!
//! Effective values are compared (the typed config serialized to JSON, defaults filled in),
//! so writing out a default is not a change; locations come from a second, untyped parse of
//! the new text that keeps each value's position.

use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use serde_saphyr::{Location, Spanned};

use super::Config;
use crate::drivers::afxdp::config as afxdp;
use crate::drivers::sim::config as sim;

/// One changed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `pool.cache`, `ports[0].plugins[1].config`, `workers` (the list's length changed), ...
    pub key: String,
    /// The value in the running config (JSON, `null` when absent).
    pub old: String,
    /// The value in the new file (JSON, `null` when absent).
    pub new: String,
    /// `file:line:col` of the key's value in the new file (or of its nearest enclosing
    /// section when the key is no longer written there).
    pub at: String,
}

impl Change {
    /// For a port added or removed as a whole: its name and whether it was added.
    pub fn whole_port(&self) -> Option<(String, bool)> {
        let rest = self.key.strip_prefix("ports[")?;
        if !rest.ends_with(']') || rest.contains('.') {
            return None;
        }
        let added = self.old == "null";
        let v: Value = serde_json::from_str(if added { &self.new } else { &self.old }).ok()?;
        Some((v.get("name")?.as_str()?.to_string(), added))
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.whole_port() {
            Some((name, added)) => {
                write!(f, "{}: {} (port `{name}` {})", self.at, self.key, if added { "added" } else { "removed" })
            }
            None => {
                let (old, new) = excerpts(&self.old, &self.new);
                write!(f, "{}: {} ({old} -> {new})", self.at, self.key)
            }
        }
    }
}

/// `old` and `new` short enough for one line, each cut to where they differ (with a little of
/// what they share around it, `...` where something was left out), so that the change shows
/// even in a long value.
fn excerpts(old: &str, new: &str) -> (String, String) {
    const CONTEXT: usize = 12;
    const MAX: usize = 40;
    let (a, b): (Vec<char>, Vec<char>) = (old.chars().collect(), new.chars().collect());
    if a.len() <= MAX && b.len() <= MAX {
        return (old.to_string(), new.to_string());
    }
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let rest = a.len().min(b.len()) - prefix;
    let suffix = a.iter().rev().zip(b.iter().rev()).take(rest).take_while(|(x, y)| x == y).count();
    let start = prefix.saturating_sub(CONTEXT);
    let cut = |s: &[char]| {
        let end = (s.len() - suffix + CONTEXT).min(s.len()).min(start + MAX);
        let mut out = String::new();
        if start > 0 {
            out.push_str("...");
        }
        out.extend(&s[start..end]);
        if end < s.len() {
            out.push_str("...");
        }
        out
    };
    (cut(&a), cut(&b))
}

/// A reload, planned.
#[derive(Debug, Default)]
pub struct Plan {
    /// Changes applied without a restart (see [`applies_live`]).
    pub live: Vec<Change>,
    /// Changes that need a restart; any of them refuses the whole reload.
    pub restart: Vec<Change>,
}

/// True for changes a running switch applies on reload:
/// - the plugin chains, `workers[i].idle` and `.cpu`, `fdb.capacity` and `fdb.aging_seconds`;
/// - `control.token_file` (the API reads the token of the running config; the file is re-read
///   at every reload, so a reload also picks up a token rewritten in place);
/// - a port added or removed (ports are matched by name), unless it is a sim port with
///   generated traffic (the other generators' destinations are fixed when they start);
/// - a port's `mtu`;
/// - the L2 keys ([`is_l2`]): VLANs, storm control, mirrors, static FDB entries and a port's
///   limit on learned ones;
/// - a sim port's `sim` settings (the port's queues are replaced; its counters carry on), except
///   giving it traffic or taking its traffic away (that changes the others' destinations).
pub fn applies_live(c: &Change) -> bool {
    let key = c.key.as_str();
    if key == "fdb.aging_seconds"
        || key == "fdb.capacity"
        || key == "control.token_file"
        || key == "switch.batch"
        || is_l2(key)
    {
        return true;
    }
    let Some(rest) = key.strip_prefix("ports[").and_then(|r| r.split_once(']')).map(|(_, r)| r) else {
        return key
            .strip_prefix("workers[")
            .and_then(|r| r.split_once(']'))
            .is_some_and(|(_, r)| r == ".idle" || r == ".cpu");
    };
    if rest.is_empty() {
        let side = if c.old == "null" { &c.new } else { &c.old };
        let Ok(port) = serde_json::from_str::<Value>(side) else { return false };
        return match port.get("driver").and_then(Value::as_str) {
            Some("afxdp") => afxdp::port_change_live(&port),
            Some("sim") => sim::port_change_live(&port),
            _ => false,
        };
    }
    // A driver's own section: its module says which of its keys apply live.
    if let Some(key) = rest.strip_prefix(".sim") {
        return sim::key_change_live(key, &c.old, &c.new);
    }
    if let Some(key) = rest.strip_prefix(".afxdp") {
        return afxdp::key_change_live(key, &c.old, &c.new);
    }
    rest == ".mtu"
        || [".plugins", ".shadow"]
            .iter()
            .any(|k| rest.strip_prefix(k).is_some_and(|r| r.is_empty() || r.starts_with('[') || r.starts_with('.')))
}

/// True for the L2 keys (see `config::l2`), all applied live: a port's `vlan`, `storm` and
/// `fdb` (`max_macs`), the host port's `vlan`, `mirrors`, `fdb.static`.
pub fn is_l2(key: &str) -> bool {
    let under = |k: &str, section: &str| {
        k.strip_prefix(section).is_some_and(|r| r.is_empty() || r.starts_with('.') || r.starts_with('['))
    };
    if under(key, "mirrors") || under(key, "fdb.static") || under(key, "host.vlan") {
        return true;
    }
    key.strip_prefix("ports[")
        .and_then(|r| r.split_once(']'))
        .is_some_and(|(_, r)| under(r, ".vlan") || under(r, ".storm") || under(r, ".fdb"))
}

/// Compares `old` (running) with `new` (just loaded from `new.file`).
pub fn plan(old: &Config, new: &Config) -> Plan {
    let mut a = serde_json::to_value(old).unwrap_or(Value::Null);
    let mut b = serde_json::to_value(new).unwrap_or(Value::Null);
    let mut keys = Vec::new();
    // Ports are matched by name, so reordering them is no change and adding one changes no
    // other port's keys; a removed port is located at `ports` in the new file.
    let pa = a.as_object_mut().and_then(|o| o.remove("ports"));
    let pb = b.as_object_mut().and_then(|o| o.remove("ports"));
    let (mut pa, mut pb) = match (pa, pb) {
        (Some(Value::Array(x)), Some(Value::Array(y))) => (x, y),
        _ => (Vec::new(), Vec::new()),
    };
    // A `vlan:` left out is an access port of VLAN 1: written out, it is no change.
    let default = default_vlan();
    for section in
        pa.iter_mut().chain(pb.iter_mut()).chain([a.get_mut("host"), b.get_mut("host")].into_iter().flatten())
    {
        if let Some(v) = section.get_mut("vlan").filter(|v| v.is_null()) {
            *v = default.clone();
        }
    }
    let name = |v: &Value| v.get("name").cloned().unwrap_or(Value::Null);
    for (j, q) in pb.iter().enumerate() {
        match pa.iter().find(|p| name(p) == name(q)) {
            Some(p) => walk(p, q, format!("ports[{j}]"), &mut keys),
            None => keys.push((format!("ports[{j}]"), "null".to_string(), q.to_string())),
        }
    }
    let mut removed = Vec::new();
    for (i, p) in pa.iter().enumerate() {
        if !pb.iter().any(|q| name(p) == name(q)) {
            removed.push((format!("ports[{i}]"), p.to_string(), "null".to_string()));
        }
    }
    walk(&a, &b, String::new(), &mut keys);
    let tree: Option<Spanned<Node>> = serde_saphyr::from_str(&new.source).ok();
    let mut plan = Plan::default();
    let located = keys.into_iter().map(|k| (k.0.clone(), k)).chain(removed.into_iter().map(|k| ("ports".into(), k)));
    for (place, (key, o, n)) in located {
        let loc = tree.as_ref().map(|t| locate(t, &place)).unwrap_or(Location::UNKNOWN);
        let at = if loc == Location::UNKNOWN {
            new.file.display().to_string()
        } else {
            format!("{}:{}:{}", new.file.display(), loc.line(), loc.column())
        };
        let change = Change { old: o, new: n, at, key };
        if applies_live(&change) {
            plan.live.push(change);
        } else {
            plan.restart.push(change);
        }
    }
    plan
}

/// A port's (or the host port's) `vlan:` when the file leaves it out, as the typed config
/// serializes it: an access port of [`Vid::DEFAULT`](wasmswitch_core::vlan::Vid::DEFAULT).
fn default_vlan() -> Value {
    let text = format!("{{mode: access, vid: {}}}", wasmswitch_core::vlan::Vid::DEFAULT.get());
    serde_saphyr::from_str::<super::l2::VlanSection>(&text)
        .ok()
        .and_then(|v| serde_json::to_value(v).ok())
        .unwrap_or(Value::Null)
}

fn join(prefix: &str, k: &str) -> String {
    if prefix.is_empty() {
        k.to_string()
    } else {
        format!("{prefix}.{k}")
    }
}

fn walk(a: &Value, b: &Value, path: String, out: &mut Vec<(String, String, String)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))).collect();
            keys.dedup();
            for k in keys {
                let null = Value::Null;
                walk(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), join(&path, k), out);
            }
        }
        // Same length: compare item by item, so a change names the item. Otherwise the list.
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                walk(p, q, format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push((path, a.to_string(), b.to_string())),
        _ => {}
    }
}

/// The position of `key`'s value in the file, or of the deepest enclosing node written there.
fn locate(root: &Spanned<Node>, key: &str) -> Location {
    let mut node = root;
    let mut best = Location::UNKNOWN;
    for part in key.split('.') {
        let (name, indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let Node::Map(entries) = &node.value else { return best };
        let Some((_, child)) = entries.iter().find(|(k, _)| k == name) else { return best };
        node = child;
        best = node.referenced;
        for idx in indices.split(['[', ']']).filter(|s| !s.is_empty()) {
            let Ok(i) = idx.parse::<usize>() else { return best };
            let Node::Seq(items) = &node.value else { return best };
            let Some(item) = items.get(i) else { return best };
            node = item;
            best = node.referenced;
        }
    }
    best
}

/// An untyped YAML tree that keeps each value's location.
#[derive(Debug)]
enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(String, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

macro_rules! scalar {
    ($($f:ident: $t:ty),*) => {$(
        fn $f<E: serde::de::Error>(self, _: $t) -> Result<Node, E> {
            Ok(Node::Scalar)
        }
    )*};
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    scalar!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str, visit_i128: i128, visit_u128: u128);

    fn visit_unit<E: serde::de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(x) = seq.next_element::<Spanned<Node>>()? {
            items.push(x);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<KeyString>()? {
            entries.push((k.0, map.next_value::<Spanned<Node>>()?));
        }
        Ok(Node::Map(entries))
    }
}

/// A map key of any scalar type, as text.
struct KeyString(String);

impl<'de> Deserialize<'de> for KeyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod excerpt_tests {
    use super::excerpts;

    #[test]
    fn a_change_deep_in_a_long_value_shows() {
        let old = r#""default allow\ndeny proto=udp dport=5001\ndeny proto=tcp dport=22""#;
        let new = r#""default allow\ndeny proto=udp dport=5002\ndeny proto=tcp dport=22""#;
        let (a, b) = excerpts(old, new);
        assert!(a.contains("5001") && b.contains("5002"), "{a} -> {b}");
        assert!(a.starts_with("...") && a.ends_with("...") && a.chars().count() <= 46, "{a}");
        let (a, b) =
            excerpts(r#"{"mode":"access","native":null,"vid":1}"#, r#"{"mode":"access","native":null,"vid":10}"#);
        assert!(a.ends_with(r#""vid":1}"#) && b.ends_with(r#""vid":10}"#), "{a} -> {b}");
    }

    #[test]
    fn short_values_stay_whole_and_any_lengths_are_safe() {
        assert_eq!(excerpts("1", "2"), ("1".to_string(), "2".to_string()));
        let long = "x".repeat(100);
        for (a, b) in
            [(long.as_str(), ""), ("", long.as_str()), (long.as_str(), long.as_str()), ("é".repeat(50).as_str(), "e")]
        {
            let (x, y) = excerpts(a, b);
            assert!(x.chars().count() <= 46 && y.chars().count() <= 46, "{x} / {y}");
        }
    }
}
