//! The YAML configuration: typed structs, unknown keys rejected, semantic checks.
//!
//! Every error names the file, line and column and says what was expected. Parsing uses
//! serde-saphyr (maintained, panic-free, located errors) rather than the archived serde_yaml.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

/// A configuration error with its position in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}:{}: {}", self.file.display(), self.line, self.column, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// How workers forward.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Learning switch (the default).
    #[default]
    L2,
    /// Each packet leaves by the port it came in on (a benchmark ceiling).
    Passthrough,
    /// Each packet leaves by the paired port (0↔1, 2↔3, …), unparsed, no lookup (the
    /// forwarding ceiling of a two-port topology).
    Cross,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    #[serde(default)]
    pub mode: Mode,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address of the HTTP endpoint (`/metrics`, `/healthz`, `/api/v1/...`); localhost by default.
    #[serde(default = "default_listen")]
    pub listen: Spanned<String>,
}

fn default_listen() -> Spanned<String> {
    Spanned::new("127.0.0.1:9187".into(), Location::UNKNOWN, Location::UNKNOWN)
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self { listen: default_listen() }
    }
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Frames in the UMEM shared by every port.
    #[serde(default = "default_frames")]
    pub frames: Spanned<u32>,
    /// Bytes per frame: 2048 or 4096.
    #[serde(default = "default_frame_size")]
    pub frame_size: Spanned<u32>,
    /// Per-worker alloc cache (page_pool's is 128).
    #[serde(default = "default_cache")]
    pub cache: usize,
    /// Shared recycle ring entries.
    #[serde(default = "default_ring")]
    pub ring: usize,
}

fn default_frames() -> Spanned<u32> {
    // 64 MiB of 2048-byte frames: three AF_XDP ports with their default rings (see
    // `frames_needed`) and a host port fit.
    Spanned::new(32768, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_frame_size() -> Spanned<u32> {
    Spanned::new(2048, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_cache() -> usize {
    128
}
fn default_ring() -> usize {
    2048
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

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct FdbSection {
    #[serde(default = "default_fdb_capacity")]
    pub capacity: usize,
    /// Seconds a MAC may stay silent before it is forgotten.
    #[serde(default = "default_aging")]
    pub aging_seconds: u32,
}

fn default_fdb_capacity() -> usize {
    16384
}
fn default_aging() -> u32 {
    300
}

impl Default for FdbSection {
    fn default() -> Self {
        Self { capacity: default_fdb_capacity(), aging_seconds: default_aging() }
    }
}

/// What a worker does when a round finds no packet.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Idle {
    /// Spin (lowest latency, one core at 100%).
    #[default]
    Poll,
    /// Sleep briefly between empty rounds.
    Sleep,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// CPU to pin the worker to; unpinned when absent.
    #[serde(default)]
    pub cpu: Option<Spanned<usize>>,
    #[serde(default)]
    pub idle: Idle,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    Sim,
    Afxdp,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    pub name: Spanned<String>,
    pub driver: Spanned<DriverKind>,
    /// Largest L3 payload; frames longer than mtu + 14 + 8 (two VLAN tags) are dropped.
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    #[serde(default)]
    pub sim: Option<Spanned<SimSection>>,
    #[serde(default)]
    pub afxdp: Option<Spanned<AfxdpSection>>,
    /// Ingress plugin chain, run in order; the first plugin to give a packet a verdict other
    /// than `pass` decides it.
    #[serde(default)]
    pub plugins: Vec<PluginSection>,
}

/// What a plugin's packets get when it faults or is quarantined.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    #[default]
    Pass,
    Drop,
}

/// One plugin of a port's ingress chain.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    pub name: Spanned<String>,
    /// The component (`.wasm`), relative to the config file's folder unless absolute.
    pub path: Spanned<String>,
    /// Text handed to the plugin's `init` (each plugin documents its format).
    #[serde(default)]
    pub config: String,
    /// Leading bytes of each packet the plugin sees (0-1024).
    #[serde(default = "default_header_bytes")]
    pub header_bytes: Spanned<u16>,
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
    pub max_faults: u32,
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
fn default_max_faults() -> u32 {
    3
}

fn default_mtu() -> u32 {
    1500
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SimSection {
    #[serde(default = "one")]
    pub queues: Spanned<u16>,
    #[serde(default = "default_ring_size")]
    pub ring_size: usize,
    /// Generated traffic arriving on this port; none when absent.
    #[serde(default)]
    pub traffic: Option<TrafficSection>,
}

impl Default for SimSection {
    fn default() -> Self {
        Self { queues: one(), ring_size: default_ring_size(), traffic: None }
    }
}

fn one() -> Spanned<u16> {
    Spanned::new(1, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_ring_size() -> usize {
    1024
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TrafficSection {
    /// Packets per second per queue; unlimited when absent.
    #[serde(default)]
    pub rate_pps: Option<u64>,
    #[serde(default = "default_src_macs")]
    pub src_macs: u32,
    #[serde(default = "default_sizes")]
    pub frame_sizes: Spanned<Vec<usize>>,
    #[serde(default = "default_bcast")]
    pub broadcast_percent: Spanned<f64>,
    #[serde(default = "default_flows")]
    pub flows: u32,
    #[serde(default)]
    pub vlan: Option<Spanned<u16>>,
    /// Ports whose hosts this traffic is addressed to (default: every other sim port).
    #[serde(default)]
    pub to: Option<Vec<Spanned<String>>>,
}

fn default_src_macs() -> u32 {
    256
}
fn default_sizes() -> Spanned<Vec<usize>> {
    Spanned::new(vec![64], Location::UNKNOWN, Location::UNKNOWN)
}
fn default_bcast() -> Spanned<f64> {
    Spanned::new(5.0, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_flows() -> u32 {
    1024
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Chosen by the driver profile.
    #[default]
    Auto,
    Native,
    Generic,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BindMode {
    #[default]
    Auto,
    Copy,
    Zerocopy,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct AfxdpSection {
    pub interface: Spanned<String>,
    #[serde(default)]
    pub mode: AttachMode,
    #[serde(default)]
    pub bind: BindMode,
    /// Queue ids to open; all of the interface's queues when absent.
    #[serde(default)]
    pub queues: Option<Spanned<Vec<u32>>>,
    /// Entries in each of the RX, TX, fill and completion rings (power of two).
    #[serde(default)]
    pub ring_size: Option<Spanned<u32>>,
    /// TCP/UDP checksums a local sender left to offload: `auto` (the driver profile: completed
    /// on veth and tun, left alone on NICs), `complete`, or `keep` (never touch a frame).
    #[serde(default)]
    pub partial_checksums: PartialChecksums,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PartialChecksums {
    /// Chosen by the driver profile.
    #[default]
    Auto,
    Complete,
    Keep,
}

/// The host port: a TAP device the switch creates (and removes on exit), served by host
/// workers over io_uring. To L2 it is a normal port (learned, flooded to); verdict `host` sends
/// frames there.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// The port's name in the switch (metrics, API, `to:` lists).
    #[serde(default = "default_host_name")]
    pub name: Spanned<String>,
    /// TAP device name (at most 15 bytes).
    pub tap: Spanned<String>,
    /// MAC address of the TAP (the host's own address on the switch).
    #[serde(default = "default_host_mac")]
    pub mac: Spanned<String>,
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// Host worker threads (one TAP queue each).
    #[serde(default = "one_usize")]
    pub workers: Spanned<usize>,
    /// Entries of each ring between a datapath worker and a host worker.
    #[serde(default = "default_host_ring")]
    pub ring_size: Spanned<usize>,
    /// Frames per delivery (cpumap's bulk is 8), 1-64.
    #[serde(default = "default_host_bulk")]
    pub bulk: Spanned<usize>,
}

fn default_host_name() -> Spanned<String> {
    Spanned::new("host".into(), Location::UNKNOWN, Location::UNKNOWN)
}
fn default_host_mac() -> Spanned<String> {
    Spanned::new("02:ee:00:00:00:01".into(), Location::UNKNOWN, Location::UNKNOWN)
}
fn one_usize() -> Spanned<usize> {
    Spanned::new(1, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_host_ring() -> Spanned<usize> {
    Spanned::new(1024, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_host_bulk() -> Spanned<usize> {
    Spanned::new(8, Location::UNKNOWN, Location::UNKNOWN)
}

/// The whole file.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub switch: SwitchSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub pool: PoolSection,
    #[serde(default)]
    pub fdb: FdbSection,
    #[serde(default = "default_workers")]
    pub workers: Vec<WorkerSection>,
    pub ports: Vec<PortSection>,
    #[serde(default)]
    pub host: Option<HostSection>,
}

fn default_workers() -> Vec<WorkerSection> {
    vec![WorkerSection { cpu: None, idle: Idle::Poll }]
}

impl Config {
    /// Reads, parses and checks `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot read the config file: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks `text` (named `path` in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
            ConfigError { file: path.to_owned(), line, column, message: plain_message(&e, text, line) }
        })?;
        cfg.check(path)?;
        Ok(cfg)
    }

    /// A plugin path from the config, resolved against the config file's folder.
    pub fn plugin_path(&self, config_file: &Path, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_owned()
        } else {
            config_file.parent().unwrap_or(Path::new(".")).join(p)
        }
    }

    /// Port index by name (the host port, if any, comes after the configured ports).
    pub fn port_index(&self, name: &str) -> Option<usize> {
        self.ports
            .iter()
            .position(|p| p.name.value == name)
            .or_else(|| self.host.as_ref().filter(|h| h.name.value == name).map(|_| self.ports.len()))
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.metrics.listen.value.parse().expect("checked in Config::check")
    }

    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |loc: Location, message: String| ConfigError {
            file: path.to_owned(),
            line: loc.line(),
            column: loc.column(),
            message,
        };
        if self.ports.is_empty() {
            return Err(err(Location::UNKNOWN, "`ports` is empty: a switch needs at least one port".into()));
        }
        if self.metrics.listen.value.parse::<SocketAddr>().is_err() {
            return Err(err(
                self.metrics.listen.referenced,
                format!(
                    "metrics.listen `{}` is not an address: expected IP:PORT such as 127.0.0.1:9187",
                    self.metrics.listen.value
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
        if self.workers.is_empty() {
            return Err(err(Location::UNKNOWN, "`workers` is empty: at least one worker is needed".into()));
        }
        let cpus = online_cpus();
        let mut used_cpus: HashMap<usize, Location> = HashMap::new();
        for w in &self.workers {
            if let Some(cpu) = &w.cpu {
                if cpu.value >= cpus {
                    return Err(err(
                        cpu.referenced,
                        format!("cpu {} does not exist: this machine has CPUs 0-{}", cpu.value, cpus.saturating_sub(1)),
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
        let mut names: HashMap<&str, Location> = HashMap::new();
        for p in &self.ports {
            let name = &p.name.value;
            if name.is_empty()
                || name.len() > 32
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(err(
                    p.name.referenced,
                    format!("port name `{name}` is not valid: expected 1-32 letters, digits, `-`, `_` or `.`"),
                ));
            }
            if let Some(first) = names.insert(name, p.name.referenced) {
                return Err(err(
                    p.name.referenced,
                    format!("duplicate port name `{name}` (first defined at line {})", first.line()),
                ));
            }
            if !(68..=9000).contains(&p.mtu) {
                return Err(err(
                    p.name.referenced,
                    format!("port `{name}`: mtu {} is out of range: expected 68-9000", p.mtu),
                ));
            }
            if p.mtu as usize + 22 > fs as usize - 256 {
                return Err(err(
                    p.name.referenced,
                    format!("port `{name}`: mtu {} does not fit a {fs}-byte frame with 256 bytes of headroom", p.mtu),
                ));
            }
            let mut plugin_names: HashMap<&str, Location> = HashMap::new();
            for pl in &p.plugins {
                if let Some(first) = plugin_names.insert(&pl.name.value, pl.name.referenced) {
                    return Err(err(
                        pl.name.referenced,
                        format!(
                            "port `{name}`: plugin `{}` is already in this chain (line {})",
                            pl.name.value,
                            first.line()
                        ),
                    ));
                }
                if pl.header_bytes.value > 1024 {
                    return Err(err(
                        pl.header_bytes.referenced,
                        format!("header_bytes {} is out of range: expected 0-1024", pl.header_bytes.value),
                    ));
                }
                if !(10..=1_000_000).contains(&pl.deadline_us.value) {
                    return Err(err(
                        pl.deadline_us.referenced,
                        format!("deadline_us {} is out of range: expected 10-1000000", pl.deadline_us.value),
                    ));
                }
                if !(64..=4_194_304).contains(&pl.memory_limit_kib.value) {
                    return Err(err(
                        pl.memory_limit_kib.referenced,
                        format!("memory_limit_kib {} is out of range: expected 64-4194304", pl.memory_limit_kib.value),
                    ));
                }
                let file = self.plugin_path(path, &pl.path.value);
                if !file.is_file() {
                    return Err(err(
                        pl.path.referenced,
                        format!(
                            "plugin `{}`: no such file {} (build plugins with plugins/build.sh)",
                            pl.name.value,
                            file.display()
                        ),
                    ));
                }
            }
            match p.driver.value {
                DriverKind::Sim => {
                    if let Some(a) = &p.afxdp {
                        return Err(err(
                            a.referenced,
                            format!("port `{name}` uses driver `sim`, so an `afxdp` section makes no sense here"),
                        ));
                    }
                    if let Some(sim) = &p.sim {
                        self.check_sim(name, &sim.value, &err)?;
                    }
                }
                DriverKind::Afxdp => {
                    if let Some(s) = &p.sim {
                        return Err(err(
                            s.referenced,
                            format!("port `{name}` uses driver `afxdp`, so a `sim` section makes no sense here"),
                        ));
                    }
                    let Some(a) = &p.afxdp else {
                        return Err(err(
                            p.driver.referenced,
                            format!(
                                "port `{name}` uses driver `afxdp` but has no `afxdp:` section naming its interface"
                            ),
                        ));
                    };
                    let ifname = &a.value.interface.value;
                    if ifname.is_empty() || ifname.len() >= 16 {
                        return Err(err(
                            a.value.interface.referenced,
                            format!("interface name `{ifname}` is not valid: expected 1-15 characters"),
                        ));
                    }
                    if let Some(q) = &a.value.queues {
                        if q.value.is_empty() {
                            return Err(err(
                                q.referenced,
                                "afxdp.queues is empty: list at least one queue id, or leave it out for all".into(),
                            ));
                        }
                    }
                    if let Some(r) = &a.value.ring_size {
                        if !r.value.is_power_of_two() || !(64..=16384).contains(&r.value) {
                            return Err(err(
                                r.referenced,
                                format!("ring_size {} is not valid: expected a power of two from 64 to 16384", r.value),
                            ));
                        }
                    }
                }
            }
        }
        if let Some(h) = &self.host {
            let name = &h.name.value;
            if let Some(first) = names.get(name.as_str()) {
                return Err(err(
                    h.name.referenced,
                    format!("host port name `{name}` is already used by the port at line {}", first.line()),
                ));
            }
            let tap = &h.tap.value;
            if tap.is_empty() || tap.len() > 15 {
                return Err(err(h.tap.referenced, format!("TAP name `{tap}` is not valid: expected 1-15 characters")));
            }
            if let Err(e) = wasmswitch_tap::parse_mac(&h.mac.value) {
                return Err(err(h.mac.referenced, format!("{e}")));
            }
            if !(1..=16).contains(&h.workers.value) {
                return Err(err(
                    h.workers.referenced,
                    format!("host.workers {} is out of range: expected 1-16", h.workers.value),
                ));
            }
            if !(1..=64).contains(&h.bulk.value) {
                return Err(err(
                    h.bulk.referenced,
                    format!("host.bulk {} is out of range: expected 1-64", h.bulk.value),
                ));
            }
            if !h.ring_size.value.is_power_of_two() || !(16..=65536).contains(&h.ring_size.value) {
                return Err(err(
                    h.ring_size.referenced,
                    format!(
                        "host.ring_size {} is not valid: expected a power of two from 16 to 65536",
                        h.ring_size.value
                    ),
                ));
            }
        }
        let needed = self.frames_needed();
        if (self.pool.frames.value as usize) < needed {
            return Err(err(
                self.pool.frames.referenced,
                format!(
                    "pool.frames {} is too small for these ports and workers: at least {needed} are needed",
                    self.pool.frames.value
                ),
            ));
        }
        Ok(())
    }

    fn check_sim(
        &self,
        name: &str,
        sim: &SimSection,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if !(1..=64).contains(&sim.queues.value) {
            return Err(err(
                sim.queues.referenced,
                format!("port `{name}`: queues {} is out of range: expected 1-64", sim.queues.value),
            ));
        }
        let Some(t) = &sim.traffic else { return Ok(()) };
        let b = t.broadcast_percent.value;
        if !(0.0..=100.0).contains(&b) {
            return Err(err(
                t.broadcast_percent.referenced,
                format!("broadcast_percent {b} is out of range: expected 0-100"),
            ));
        }
        let max = self.pool.frame_size.value as usize - 256;
        if t.frame_sizes.value.is_empty() {
            return Err(err(t.frame_sizes.referenced, "frame_sizes is empty: list at least one size in bytes".into()));
        }
        if let Some(&bad) = t.frame_sizes.value.iter().find(|&&s| !(60..=max).contains(&s)) {
            return Err(err(t.frame_sizes.referenced, format!("frame size {bad} is out of range: expected 60-{max}")));
        }
        if let Some(v) = &t.vlan {
            if !(1..=4094).contains(&v.value) {
                return Err(err(v.referenced, format!("vlan {} is out of range: expected 1-4094", v.value)));
            }
        }
        for to in t.to.iter().flatten() {
            if self.port_index(&to.value).is_none() {
                return Err(err(
                    to.referenced,
                    format!("unknown port `{}` in traffic.to: expected one of {}", to.value, self.port_names()),
                ));
            }
        }
        Ok(())
    }

    fn port_names(&self) -> String {
        self.ports.iter().map(|p| format!("`{}`", p.name.value)).collect::<Vec<_>>().join(", ")
    }

    /// Frames the configured rings and caches can hold at once, plus room for flooding.
    pub fn frames_needed(&self) -> usize {
        let workers = self.workers.len();
        let mut n = workers * (self.pool.cache + 16) + 1024;
        for p in &self.ports {
            n += match (&p.sim, &p.afxdp) {
                (Some(s), _) => s.value.queues.value as usize * s.value.ring_size * 2,
                (None, Some(a)) => {
                    // Per queue: a full fill ring (frames the kernel may move to RX) and a full
                    // TX ring in flight.
                    let r = a.value.ring_size.as_ref().map_or_else(wasmswitch_afxdp::RingSizes::default, |r| {
                        wasmswitch_afxdp::RingSizes::all(r.value)
                    });
                    let per_queue = r.fill as usize + r.tx as usize;
                    a.value.queues.as_ref().map_or(1, |q| q.value.len()).max(workers) * per_queue
                }
                (None, None) => 2 * default_ring_size() * workers,
            };
        }
        if let Some(h) = &self.host {
            // Both directions' rings per (datapath worker, host worker) pair, plus reads in flight.
            n += 2 * workers * h.workers.value * h.ring_size.value + h.workers.value * 256;
        }
        n
    }
}

/// The library's message without its own "error: line X column Y:" prefix (we print
/// file:line:col), and with the offending key named when the library only names a type.
fn plain_message(e: &serde_saphyr::Error, text: &str, line: u64) -> String {
    let full = e.to_string();
    let mut msg = full.lines().next().unwrap_or("invalid YAML").trim();
    msg = msg.strip_prefix("error: ").unwrap_or(msg);
    if msg.starts_with("line ") {
        if let Some(i) = msg.find(": ") {
            msg = &msg[i + 2..];
        }
    }
    if let Some(ty) = msg.strip_prefix("invalid ") {
        let key = text
            .lines()
            .nth(line.saturating_sub(1) as usize)
            .and_then(|l| l.split_once(':'))
            .map(|(k, _)| k.trim().trim_start_matches("- ").to_string())
            .filter(|k| !k.is_empty());
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
    msg.to_string()
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

#[cfg(test)]
mod tests;
