//! What the daemon hands the host: a plugin entry of the YAML (parsed by the daemon), and the
//! errors that name it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a plugin's packets get when it faults or is quarantined. The daemon's YAML names it
/// directly (`on_error: pass | drop`), hence the one serde derive in this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Leave the verdicts as they were before the call (`Pass`): fail open.
    #[default]
    Pass,
    /// Drop the whole batch: fail closed.
    Drop,
}

/// One plugin entry of the switch's YAML (the daemon parses YAML into this; no serde on it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginSpec {
    /// Name used in logs, errors and metrics.
    pub name: String,
    /// The component file (`.wasm`).
    pub path: PathBuf,
    /// Handed to the plugin's `init` as is (YAML or JSON text by convention; may be empty).
    pub config: String,
    /// N: how many leading bytes of each frame the plugin sees (0..=1024).
    pub header_bytes: u16,
    /// What the batch gets when a call faults or the plugin is quarantined.
    pub on_error: OnError,
    /// Longest a batch call may run before it is interrupted.
    pub deadline: Duration,
    /// Cap on the plugin's linear memory, per instance (per worker).
    pub memory_limit: usize,
    /// Faults on one worker before the plugin is quarantined there (at least 1).
    pub max_faults: u32,
    /// Where the plugin runs, for log lines (``port `p0` `` or ``port `p0`'s shadow chain``):
    /// one name may be used on several ports and in both chains of one. Empty: not said.
    pub context: String,
    /// The component's bytes when they were read already (the daemon reads them before it
    /// drops privileges, as it reads its config); `None`: `path` is read.
    pub bytes: Option<Bytes>,
}

/// A component's bytes, shown in `Debug` by their length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Bytes(pub Arc<[u8]>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl PluginSpec {
    /// [`PluginSpec::new`]'s `header_bytes`, in bytes.
    pub const DEFAULT_HEADER_BYTES: u16 = 128;
    /// [`PluginSpec::new`]'s `deadline`.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
    /// [`PluginSpec::new`]'s `memory_limit`, in bytes (16 MiB).
    pub const DEFAULT_MEMORY_LIMIT: usize = 16 << 20;
    /// [`PluginSpec::new`]'s `max_faults`.
    pub const DEFAULT_MAX_FAULTS: u32 = 3;

    /// A spec with the defaults: 128 header bytes, on_error pass, 5 ms deadline, 16 MiB, 3 faults.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            path: path.into(),
            config: String::new(),
            header_bytes: Self::DEFAULT_HEADER_BYTES,
            on_error: OnError::Pass,
            deadline: Self::DEFAULT_DEADLINE,
            memory_limit: Self::DEFAULT_MEMORY_LIMIT,
            max_faults: Self::DEFAULT_MAX_FAULTS,
            context: String::new(),
            bytes: None,
        }
    }

    /// How log lines name the plugin: ``plugin `acl` on port `p0` ``.
    pub fn label(&self) -> String {
        self.label_at(&self.context)
    }

    /// [`PluginSpec::label`] for the plugin running at `context` instead.
    pub fn label_at(&self, context: &str) -> String {
        match context {
            "" => format!("plugin `{}`", self.name),
            at => format!("plugin `{}` on {at}", self.name),
        }
    }
}

/// What went wrong loading a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// A field of the spec is out of range.
    Spec,
    /// Not a valid component (or not a component at all).
    Compile,
    /// It imports something outside the world (WASI, sockets, another version, ...).
    ForbiddenImport,
    /// Its exports are not the `wasmswitch:plugin/plugin` world's.
    WrongWorld,
    /// Instantiation failed (e.g. its initial memory is above the limit).
    Instantiate,
    /// `init` refused the config (or trapped).
    Init,
    /// It faulted on a built-in test frame in the smoke run of `wasmswitch check`.
    Smoke,
}

/// An error that names the plugin it is about.
#[derive(Clone, Debug)]
pub struct PluginError {
    /// The plugin's name ([`PluginSpec::name`]).
    pub plugin: String,
    /// Which step failed.
    pub kind: ErrorKind,
    /// What went wrong (`Display` puts the plugin's name before it).
    pub message: String,
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin `{}`: {}", self.plugin, self.message)
    }
}

impl std::error::Error for PluginError {}

pub(crate) fn err(spec: &PluginSpec, kind: ErrorKind, message: impl Into<String>) -> PluginError {
    PluginError { plugin: spec.name.clone(), kind, message: message.into() }
}

/// `wasmtime::Error` is not `std::error::Error`; flatten it (with its causes) into text, on
/// one line: wasmparser's messages can carry pretty-printed arrays (a bad magic number's bytes,
/// one per line), and an error answers a reload and goes into a log line.
pub(crate) fn wt(e: &wasmtime::Error) -> String {
    format!("{e:#}").lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}
