//! The YAML configuration: typed structs, unknown keys rejected, semantic checks.
//!
//! Every error names the file, line and column and says what was expected. Parsing uses
//! serde-saphyr (maintained, panic-free, located errors) rather than the archived serde_yaml.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::umem::HEADROOM;

use crate::drivers::CheckCtx;
use crate::schema::{default_mtu, is_name, or_loc, unknown, within};
pub use crate::schema::{max_frame, max_mtu, ConfigError, Mac};
// Each driver's section is its module's; the file's structure names them here.
pub use crate::drivers::afxdp::config::{max_tx_frame, AfxdpSection, AttachMode, BindMode, PartialChecksums};
pub use crate::drivers::host::config::HostSection;
pub use crate::drivers::sim::config::{SimSection, TrafficProto, TrafficSection};

/// How workers forward: the datapath's own enum, read from the file.
pub use wasmswitch_core::pipeline::ForwardMode as Mode;

/// `switch:`: how the workers forward, and how many packets they take at a time.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    /// `l2` (learning switch, the default), `passthrough` (each packet back out of its ingress
    /// port, unparsed) or `cross` (ports paired 0↔1, 2↔3, … by place in the file).
    #[serde(default)]
    pub mode: Mode,
    /// Most packets a worker takes from one queue per poll: one batch, one call per plugin.
    #[serde(default = "default_batch")]
    pub batch: Spanned<usize>,
}

fn default_batch() -> Spanned<usize> {
    unknown(wasmswitch_core::DEFAULT_BATCH)
}

impl Default for SwitchSection {
    fn default() -> Self {
        Self { mode: Mode::default(), batch: default_batch() }
    }
}

/// `metrics:`: where the HTTP endpoint (metrics, health, control API) listens.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address of the HTTP endpoint (`/metrics`, `/healthz`, `/api/v1/...`); localhost by default.
    #[serde(default = "default_listen")]
    pub listen: Spanned<Listen>,
}

fn default_listen() -> Spanned<Listen> {
    unknown(Listen(SocketAddr::from(([127, 0, 0, 1], 9187))))
}

/// A socket address written `IP:PORT`, parsed when the file is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub SocketAddr);

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let addr: SocketAddr = text.parse().map_err(|_| {
            serde::de::Error::custom(format!("`{text}` is not an address: expected IP:PORT such as 127.0.0.1:9187"))
        })?;
        if addr.port() == 0 {
            // The kernel would pick a port, and no client (`wasmswitch status`, Prometheus)
            // could find it.
            return Err(serde::de::Error::custom(format!(
                "`{text}`: port 0 would listen on a port the kernel picks, which no client can find; give a port such as 9187"
            )));
        }
        Ok(Listen(addr))
    }
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self { listen: default_listen() }
    }
}

/// Who may change the switch through the control API.
#[derive(Deserialize, Serialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    /// File holding the bearer token that mutating API requests must carry, relative to the
    /// config file's folder unless absolute; no token is required when absent.
    #[serde(default)]
    pub token_file: Option<Spanned<String>>,
    /// The token read from `token_file` when the file is loaded (never serialized: the
    /// config is served by `/api/v1/config`).
    #[serde(skip)]
    pub token: Option<Token>,
}

/// The API token: printable ASCII, redacted from `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl Token {
    /// The token's bytes, which a request's `Authorization: Bearer` value must match.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Largest token file accepted.
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// Shortest token accepted: the API answers a wrong token as fast as a client can ask, so
/// a short one falls to guessing (16 base64 characters are 96 bits; even hex, 64).
pub const MIN_TOKEN_BYTES: usize = 16;

/// Reads the token from `path`: a regular file of at most [`MAX_TOKEN_FILE_BYTES`], readable
/// by its owner only, holding at least [`MIN_TOKEN_BYTES`] of printable ASCII (surrounding
/// whitespace is trimmed). The daemon (start, `check`, reload) and the client read it here.
pub fn read_token(path: &Path) -> Result<Token, String> {
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let shown = path.display();
    // O_NONBLOCK + fstat: a FIFO put here is refused, not waited on.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if meta.len() > MAX_TOKEN_FILE_BYTES {
        return Err(format!("{shown} is {} bytes: at most {MAX_TOKEN_FILE_BYTES}", meta.len()));
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} is readable or writable by others (mode {:04o}): make it owner-only with `chmod 600`",
            mode & 0o7777
        ));
    }
    let mut data = Vec::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1).read_to_end(&mut data).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if data.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(format!("{shown} grew past {MAX_TOKEN_FILE_BYTES} bytes"));
    }
    let token = data.trim_ascii();
    if token.is_empty() {
        return Err(format!("{shown} is empty: write a token into it"));
    }
    // A client must be able to send it in an Authorization header.
    if !token.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(format!("{shown}: the token must be printable ASCII without spaces (e.g. base64)"));
    }
    if token.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "{shown} holds a token of {} bytes: at least {MIN_TOKEN_BYTES} are needed, a shorter one can be guessed; make one with `head -c 24 /dev/urandom | base64 > {shown}`",
            token.len()
        ));
    }
    Ok(Token(token.to_vec()))
}

/// `pool:`: the frame pools (UMEMs) and their per-worker caches and recycle rings.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Frames in each UMEM (one per UMEM group; every port of a group shares it).
    #[serde(default = "default_frames")]
    pub frames: Spanned<u32>,
    /// Bytes per frame: 2048 or 4096.
    #[serde(default = "default_frame_size")]
    pub frame_size: Spanned<u32>,
    /// Per-worker alloc cache (page_pool's is 128).
    #[serde(default = "default_cache")]
    pub cache: Spanned<usize>,
    /// Shared recycle ring entries.
    #[serde(default = "default_ring")]
    pub ring: Spanned<usize>,
}

fn default_frames() -> Spanned<u32> {
    // 64 MiB of 2048-byte frames: three AF_XDP ports with their default rings (see
    // `frames_needed`) and a host port fit.
    Spanned::new(32768, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_frame_size() -> Spanned<u32> {
    Spanned::new(2048, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_cache() -> Spanned<usize> {
    unknown(128)
}
fn default_ring() -> Spanned<usize> {
    unknown(2048)
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            frames: default_frames(),
            frame_size: default_frame_size(),
            cache: default_cache(),
            ring: default_ring(),
        }
    }
}

/// `fdb:`: the MAC table (forwarding database).
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct FdbSection {
    /// MAC entries the table holds (default 16384, 64-16777216).
    #[serde(default = "default_fdb_capacity")]
    pub capacity: Spanned<usize>,
    /// Seconds a MAC may stay silent before it is forgotten.
    #[serde(default = "default_aging")]
    pub aging_seconds: Spanned<u32>,
    /// Entries that never age or move (`static:` in the file).
    #[serde(default, rename = "static")]
    pub statics: Vec<l2::StaticEntry>,
}

fn default_fdb_capacity() -> Spanned<usize> {
    unknown(16384)
}
fn default_aging() -> Spanned<u32> {
    unknown(300)
}

impl Default for FdbSection {
    fn default() -> Self {
        Self { capacity: default_fdb_capacity(), aging_seconds: default_aging(), statics: Vec::new() }
    }
}

/// What a worker does when a round finds no packet.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Idle {
    /// Spin (lowest latency, one core at 100%).
    #[default]
    Poll,
    /// Sleep briefly between empty rounds.
    Sleep,
}

/// One entry of `workers:`: a datapath worker thread.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// CPU to pin the worker to; unpinned when absent.
    #[serde(default)]
    pub cpu: Option<Spanned<usize>>,
    /// What the worker does after a round with no packet: `poll` (the default) or `sleep`.
    #[serde(default = "default_idle")]
    pub idle: Spanned<Idle>,
}

fn default_idle() -> Spanned<Idle> {
    unknown(Idle::Poll)
}

/// `ports[].driver`: which driver opens the port.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// In-memory rings, with generated traffic if the `sim:` section asks for it.
    Sim,
    /// A kernel interface opened through AF_XDP sockets (the `afxdp:` section names it).
    Afxdp,
}

/// One entry of `ports:`.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    /// The port's name in metrics, the API and `to:` lists: 1-32 of `[A-Za-z0-9._-]`, unique.
    pub name: Spanned<String>,
    /// Which driver opens the port; only that driver's section may be present.
    pub driver: Spanned<DriverKind>,
    /// Largest L3 payload; frames longer than mtu + 14 + 8 (two VLAN tags) are dropped.
    #[serde(default = "default_mtu")]
    pub mtu: Spanned<u32>,
    /// The sim driver's settings (`driver: sim` only; its defaults when absent).
    #[serde(default)]
    pub sim: Option<Spanned<SimSection>>,
    /// The AF_XDP driver's settings: required with `driver: afxdp`, refused with `sim`.
    #[serde(default)]
    pub afxdp: Option<Spanned<AfxdpSection>>,
    /// Ingress plugin chain, run in order; the first plugin to give a packet a verdict other
    /// than `pass` decides it.
    #[serde(default)]
    pub plugins: Vec<PluginSection>,
    /// A candidate chain run in shadow next to `plugins`: it sees the same batches, its
    /// verdicts are counted against the live chain's and never applied.
    #[serde(default)]
    pub shadow: Vec<PluginSection>,
    /// VLAN membership; an access port of VLAN 1 when absent.
    #[serde(default)]
    pub vlan: Option<l2::VlanSection>,
    /// Storm control: flooded frames per second admitted on this port, by class.
    #[serde(default)]
    pub storm: Option<l2::StormSection>,
    /// The port's FDB settings: a limit on its learned entries.
    #[serde(default)]
    pub fdb: Option<l2::PortFdbSection>,
    /// The UMEM group the port's frames live in. Ports of one group forward to each other
    /// without a copy; a frame that crosses groups is copied into a frame of the egress port's
    /// group. When absent: an AF_XDP port's bind mode (`copy` or `zerocopy`, which the kernel
    /// does not let share a UMEM), `copy` for a sim port. The host port joins the first port's.
    #[serde(default)]
    pub umem: Option<Spanned<String>>,
}

impl PortSection {
    /// The port's driver section: the one its `driver:` names (checked by that driver), and no
    /// other driver's.
    fn check_driver<'a>(
        &'a self,
        ctx: &CheckCtx<'a>,
        interfaces: &mut HashMap<&'a str, (&'a str, Location)>,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let name = ctx.port;
        match self.driver.value {
            DriverKind::Sim => {
                if let Some(a) = &self.afxdp {
                    return Err(err(
                        a.referenced,
                        format!("port `{name}` uses driver `sim`, so an `afxdp` section makes no sense here"),
                    ));
                }
                if let Some(sim) = &self.sim {
                    sim.value.check(ctx, err)?;
                }
            }
            DriverKind::Afxdp => {
                if let Some(s) = &self.sim {
                    return Err(err(
                        s.referenced,
                        format!("port `{name}` uses driver `afxdp`, so a `sim` section makes no sense here"),
                    ));
                }
                let Some(a) = &self.afxdp else {
                    return Err(err(
                        self.driver.referenced,
                        format!("port `{name}` uses driver `afxdp` but has no `afxdp:` section naming its interface"),
                    ));
                };
                a.value.check(ctx, interfaces, err)?;
            }
        }
        Ok(())
    }
}

/// What a plugin's packets get when it faults or is quarantined: the plugin host's own enum.
pub use wasmswitch_plugin_host::OnError;

/// One plugin of a port's ingress chain.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    /// The plugin's name in logs, metrics and the API; unique within its chain.
    pub name: Spanned<String>,
    /// The component (`.wasm`), relative to the config file's folder unless absolute.
    pub path: Spanned<String>,
    /// `path` resolved against the config file's folder when the file is loaded.
    #[serde(skip)]
    pub file: PathBuf,
    /// `file`'s bytes where they were read with the config ([`Config::read_plugins`]).
    #[serde(skip)]
    pub bytes: Option<wasmswitch_plugin_host::Bytes>,
    /// Text handed to the plugin's `init` (each plugin documents its format).
    #[serde(default)]
    pub config: String,
    /// Leading bytes of each packet the plugin sees (0-1024).
    #[serde(default = "default_header_bytes")]
    pub header_bytes: Spanned<u16>,
    /// What the batch's packets get when the plugin faults or is quarantined: `pass` (the
    /// default, fail open) or `drop`.
    #[serde(default)]
    pub on_error: OnError,
    /// CPU time a batch call may use, in microseconds (time the worker was descheduled does
    /// not count; a call that spins is stopped after one to two deadlines).
    #[serde(default = "default_deadline_us")]
    pub deadline_us: Spanned<u64>,
    /// Cap on the plugin's linear memory per worker, in KiB.
    #[serde(default = "default_memory_kib")]
    pub memory_limit_kib: Spanned<usize>,
    /// Faults on one worker before the plugin is quarantined there.
    #[serde(default = "default_max_faults")]
    pub max_faults: Spanned<u32>,
}

fn default_header_bytes() -> Spanned<u16> {
    Spanned::new(128, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_deadline_us() -> Spanned<u64> {
    Spanned::new(5000, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_memory_kib() -> Spanned<usize> {
    Spanned::new(16384, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_max_faults() -> Spanned<u32> {
    unknown(3)
}

/// The whole file.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `switch:`: forwarding mode and batch size.
    #[serde(default)]
    pub switch: SwitchSection,
    /// `metrics:`: the HTTP endpoint's address.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `control:`: the token the control API's mutating requests need.
    #[serde(default)]
    pub control: ControlSection,
    /// `pool:`: frame pool sizes.
    #[serde(default)]
    pub pool: PoolSection,
    /// `fdb:`: MAC table size, aging and static entries.
    #[serde(default)]
    pub fdb: FdbSection,
    /// Datapath worker threads (1-64 entries; one unpinned, polling worker when absent).
    #[serde(default = "default_workers")]
    pub workers: Vec<WorkerSection>,
    /// The switch's ports (1-64 entries, required); a port's index is its place here.
    pub ports: Vec<PortSection>,
    /// The host port: a TAP linking the switch to the host's own stack; none when absent.
    #[serde(default)]
    pub host: Option<HostSection>,
    /// Port mirroring sessions.
    #[serde(default)]
    pub mirrors: Vec<l2::MirrorSection>,
    /// The user the daemon runs as once it has dropped its privileges (see `privileges.rs`);
    /// it stays the one that started it when absent.
    #[serde(default)]
    pub user: Option<Spanned<String>>,
    /// The file's text and name, kept to locate the keys a reload changes.
    #[serde(skip)]
    pub source: String,
    /// The path the file was read from; plugin and token paths are relative to its folder.
    #[serde(skip)]
    pub file: PathBuf,
}

fn default_workers() -> Vec<WorkerSection> {
    vec![WorkerSection { cpu: None, idle: default_idle() }]
}

/// Largest config file accepted.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Ranges of the numeric keys (inclusive). The README's configuration reference lists them;
/// within them every product `frames_needed` forms fits easily in a u64, and `run` starts.
pub mod range {
    // Each driver's own section's ranges are its module's.
    pub use crate::drivers::afxdp::config::range::*;
    pub use crate::drivers::host::config::range::*;
    pub use crate::drivers::sim::config::range::*;
    pub use crate::schema::range::*;

    /// `switch.batch`: packets per poll.
    pub const BATCH: (usize, usize) = (1, wasmswitch_core::BATCH_SIZE);
    /// `pool.frames`: frames per UMEM.
    pub const FRAMES: (u32, u32) = (1024, 1 << 20);
    /// `pool.cache`: frames in each worker's alloc cache.
    pub const CACHE: (usize, usize) = (16, 4096);
    /// `pool.ring`: entries of the shared recycle ring.
    pub const RING: (usize, usize) = (16, 1 << 20);
    /// `fdb.capacity`: MAC entries.
    pub const FDB_CAPACITY: (usize, usize) = (64, 1 << 24);
    /// `fdb.aging_seconds`: one second to a day.
    pub const AGING_SECONDS: (u32, u32) = (1, 86_400);
    /// Entries of `workers`.
    pub const WORKERS: (usize, usize) = (1, 64);
    /// Distinct `umem:` names: each group maps `pool.frames` frames of its own.
    pub const UMEM_GROUPS: (usize, usize) = (0, 4);
    /// Plugins in one chain of a port (`plugins` and `shadow` each).
    pub const PLUGINS_PER_PORT: (usize, usize) = (0, 8);
    /// `header_bytes`: leading bytes of each packet a plugin sees.
    pub const HEADER_BYTES: (u16, u16) = (0, 1024);
    /// 10 ms: a plugin that spins is stopped after one to two deadlines as the 1 ms epoch
    /// clock enforces them (`deadline_as_enforced`: 11 ms here), so one call holds its worker
    /// for at most about 22 ms.
    pub const DEADLINE_US: (u64, u64) = (10, 10_000);
    /// `memory_limit_kib`: 64 KiB to 4 GiB of linear memory per instance.
    pub const MEMORY_KIB: (usize, usize) = (64, 4_194_304);
    /// With the deadline bound, a plugin that overruns every call costs its worker at most
    /// 100 × 20 ms = 2 s in all before it is quarantined (and answers by `on_error` after).
    pub const MAX_FAULTS: (u32, u32) = (1, 100);
    /// Sum of every plugin's enforced deadline (`deadline_as_enforced`) over every port: a
    /// round in which every plugin overruns takes at most about twice this (200 ms), which
    /// bounds how late a worker sees a stop or a swap and stays inside `/healthz`'s 1 s stall
    /// bound.
    pub const MAX_TOTAL_DEADLINE_US: u64 = 100_000;
}

impl Config {
    /// Reads, parses and checks `path`. Only a regular file is read (a FIFO or device in its
    /// place is refused without blocking), and at most [`MAX_CONFIG_BYTES`] of it.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let whole = |message: String| ConfigError { file: path.to_owned(), line: 0, column: 0, message };
        let bytes = wasmswitch_plugin_host::read_regular_file(path, MAX_CONFIG_BYTES)
            .map_err(|e| whole(format!("cannot read the config file: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|_| whole("cannot read the config file: not UTF-8 text".into()))?;
        Self::parse(&text, path)
    }

    /// Every file a reload reads again: the config itself, the control token file, and each
    /// plugin's component (live and shadow).
    pub fn files_reread(&self) -> Vec<PathBuf> {
        let token = self.control.token_file.as_ref().map(|f| resolve(&self.file, &f.value));
        let plugins = self.ports.iter().flat_map(|p| p.plugins.iter().chain(&p.shadow)).map(|pl| pl.file.clone());
        std::iter::once(self.file.clone()).chain(token).chain(plugins).collect()
    }

    /// Reads every plugin's component now (as the daemon does before it drops privileges), so
    /// that starting needs no read as the daemon's user: a file that user cannot read is then
    /// named at start (see [`Config::files_reread`]) and refused by every reload, not by the
    /// start that `check` accepted. A file that cannot be read here is left to the compile,
    /// which names it.
    pub fn read_plugins(&mut self) {
        for pl in self.ports.iter_mut().flat_map(|p| p.plugins.iter_mut().chain(&mut p.shadow)) {
            pl.bytes = wasmswitch_plugin_host::read_regular_file(&pl.file, wasmswitch_plugin_host::MAX_PLUGIN_BYTES)
                .ok()
                .map(|b| wasmswitch_plugin_host::Bytes(b.into()));
        }
    }

    /// Parses and checks `text` (named `path` in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::parse_as(text, path, Ranges::Documented)
    }

    /// [`Config::parse`], naming a too-large number's documented range or the type's.
    fn parse_as(text: &str, path: &Path, ranges: Ranges) -> Result<Config, ConfigError> {
        let mut cfg: Config = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
            let message = plain_message(&e, text, line, column);
            let message = match ranges {
                Ranges::Documented => documented_range(text, path, line, column, &message).unwrap_or(message),
                Ranges::OfTheType => message,
            };
            ConfigError { file: path.to_owned(), line, column, message }
        })?;
        for port in &mut cfg.ports {
            for pl in port.plugins.iter_mut().chain(&mut port.shadow) {
                pl.file = resolve(path, &pl.path.value);
            }
        }
        cfg.check(path)?;
        if let Some(f) = &cfg.control.token_file {
            let token = read_token(&resolve(path, &f.value)).map_err(|message| ConfigError {
                file: path.to_owned(),
                line: f.referenced.line(),
                column: f.referenced.column(),
                message: format!("control.token_file: {message}"),
            })?;
            cfg.control.token = Some(token);
        }
        cfg.source = text.to_owned();
        cfg.file = path.to_owned();
        Ok(cfg)
    }

    /// Port index by name (the host port, if any, comes after the configured ports).
    pub fn port_index(&self, name: &str) -> Option<usize> {
        self.ports
            .iter()
            .position(|p| p.name.value == name)
            .or_else(|| self.host.as_ref().filter(|h| h.name.value == name).map(|_| self.ports.len()))
    }

    /// In a mode other than `l2`, the first setting only the L2 stage applies (where, and what
    /// it is): the pipeline neither parses nor looks up there, so it would be ignored.
    fn check_mode(&self) -> Option<(Location, String)> {
        if self.switch.mode == Mode::L2 {
            return None;
        }
        for p in &self.ports {
            let port = &p.name.value;
            if let Some(pl) = p.plugins.first().or(p.shadow.first()) {
                return Some((pl.name.referenced, format!("port `{port}`: plugin `{}`", pl.name.value)));
            }
            if p.vlan.is_some() {
                return Some((p.name.referenced, format!("port `{port}`: `vlan`")));
            }
            if p.storm.is_some() {
                return Some((p.name.referenced, format!("port `{port}`: `storm`")));
            }
            if p.fdb.is_some() {
                return Some((p.name.referenced, format!("port `{port}`: `fdb`")));
            }
        }
        if let Some(m) = self.mirrors.first() {
            return Some((m.name.referenced, format!("mirror `{}`", m.name.value)));
        }
        if let Some(e) = self.fdb.statics.first() {
            return Some((e.mac.referenced, format!("the static FDB entry {}", e.mac.value.0)));
        }
        self.host.as_ref().map(|h| (h.tap.referenced, "the host port".to_string()))
    }

    /// The address the HTTP endpoint listens on (`metrics.listen`).
    pub fn listen_addr(&self) -> SocketAddr {
        self.metrics.listen.value.0
    }

    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |loc: Location, message: String| ConfigError {
            file: path.to_owned(),
            line: loc.line(),
            column: loc.column(),
            message,
        };
        self.check_sections(&err)?;
        self.check_workers(&err)?;
        let fs = self.pool.frame_size.value;
        let mtu_range = (range::MTU_MIN, max_mtu(fs));
        let mut names: HashMap<&str, Location> = HashMap::new();
        // One port per interface: the kernel takes one XDP program per interface.
        let mut interfaces: HashMap<&str, (&str, Location)> = HashMap::new();
        let mut umem_groups: std::collections::BTreeSet<&str> = Default::default();
        let mut total_deadline_us: u64 = 0;
        let port_names: Vec<&str> = self.ports.iter().map(|p| p.name.value.as_str()).collect();
        let ctx = |port| CheckCtx { port, frame_size: fs, ports: &port_names, listen: self.listen_addr() };
        for p in &self.ports {
            let name = &p.name.value;
            if !is_name(name) {
                return Err(err(
                    p.name.referenced,
                    format!("port name `{name}` is not valid: expected 1-32 letters, digits, `-`, `_` or `.`"),
                ));
            }
            if let Some(u) = &p.umem {
                let g = &u.value;
                if !is_name(g) {
                    return Err(err(
                        u.referenced,
                        format!(
                            "port `{name}`: umem `{g}` is not valid: expected 1-32 letters, digits, `-`, `_` or `.`"
                        ),
                    ));
                }
                umem_groups.insert(g.as_str());
                if umem_groups.len() > range::UMEM_GROUPS.1 {
                    return Err(err(
                        u.referenced,
                        format!(
                            "port `{name}`: umem `{g}` is one named UMEM group too many: at most {} (each maps its own pool.frames)",
                            range::UMEM_GROUPS.1
                        ),
                    ));
                }
            }
            if let Some(first) = names.insert(name, p.name.referenced) {
                return Err(err(
                    p.name.referenced,
                    format!("duplicate port name `{name}` (first defined at line {})", first.line()),
                ));
            }
            if !(mtu_range.0..=mtu_range.1).contains(&p.mtu.value) {
                return Err(err(
                    or_loc(p.mtu.referenced, p.name.referenced),
                    format!(
                        "port `{name}`: mtu {} is out of range: expected {}-{} ({fs}-byte frames less {HEADROOM} bytes of headroom and 22 of Ethernet and VLAN headers)",
                        p.mtu.value, mtu_range.0, mtu_range.1
                    ),
                ));
            }
            self.check_chains(p, &mut total_deadline_us, &err)?;
            p.check_driver(&ctx(name), &mut interfaces, &err)?;
        }
        if let Some(h) = &self.host {
            h.check(fs, &names, &interfaces, &err)?;
        }
        if let Some(u) = &self.user {
            if let Err(e) = crate::privileges::lookup(&u.value) {
                return Err(err(u.referenced, format!("user: {}", crate::error_text::ErrorText(&e))));
            }
        }
        l2::check(self, &err)?;
        let needed = self.frames_needed();
        if u64::from(self.pool.frames.value) < needed {
            let all_queues = self.ports.iter().any(|p| p.afxdp.as_ref().is_some_and(|a| a.value.queues.is_none()));
            return Err(err(
                self.pool.frames.referenced,
                format!(
                    "pool.frames {} is too small for these ports and workers: at least {needed} are needed{}",
                    self.pool.frames.value,
                    if all_queues {
                        " (an afxdp port without `queues:` counts every queue of its interface)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(())
    }

    /// The switch-wide sections: how many ports, the mode and what needs l2, the control API's
    /// address and token, the pool, the FDB and the batch size.
    fn check_sections(&self, err: &impl Fn(Location, String) -> ConfigError) -> Result<(), ConfigError> {
        if self.ports.is_empty() {
            return Err(err(Location::UNKNOWN, "`ports` is empty: a switch needs at least one port".into()));
        }
        if self.ports.len() > range::PORTS.1 {
            return Err(err(
                self.ports[range::PORTS.1].name.referenced,
                format!("too many ports ({}): at most {}", self.ports.len(), range::PORTS.1),
            ));
        }
        self.check_mode()
            .map(|(at, what)| {
                let mode = match self.switch.mode {
                    Mode::L2 => "l2",
                    Mode::Passthrough => "passthrough",
                    Mode::Cross => "cross",
                };
                err(
                    at,
                    format!("{what} needs switch.mode l2: `{mode}` sends frames on unparsed, so it would be ignored"),
                )
            })
            .map_or(Ok(()), Err)?;
        let listen = self.listen_addr();
        if !listen.ip().is_loopback() && self.control.token_file.is_none() {
            return Err(err(
                self.metrics.listen.referenced,
                format!(
                    "metrics.listen {listen} is not a loopback address: the control API can reload the switch, so set control.token_file to require a token"
                ),
            ));
        }
        let fs = self.pool.frame_size.value;
        if fs != 2048 && fs != 4096 {
            return Err(err(
                self.pool.frame_size.referenced,
                format!("pool.frame_size {fs} is not supported: expected 2048 or 4096"),
            ));
        }
        within(&err, "switch.batch", &self.switch.batch, range::BATCH)?;
        within(&err, "pool.frames", &self.pool.frames, range::FRAMES)?;
        within(&err, "pool.cache", &self.pool.cache, range::CACHE)?;
        within(&err, "pool.ring", &self.pool.ring, range::RING)?;
        within(&err, "fdb.capacity", &self.fdb.capacity, range::FDB_CAPACITY)?;
        within(&err, "fdb.aging_seconds", &self.fdb.aging_seconds, range::AGING_SECONDS)?;
        Ok(())
    }

    /// `workers`: how many, and the CPUs they are pinned to (on this machine, allowed to this
    /// process, one worker each).
    fn check_workers(&self, err: &impl Fn(Location, String) -> ConfigError) -> Result<(), ConfigError> {
        if self.workers.is_empty() {
            return Err(err(Location::UNKNOWN, "`workers` is empty: at least one worker is needed".into()));
        }
        if self.workers.len() > range::WORKERS.1 {
            let extra = &self.workers[range::WORKERS.1];
            return Err(err(
                or_loc(extra.idle.referenced, extra.cpu.as_ref().map_or(Location::UNKNOWN, |c| c.referenced)),
                format!("too many workers ({}): at most {}", self.workers.len(), range::WORKERS.1),
            ));
        }
        let cpus = online_cpus();
        // What this process may run on: a worker pinned outside it would run unpinned.
        let allowed = wasmswitch_sys::cpus_of_this_thread().ok();
        let mut used_cpus: HashMap<usize, Location> = HashMap::new();
        for w in &self.workers {
            if let Some(cpu) = &w.cpu {
                if cpu.value >= cpus {
                    return Err(err(
                        cpu.referenced,
                        format!("cpu {} does not exist: this machine has CPUs 0-{}", cpu.value, cpus.saturating_sub(1)),
                    ));
                }
                if let Some(allowed) = allowed.as_ref().filter(|a| !a.contains(&cpu.value)) {
                    let list: Vec<String> = allowed.iter().map(usize::to_string).collect();
                    return Err(err(
                    cpu.referenced,
                    format!(
                        "cpu {} is not one this process may run on (its CPU affinity, set by a cpuset, taskset or systemd's CPUAffinity=, is {})",
                        cpu.value,
                        list.join(",")
                    ),
                ));
                }
                if let Some(first) = used_cpus.insert(cpu.value, cpu.referenced) {
                    return Err(err(
                        cpu.referenced,
                        format!("cpu {} is already used by the worker at line {}", cpu.value, first.line()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A port's plugin chains: their length, names, limits, the deadlines all chains add up
    /// to (`total_deadline_us`, over every port), and the component files.
    fn check_chains(
        &self,
        p: &PortSection,
        total_deadline_us: &mut u64,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let name = &p.name.value;
        for (key, chain) in [("plugins", &p.plugins), ("shadow", &p.shadow)] {
            if chain.len() > range::PLUGINS_PER_PORT.1 {
                return Err(err(
                    chain[range::PLUGINS_PER_PORT.1].name.referenced,
                    format!(
                        "port `{name}`: {} plugins in `{key}`: at most {} per chain",
                        chain.len(),
                        range::PLUGINS_PER_PORT.1
                    ),
                ));
            }
        }
        // Names are unique per chain; the shadow chain may hold a new version of a live
        // plugin under the same name.
        let mut plugin_names: HashMap<(bool, &str), Location> = HashMap::new();
        for (shadow, pl) in p.plugins.iter().map(|x| (false, x)).chain(p.shadow.iter().map(|x| (true, x))) {
            if let Some(first) = plugin_names.insert((shadow, &pl.name.value), pl.name.referenced) {
                return Err(err(
                    pl.name.referenced,
                    format!(
                        "port `{name}`: plugin `{}` is already in this chain (line {})",
                        pl.name.value,
                        first.line()
                    ),
                ));
            }
            // It labels metrics and log lines and names the plugin in the API.
            if !is_name(&pl.name.value) {
                return Err(err(
                    pl.name.referenced,
                    format!(
                        "port `{name}`: plugin name {:?} is not valid: expected 1-32 letters, digits, `-`, `_` or `.`",
                        pl.name.value
                    ),
                ));
            }
            within(&err, "header_bytes", &pl.header_bytes, range::HEADER_BYTES)?;
            within(&err, "deadline_us", &pl.deadline_us, range::DEADLINE_US)?;
            within(&err, "memory_limit_kib", &pl.memory_limit_kib, range::MEMORY_KIB)?;
            within(&err, "max_faults", &pl.max_faults, range::MAX_FAULTS)?;
            // Each as the epoch clock enforces it: a 10 µs deadline holds a spinning call
            // as long as a 1 ms one.
            let enforced =
                wasmswitch_plugin_host::deadline_as_enforced(std::time::Duration::from_micros(pl.deadline_us.value));
            *total_deadline_us = total_deadline_us.saturating_add(enforced.as_micros() as u64);
            if *total_deadline_us > range::MAX_TOTAL_DEADLINE_US {
                return Err(err(
                    or_loc(pl.deadline_us.referenced, pl.name.referenced),
                    format!(
                        "plugin `{}`: the plugins' deadlines (shadow chains included, each as the {} ms epoch clock enforces it: rounded up to whole ms, plus one) add up to more than {} µs; a worker runs every chain in one round, so use fewer plugins or lower deadlines",
                        pl.name.value,
                        wasmswitch_plugin_host::EPOCH_TICK.as_millis(),
                        range::MAX_TOTAL_DEADLINE_US
                    ),
                ));
            }
            let file = &pl.file;
            // stat, not open: a FIFO here must not block the check.
            match std::fs::metadata(file) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(err(
                        pl.path.referenced,
                        format!("plugin `{}`: {} is not a regular file", pl.name.value, file.display()),
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(err(
                        pl.path.referenced,
                        format!(
                            "plugin `{}`: no such file {} (build plugins with plugins/build.sh)",
                            pl.name.value,
                            file.display()
                        ),
                    ))
                }
                // The errno as it is: a symlink loop (ELOOP), a file where a folder should
                // be (ENOTDIR) or a folder the daemon's user may not search (EACCES) is not
                // fixed by building the plugin.
                Err(e) => {
                    return Err(err(
                        pl.path.referenced,
                        format!("plugin `{}`: cannot read {}: {e}", pl.name.value, file.display()),
                    ))
                }
            }
        }
        Ok(())
    }

    /// What an AF_XDP port's interface here says against the port's settings, one line each
    /// (see [`AfxdpSection::interface_warnings`]):
    /// an interface MTU above the port's `mtu` (its hosts send frames the port drops as
    /// oversize: TCP between them stalls on the first full-size segment) or below it (frames
    /// over it leaving there are dropped by the kernel), and generic mode on a veth (the
    /// kernel's slow path: TCP through it crawls). Warnings, not errors: the interface may be
    /// set up after `check`. Ports whose interface is not here say nothing.
    pub fn interface_warnings(&self) -> Vec<String> {
        let ports = self.ports.iter().filter_map(|p| Some((p, &p.afxdp.as_ref()?.value)));
        ports.flat_map(|(p, a)| a.interface_warnings(&p.name.value, p.mtu.value, self.pool.frame_size.value)).collect()
    }

    /// Frames the configured rings and caches can hold at once, plus room for flooding.
    /// Saturating: a config whose rings could hold more frames than a u64 counts (impossible
    /// within the checked ranges, but this runs before some of them) needs "too many".
    pub fn frames_needed(&self) -> u64 {
        let m = |a: u64, b: u64| a.saturating_mul(b);
        let workers = self.workers.len() as u64;
        // Flooding room: a batch's copies to 16 ports (1024 frames at the default batch).
        let flood = (self.switch.batch.value as u64).saturating_mul(16).max(1024);
        let mut n = m(workers, (self.pool.cache.value as u64).saturating_add(16)).saturating_add(flood);
        for p in &self.ports {
            n = n.saturating_add(match (&p.sim, &p.afxdp) {
                (Some(s), _) => s.value.frames_needed(),
                (None, Some(a)) => a.value.frames_needed(workers),
                (None, None) => crate::drivers::sim::config::frames_needed_default(workers),
            });
        }
        if let Some(h) = &self.host {
            n = n.saturating_add(h.frames_needed(workers));
        }
        n
    }
}

/// Which range a too-large number's error names.
#[derive(Clone, Copy)]
enum Ranges {
    /// The key's documented range ([`documented_range`]).
    Documented,
    /// The type's (inside [`documented_range`]'s own parse).
    OfTheType,
}

/// For a number too large for its key's type (`message` quotes the type's range), the range
/// the key documents: the file parsed again with the type's largest value in its place, whose
/// check names the key's own range, quoted with the number as written. `None` when that check
/// has nothing to say there (the type's range is the key's).
fn documented_range(text: &str, path: &Path, line: u64, column: u64, message: &str) -> Option<String> {
    let max = message.split(" is out of range: expected 0-").nth(1)?;
    let row = text.lines().nth(line.checked_sub(1)? as usize)?;
    let at = row.char_indices().nth(column.checked_sub(1)? as usize)?.0;
    let written = row[at..].split(|c: char| !c.is_ascii_digit()).next().filter(|v| !v.is_empty())?;
    let mut clamped: Vec<String> = text.lines().map(str::to_string).collect();
    clamped[line as usize - 1] = format!("{}{max}{}", &row[..at], &row[at + written.len()..]);
    // Once, not again for the next such number: a file of thousands of them would nest as many
    // parses and overflow the stack (a reload's thread has a small one).
    let e = Config::parse_as(&clamped.join("\n"), path, Ranges::OfTheType).err()?;
    (e.line == line && e.message.contains(max)).then(|| e.message.replace(max, written))
}

/// The library's message without its own "error: line X column Y:" prefix (we print
/// file:line:col), and with the offending key named when the library only names a type.
fn plain_message(e: &serde_saphyr::Error, text: &str, line: u64, column: u64) -> String {
    let full = e.to_string();
    let mut msg = full.lines().next().unwrap_or("invalid YAML").trim();
    msg = msg.strip_prefix("error: ").unwrap_or(msg);
    if msg.starts_with("line ") {
        if let Some(i) = msg.find(": ") {
            msg = &msg[i + 2..];
        }
    }
    // The key of the value at `column` (1-based, at the value): the last `key:` before it, so
    // that an inline mapping (`sim: { ring_size: 1024, queues: -1 }`) names `queues`.
    // In an inline mapping the parser may point at the key itself (`{ mode: trunk, allowed:
    // true }` at `allowed`): then that is the key.
    let key = text
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .and_then(|l| {
            let at: String = l.chars().skip(column.saturating_sub(1) as usize).collect();
            if let Some((k, after)) = at.split_once(':') {
                let word = k.starts_with(|c: char| c.is_ascii_alphabetic())
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if word && after.chars().next().is_none_or(char::is_whitespace) {
                    return Some(k.to_string());
                }
            }
            let upto: String = l.chars().take(column.saturating_sub(1) as usize).collect();
            let before =
                upto.rsplit_once(':').map(|(b, _)| b.to_string()).or_else(|| Some(l.split_once(':')?.0.into()))?;
            before.rsplit(['{', ',']).next().map(str::to_string)
        })
        .map(|k| k.trim().trim_start_matches("- ").to_string())
        // A list item's dash with no key after it (`- : :`) is no key.
        .filter(|k| !k.is_empty() && k != "-");
    if let Some(ty) = msg.strip_prefix("invalid ") {
        // A whole number too large for its type is out of range, not of the wrong type.
        let max: Option<u128> = match ty {
            "u8" => Some(u8::MAX.into()),
            "u16" => Some(u16::MAX.into()),
            "u32" => Some(u32::MAX.into()),
            "u64" | "usize" => Some(u64::MAX.into()),
            _ => None,
        };
        let value = text.lines().nth(line.saturating_sub(1) as usize).and_then(|l| {
            let at: String = l.chars().skip(column.saturating_sub(1) as usize).collect();
            at.split(|c: char| c.is_whitespace() || ",}]#".contains(c)).next()?.parse::<u128>().ok()
        });
        if let (Some(max), Some(v)) = (max, value) {
            if v > max {
                return match &key {
                    Some(k) => format!("`{k}` {v} is out of range: expected 0-{max}"),
                    None => format!("{v} is out of range: expected 0-{max}"),
                };
            }
        }
        // serde's own "invalid type: boolean `true`, expected a list ...".
        if let Some((got, expected)) = ty.strip_prefix("type: ").and_then(|t| t.split_once(", expected ")) {
            return match key {
                Some(k) => format!("wrong type for `{k}`: got {got}, expected {expected}"),
                None => format!("wrong type: got {got}, expected {expected}"),
            };
        }
        let expected = match ty {
            "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
            "i8" | "i16" | "i32" | "i64" => "an integer",
            "f32" | "f64" => "a number",
            "bool" => "true or false",
            _ => ty,
        };
        return match key {
            Some(k) => format!("wrong type for `{k}`: expected {expected}"),
            None => format!("wrong type: expected {expected}"),
        };
    }
    // The library's advice on its own options means nothing to an operator.
    if msg.starts_with("multiple YAML documents detected") {
        return "a second YAML document (after a `---` line) starts here: a config is one document".to_string();
    }
    // `- : :`, `name:` with nothing after it: serde's advice is about Rust types.
    if let Some(ty) = msg.strip_prefix("cannot deserialize null into ") {
        let ty = ty.split(';').next().unwrap_or(ty).trim();
        let expected = if ty == "string" { "text" } else { ty };
        return match key {
            Some(k) => format!("`{k}` has no value: expected {expected}"),
            None => format!("a key or value is missing here: expected {expected}"),
        };
    }
    if let Some(k) = msg.strip_prefix("duplicate mapping key: ") {
        let k = k.split(',').next().unwrap_or(k).trim();
        return format!("duplicate key `{k}`: each key may appear once in a mapping");
    }
    // The parser's structural complaints ("expected sequence start") name no key: name it.
    match key {
        Some(k) if msg.starts_with("expected ") => format!("wrong value for `{k}`: {msg}"),
        _ => msg.to_string(),
    }
}

/// The address the daemon of the config at `path` listens on (`metrics.listen`) and its token
/// file (`control.token_file`, resolved), read from those two keys alone, every other key
/// ignored and nothing else checked: a client (`wasmswitch reload -c`) reaches the daemon with
/// a file the daemon will refuse (a plugin missing, a bad value), so that the refusal is the
/// daemon's own, named in its answer and counted.
pub fn daemon_keys(path: &Path) -> Result<(SocketAddr, Option<PathBuf>), ConfigError> {
    #[derive(Deserialize)]
    struct Loose {
        #[serde(default)]
        metrics: Option<LooseMetrics>,
        #[serde(default)]
        control: Option<LooseControl>,
    }
    #[derive(Deserialize)]
    struct LooseMetrics {
        #[serde(default = "default_listen")]
        listen: Spanned<Listen>,
    }
    #[derive(Deserialize)]
    struct LooseControl {
        #[serde(default)]
        token_file: Option<String>,
    }
    let fail = |message: String| ConfigError { file: path.to_owned(), line: 0, column: 0, message };
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    let loose: Loose = serde_saphyr::from_str(&text).map_err(|e| {
        fail(format!(
            "metrics.listen and control.token_file cannot be read from it: {}",
            e.to_string().lines().next().unwrap_or("")
        ))
    })?;
    let listen = loose.metrics.map_or_else(default_listen, |m| m.listen).value.0;
    Ok((listen, loose.control.and_then(|c| c.token_file).map(|f| resolve(path, &f))))
}

/// A path from the config, resolved against the config file's folder unless absolute.
fn resolve(config_file: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_owned()
    } else {
        config_file.parent().unwrap_or(Path::new(".")).join(p)
    }
}

/// Number of online CPUs (ids are 0..n).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

pub mod diff;
pub mod l2;

#[cfg(test)]
mod tests;
