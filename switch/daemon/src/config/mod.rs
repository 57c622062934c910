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
use wasmswitch_core::wire::MacAddr;

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
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
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

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
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

/// A MAC address written `02:ee:00:00:00:01`, parsed when the file is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub MacAddr);

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map(Mac).map_err(serde::de::Error::custom)
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

/// A port's or UMEM group's name: 1-32 letters, digits, `-`, `_` or `.`.
fn is_name(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A default value: it has no place in the file.
fn unknown<T>(v: T) -> Spanned<T> {
    Spanned::new(v, Location::UNKNOWN, Location::UNKNOWN)
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

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct FdbSection {
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

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// CPU to pin the worker to; unpinned when absent.
    #[serde(default)]
    pub cpu: Option<Spanned<usize>>,
    #[serde(default = "default_idle")]
    pub idle: Spanned<Idle>,
}

fn default_idle() -> Spanned<Idle> {
    unknown(Idle::Poll)
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    Sim,
    Afxdp,
}

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    pub name: Spanned<String>,
    pub driver: Spanned<DriverKind>,
    /// Largest L3 payload; frames longer than mtu + 14 + 8 (two VLAN tags) are dropped.
    #[serde(default = "default_mtu")]
    pub mtu: Spanned<u32>,
    #[serde(default)]
    pub sim: Option<Spanned<SimSection>>,
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

/// What a plugin's packets get when it faults or is quarantined: the plugin host's own enum.
pub use wasmswitch_plugin_host::OnError;

/// One plugin of a port's ingress chain.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
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

fn default_mtu() -> Spanned<u32> {
    unknown(1500)
}

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SimSection {
    #[serde(default = "one")]
    pub queues: Spanned<u16>,
    #[serde(default = "default_ring_size")]
    pub ring_size: Spanned<usize>,
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
fn default_ring_size() -> Spanned<usize> {
    unknown(1024)
}

#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TrafficSection {
    /// Packets per second per queue; unlimited when absent.
    #[serde(default)]
    pub rate_pps: Option<Spanned<u64>>,
    #[serde(default = "default_src_macs")]
    pub src_macs: Spanned<u32>,
    #[serde(default = "default_sizes")]
    pub frame_sizes: Spanned<Vec<usize>>,
    #[serde(default = "default_bcast")]
    pub broadcast_percent: Spanned<f64>,
    #[serde(default = "default_flows")]
    pub flows: Spanned<u32>,
    /// Tag the frames with this VLAN, or spread them over a list of VLANs (each source MAC
    /// speaks in one of them and addresses hosts of the same one): `vlan: 10`,
    /// `vlan: [10, "20-22"]`.
    #[serde(default)]
    pub vlan: Option<Spanned<l2::VidList>>,
    /// Ports whose hosts this traffic is addressed to (default: every other sim port).
    #[serde(default)]
    pub to: Option<Vec<Spanned<String>>>,
    /// IP version of the frames: 4 or 6.
    #[serde(default = "default_ip")]
    pub ip: Spanned<u8>,
    #[serde(default)]
    pub proto: TrafficProto,
    /// TCP flags of every segment, as letters: `S` (SYN), `A` (ACK), `F`, `R`, `P`; e.g. `SA`.
    #[serde(default)]
    pub tcp_flags: Option<Spanned<String>>,
    /// Destination TCP/UDP port.
    #[serde(default = "default_dst_port")]
    pub dst_port: Spanned<u16>,
}

/// What generated traffic carries above IP.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TrafficProto {
    #[default]
    Udp,
    Tcp,
}

fn default_ip() -> Spanned<u8> {
    unknown(4)
}
fn default_dst_port() -> Spanned<u16> {
    unknown(5001)
}

impl TrafficSection {
    /// The TCP flag byte of `tcp_flags` (SYN when not given), or the letter that is not one.
    pub fn tcp_flag_bits(&self) -> Result<u8, char> {
        use wasmswitch_core::wire::build::tcp_flags as f;
        let Some(letters) = &self.tcp_flags else { return Ok(f::SYN) };
        letters.value.chars().try_fold(0u8, |acc, c| {
            Ok(acc
                | match c.to_ascii_uppercase() {
                    'S' => f::SYN,
                    'A' => f::ACK,
                    'F' => f::FIN,
                    'R' => f::RST,
                    'P' => f::PSH,
                    _ => return Err(c),
                })
        })
    }
}

fn default_src_macs() -> Spanned<u32> {
    unknown(256)
}
fn default_sizes() -> Spanned<Vec<usize>> {
    Spanned::new(vec![64], Location::UNKNOWN, Location::UNKNOWN)
}
fn default_bcast() -> Spanned<f64> {
    Spanned::new(5.0, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_flows() -> Spanned<u32> {
    unknown(1024)
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Chosen by the driver profile.
    #[default]
    Auto,
    Native,
    Generic,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BindMode {
    #[default]
    Auto,
    Copy,
    Zerocopy,
}

#[derive(Deserialize, Serialize, Debug, Clone)]
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
    /// Attach even to `lo` or to the interface that carries `metrics.listen`'s address (the
    /// switch would take the host's own traffic, the control API's included).
    #[serde(default)]
    pub allow_control_interface: bool,
}

impl AfxdpSection {
    /// What the AF_XDP library is asked to open for this section (its profile decides the rest).
    pub fn spec(&self) -> wasmswitch_afxdp::PortSpec {
        let a = self;
        let mut spec = wasmswitch_afxdp::PortSpec::new(a.interface.value.clone());
        spec.overrides = wasmswitch_afxdp::Overrides {
            attach: match a.mode {
                AttachMode::Auto => None,
                AttachMode::Native => Some(wasmswitch_afxdp::AttachMode::Native),
                AttachMode::Generic => Some(wasmswitch_afxdp::AttachMode::Generic),
            },
            bind: match a.bind {
                BindMode::Auto => None,
                BindMode::Copy => Some(wasmswitch_afxdp::BindMode::Copy),
                BindMode::Zerocopy => Some(wasmswitch_afxdp::BindMode::ZeroCopy),
            },
            queues: a.queues.as_ref().map(|q| q.value.clone()),
            rings: a.ring_size.as_ref().map(|r| wasmswitch_afxdp::RingSizes::all(r.value)),
            complete_partial_checksums: match a.partial_checksums {
                PartialChecksums::Auto => None,
                PartialChecksums::Complete => Some(true),
                PartialChecksums::Keep => Some(false),
            },
        };
        spec
    }
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
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
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// The port's name in the switch (metrics, API, `to:` lists).
    #[serde(default = "default_host_name")]
    pub name: Spanned<String>,
    /// TAP device name (at most 15 bytes).
    pub tap: Spanned<String>,
    /// MAC address of the TAP (the host's own address on the switch).
    #[serde(default = "default_host_mac")]
    pub mac: Spanned<Mac>,
    #[serde(default = "default_mtu")]
    pub mtu: Spanned<u32>,
    /// Host worker threads (one TAP queue each).
    #[serde(default = "one_usize")]
    pub workers: Spanned<usize>,
    /// Entries of each ring between a datapath worker and a host worker.
    #[serde(default = "default_host_ring")]
    pub ring_size: Spanned<usize>,
    /// Frames per delivery (cpumap's bulk is 8), 1-64.
    #[serde(default = "default_host_bulk")]
    pub bulk: Spanned<usize>,
    /// The host port's VLANs (as a port's `vlan:`); an access port of VLAN 1 when absent.
    #[serde(default)]
    pub vlan: Option<l2::VlanSection>,
}

fn default_host_name() -> Spanned<String> {
    Spanned::new("host".into(), Location::UNKNOWN, Location::UNKNOWN)
}
fn default_host_mac() -> Spanned<Mac> {
    unknown(Mac(MacAddr([0x02, 0xee, 0, 0, 0, 1])))
}
fn one_usize() -> Spanned<usize> {
    Spanned::new(1, Location::UNKNOWN, Location::UNKNOWN)
}
// The host port's defaults are the library's, written once there.
fn default_host_ring() -> Spanned<usize> {
    unknown(wasmswitch_tap::HostConfig::default().ring_size)
}
fn default_host_bulk() -> Spanned<usize> {
    unknown(wasmswitch_tap::HostConfig::default().bulk)
}

/// Frames past the MTU: Ethernet header plus two VLAN tags.
pub fn max_frame(mtu: u32) -> usize {
    mtu as usize + 14 + 8
}

/// The longest frame a port of MTU `mtu` sends: [`max_frame`], but 4 bytes less on a veth. A
/// veth passes a frame to its peer only up to the peer's MTU plus 18 bytes (Ethernet header and
/// one tag: the kernel's `is_skb_forwardable`), and AF_XDP hands it every tag inside the frame;
/// a longer frame would be dropped by the kernel after the switch had counted it as sent.
pub fn max_tx_frame(mtu: u32, veth: bool) -> usize {
    if veth {
        mtu as usize + 14 + 4
    } else {
        max_frame(mtu)
    }
}

/// The whole file.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub switch: SwitchSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub control: ControlSection,
    #[serde(default)]
    pub pool: PoolSection,
    #[serde(default)]
    pub fdb: FdbSection,
    #[serde(default = "default_workers")]
    pub workers: Vec<WorkerSection>,
    pub ports: Vec<PortSection>,
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
    pub const BATCH: (usize, usize) = (1, wasmswitch_core::BATCH_SIZE);
    pub const FRAMES: (u32, u32) = (1024, 1 << 20);
    pub const CACHE: (usize, usize) = (16, 4096);
    pub const RING: (usize, usize) = (16, 1 << 20);
    pub const FDB_CAPACITY: (usize, usize) = (64, 1 << 24);
    pub const AGING_SECONDS: (u32, u32) = (1, 86_400);
    pub const WORKERS: (usize, usize) = (1, 64);
    pub const PORTS: (usize, usize) = (1, 64);
    /// Distinct `umem:` names: each group maps `pool.frames` frames of its own.
    pub const UMEM_GROUPS: (usize, usize) = (0, 4);
    pub const MTU_MIN: u32 = 68;
    pub const SIM_QUEUES: (u16, u16) = (1, 64);
    pub const SIM_RING: (usize, usize) = (64, 16384);
    pub const RATE_PPS: (u64, u64) = (1, 1_000_000_000);
    pub const SRC_MACS: (u32, u32) = (1, 1 << 20);
    pub const FLOWS: (u32, u32) = (1, 1 << 20);
    pub const FRAME_SIZES_LEN: (usize, usize) = (1, 1024);
    pub const AFXDP_QUEUES_LEN: (usize, usize) = (1, 64);
    pub const AFXDP_QUEUE_ID: (u32, u32) = (0, 1023);
    pub const AFXDP_RING: (u32, u32) = (64, 16384);
    pub const PLUGINS_PER_PORT: (usize, usize) = (0, 8);
    pub const HEADER_BYTES: (u16, u16) = (0, 1024);
    /// 10 ms: a plugin that spins is stopped after one to two deadlines as the 1 ms epoch
    /// clock enforces them (`deadline_as_enforced`: 11 ms here), so one call holds its worker
    /// for at most about 22 ms.
    pub const DEADLINE_US: (u64, u64) = (10, 10_000);
    pub const MEMORY_KIB: (usize, usize) = (64, 4_194_304);
    /// With the deadline bound, a plugin that overruns every call costs its worker at most
    /// 100 × 20 ms = 2 s in all before it is quarantined (and answers by `on_error` after).
    pub const MAX_FAULTS: (u32, u32) = (1, 100);
    /// Sum of every plugin's enforced deadline (`deadline_as_enforced`) over every port: a
    /// round in which every plugin overruns takes at most about twice this (200 ms), which
    /// bounds how late a worker sees a stop or a swap and stays inside `/healthz`'s 1 s stall
    /// bound.
    pub const MAX_TOTAL_DEADLINE_US: u64 = 100_000;
    pub const HOST_WORKERS: (usize, usize) = (1, 16);
    pub const HOST_BULK: (usize, usize) = (1, 64);
    pub const HOST_RING: (usize, usize) = (16, 65536);
}

/// `a`, or `b` when `a` is a default with no place in the file.
pub(super) fn or_loc(a: Location, b: Location) -> Location {
    if a == Location::UNKNOWN {
        b
    } else {
        a
    }
}

/// Largest MTU a frame of `frame_size` bytes carries: the headroom (256 bytes), Ethernet header
/// and two VLAN tags (22 bytes) come off (1770 for 2048, 3818 for 4096).
pub fn max_mtu(frame_size: u32) -> u32 {
    frame_size.saturating_sub(HEADROOM + 22)
}

// `key` out of [lo, hi]: located at the value, naming the key and the range.
fn within<T: PartialOrd + fmt::Display + Copy>(
    err: &impl Fn(Location, String) -> ConfigError,
    key: &str,
    v: &Spanned<T>,
    (lo, hi): (T, T),
) -> Result<(), ConfigError> {
    if v.value < lo || v.value > hi {
        return Err(err(v.referenced, format!("{key} {} is out of range: expected {lo}-{hi}", v.value)));
    }
    Ok(())
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
                    self.check_afxdp(p, &mut interfaces, &err)?;
                }
            }
        }
        if let Some(h) = &self.host {
            self.check_host(h, &names, &interfaces, &err)?;
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
        let allowed = wasmswitch_afxdp::sys::cpus_of_this_thread().ok();
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

    /// An `afxdp` port: its section, its interface (one port each, not the control API's
    /// unless allowed), queues and rings, and what `run` would find on the interface here.
    fn check_afxdp<'a>(
        &'a self,
        p: &'a PortSection,
        interfaces: &mut HashMap<&'a str, (&'a str, Location)>,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let name = &p.name.value;
        if let Some(s) = &p.sim {
            return Err(err(
                s.referenced,
                format!("port `{name}` uses driver `afxdp`, so a `sim` section makes no sense here"),
            ));
        }
        let Some(a) = &p.afxdp else {
            return Err(err(
                p.driver.referenced,
                format!("port `{name}` uses driver `afxdp` but has no `afxdp:` section naming its interface"),
            ));
        };
        let ifname = &a.value.interface.value;
        if ifname.is_empty() || ifname.len() >= 16 {
            return Err(err(
                a.value.interface.referenced,
                format!("interface name `{ifname}` is not valid: expected 1-15 characters"),
            ));
        }
        if let Some((other, at)) = interfaces.insert(ifname, (name, a.value.interface.referenced)) {
            return Err(err(
                a.value.interface.referenced,
                format!(
                    "port `{name}`: interface {ifname} is already port `{other}`'s (line {}); an interface takes one XDP program, so one port (list its queues there)",
                    at.line()
                ),
            ));
        }
        let listen = self.listen_addr().ip();
        let api_addr =
            interfaces_with(|a| listens_on(listen, a)).into_iter().find(|(i, _)| i == ifname).map(|(_, a)| a);
        if (ifname == "lo" || api_addr.is_some()) && !a.value.allow_control_interface {
            let carries = match api_addr {
                _ if ifname == "lo" => "the host's loopback traffic".to_string(),
                Some(a) if a == listen => format!("the control API's address {listen}"),
                Some(a) => format!("{a}, where the control API listens (metrics.listen on {listen})"),
                None => unreachable!("checked above"),
            };
            return Err(err(
                a.value.interface.referenced,
                format!(
                    "port `{name}`: interface {ifname} carries {carries}: attaching to it would take the host's own traffic{}; set `allow_control_interface: true` in this `afxdp:` section if that is what you want",
                    if listen.is_loopback() || api_addr.is_some() { ", the control API's included" } else { "" }
                ),
            ));
        }
        if let Some(q) = &a.value.queues {
            let (lo, hi) = range::AFXDP_QUEUES_LEN;
            if !(lo..=hi).contains(&q.value.len()) {
                return Err(err(
                    q.referenced,
                    format!(
                        "afxdp.queues lists {} queue ids: expected {lo}-{hi}, or leave it out for all",
                        q.value.len()
                    ),
                ));
            }
            let (lo, hi) = range::AFXDP_QUEUE_ID;
            if let Some(bad) = q.value.iter().find(|&&id| !(lo..=hi).contains(&id)) {
                return Err(err(
                    q.referenced,
                    format!("afxdp.queues: queue id {bad} is out of range: expected {lo}-{hi}"),
                ));
            }
            let mut seen = q.value.clone();
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(err(q.referenced, format!("afxdp.queues: queue id {} is listed twice", w[0])));
            }
        }
        if let Some(r) = &a.value.ring_size {
            let (lo, hi) = range::AFXDP_RING;
            if !r.value.is_power_of_two() || !(lo..=hi).contains(&r.value) {
                return Err(err(
                    r.referenced,
                    format!("ring_size {} is not valid: expected a power of two from {lo} to {hi}", r.value),
                ));
            }
        }
        // Where the interface exists here, what `run` would find there: a queue it
        // lacks, or zero-copy its driver does not offer, is refused now as `run`
        // would refuse it (a missing interface is `check`'s warning: the config may
        // be for another machine).
        if wasmswitch_afxdp::sys::ifindex(ifname).is_some() {
            if let Err(e) = wasmswitch_afxdp::preflight(&a.value.spec()) {
                let at = match (&e, &a.value.queues) {
                    (wasmswitch_afxdp::AfXdpError::QueueOutOfRange { .. }, Some(q)) => q.referenced,
                    _ => a.value.interface.referenced,
                };
                return Err(err(at, e.to_string()));
            }
        }
        Ok(())
    }

    /// The host port: its name among the ports', its TAP (a name of its own, free, a unicast
    /// MAC), MTU, workers, bulk and rings.
    fn check_host(
        &self,
        h: &HostSection,
        names: &HashMap<&str, Location>,
        interfaces: &HashMap<&str, (&str, Location)>,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let fs = self.pool.frame_size.value;
        let mtu_range = (range::MTU_MIN, max_mtu(fs));
        let name = &h.name.value;
        // It is a port like the others: in metrics labels, the API and plugin logs.
        if !is_name(name) {
            return Err(err(
                h.name.referenced,
                format!("host port name `{name}` is not valid: expected 1-32 letters, digits, `-`, `_` or `.`"),
            ));
        }
        if let Some(first) = names.get(name.as_str()) {
            return Err(err(
                h.name.referenced,
                format!("host port name `{name}` is already used by the port at line {}", first.line()),
            ));
        }
        if let Some((port, _)) = interfaces.get(h.tap.value.as_str()) {
            return Err(err(
                h.tap.referenced,
                format!("host.tap `{}` is port `{port}`'s interface; the TAP needs a name of its own", h.tap.value),
            ));
        }
        // The same rule as when the TAP is made, so that `check` refuses what `run` would.
        if let Err(e) = wasmswitch_tap::check_name(&h.tap.value).and_then(|()| wasmswitch_tap::check_free(&h.tap.value))
        {
            return Err(err(h.tap.referenced, format!("{e}")));
        }
        if let Err(e) = wasmswitch_tap::check_mac(h.mac.value.0) {
            return Err(err(h.mac.referenced, format!("{e}")));
        }
        // One byte less than a port's: the TAP is read into the frame past its headroom, and
        // a frame that fills that room could have been cut short (tun truncates to the
        // read); a frame the MTU admits must not fill it, so that one that does is dropped
        // as oversize, never forwarded truncated.
        let host_mtu = (mtu_range.0, mtu_range.1 - 1);
        if !(host_mtu.0..=host_mtu.1).contains(&h.mtu.value) {
            return Err(err(
                h.mtu.referenced,
                format!(
                    "host.mtu {} is out of range: expected {}-{} ({fs}-byte frames less {HEADROOM} bytes of headroom and 22 of Ethernet and VLAN headers, less one byte to tell a frame cut short by the TAP read)",
                    h.mtu.value, host_mtu.0, host_mtu.1
                ),
            ));
        }
        within(&err, "host.workers", &h.workers, range::HOST_WORKERS)?;
        within(&err, "host.bulk", &h.bulk, range::HOST_BULK)?;
        let (lo, hi) = range::HOST_RING;
        if !h.ring_size.value.is_power_of_two() || !(lo..=hi).contains(&h.ring_size.value) {
            return Err(err(
                h.ring_size.referenced,
                format!("host.ring_size {} is not valid: expected a power of two from {lo} to {hi}", h.ring_size.value),
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
        let (lo, hi) = range::SIM_QUEUES;
        if !(lo..=hi).contains(&sim.queues.value) {
            return Err(err(
                sim.queues.referenced,
                format!("port `{name}`: queues {} is out of range: expected {lo}-{hi}", sim.queues.value),
            ));
        }
        let (lo, hi) = range::SIM_RING;
        if !(lo..=hi).contains(&sim.ring_size.value) {
            return Err(err(
                sim.ring_size.referenced,
                format!("port `{name}`: ring_size {} is out of range: expected {lo}-{hi}", sim.ring_size.value),
            ));
        }
        let Some(t) = &sim.traffic else { return Ok(()) };
        if let Some(r) = &t.rate_pps {
            let (lo, hi) = range::RATE_PPS;
            if !(lo..=hi).contains(&r.value) {
                return Err(err(r.referenced, format!("rate_pps {} is out of range: expected {lo}-{hi}", r.value)));
            }
        }
        for (key, v, (lo, hi)) in [("src_macs", &t.src_macs, range::SRC_MACS), ("flows", &t.flows, range::FLOWS)] {
            if !(lo..=hi).contains(&v.value) {
                return Err(err(v.referenced, format!("{key} {} is out of range: expected {lo}-{hi}", v.value)));
            }
        }
        let b = t.broadcast_percent.value;
        if !(0.0..=100.0).contains(&b) {
            return Err(err(
                t.broadcast_percent.referenced,
                format!("broadcast_percent {b} is out of range: expected 0-100"),
            ));
        }
        let max = (self.pool.frame_size.value - HEADROOM) as usize;
        if t.frame_sizes.value.is_empty() {
            return Err(err(t.frame_sizes.referenced, "frame_sizes is empty: list at least one size in bytes".into()));
        }
        if t.frame_sizes.value.len() > range::FRAME_SIZES_LEN.1 {
            return Err(err(
                t.frame_sizes.referenced,
                format!("frame_sizes lists {} sizes: at most {}", t.frame_sizes.value.len(), range::FRAME_SIZES_LEN.1),
            ));
        }
        if let Some(&bad) = t.frame_sizes.value.iter().find(|&&s| !(60..=max).contains(&s)) {
            return Err(err(t.frame_sizes.referenced, format!("frame size {bad} is out of range: expected 60-{max}")));
        }
        if t.ip.value != 4 && t.ip.value != 6 {
            return Err(err(t.ip.referenced, format!("ip {} is not an IP version: expected 4 or 6", t.ip.value)));
        }
        if let Some(fl) = &t.tcp_flags {
            if t.proto != TrafficProto::Tcp {
                return Err(err(fl.referenced, "tcp_flags needs proto: tcp".to_string()));
            }
            if let Err(c) = t.tcp_flag_bits() {
                return Err(err(
                    fl.referenced,
                    format!("tcp_flags `{}`: `{c}` is not a flag (expected letters of S, A, F, R, P)", fl.value),
                ));
            }
        }
        if let Some(v) = &t.vlan {
            let vids = v.value.expand("vlan").map_err(|e| err(v.referenced, e))?;
            if vids.is_empty() || vids.len() > 64 {
                return Err(err(v.referenced, format!("vlan lists {} VLANs: expected 1-64", vids.len())));
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

    /// What an AF_XDP port's interface here says against the port's settings, one line each:
    /// an interface MTU above the port's `mtu` (its hosts send frames the port drops as
    /// oversize: TCP between them stalls on the first full-size segment) or below it (frames
    /// over it leaving there are dropped by the kernel), and generic mode on a veth (the
    /// kernel's slow path: TCP through it crawls). Warnings, not errors: the interface may be
    /// set up after `check`. Ports whose interface is not here say nothing.
    pub fn interface_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let most = max_mtu(self.pool.frame_size.value);
        for p in &self.ports {
            let Some(a) = &p.afxdp else { continue };
            let (name, iface, mtu) = (&p.name.value, &a.value.interface.value, p.mtu.value);
            let Ok(raw) = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu")) else { continue };
            let Ok(iface_mtu) = raw.trim().parse::<u32>() else { continue };
            if iface_mtu > mtu {
                let fix = if iface_mtu <= most {
                    format!("give the port `mtu: {iface_mtu}`")
                } else {
                    format!(
                        "`mtu: {iface_mtu}` needs a larger pool.frame_size (its {}-byte frames hold {most} at most)",
                        self.pool.frame_size.value
                    )
                };
                out.push(format!(
                    "port `{name}`: interface {iface} has MTU {iface_mtu}, above the port's mtu {mtu}: frames of more than {} bytes from it are dropped as oversize, and TCP between hosts with that MTU stalls; {fix}, or lower the interface's MTU",
                    max_frame(mtu)
                ));
            } else if iface_mtu < mtu {
                out.push(format!(
                    "port `{name}`: interface {iface} has MTU {iface_mtu}, below the port's mtu {mtu}: frames over {iface_mtu} bytes of payload sent there are dropped by the kernel (afxdp_tx_kernel_drops)"
                ));
            }
            if a.value.mode == AttachMode::Generic
                && wasmswitch_afxdp::sys::driver_name(iface).is_ok_and(|d| d == "veth")
            {
                out.push(format!(
                    "port `{name}`: interface {iface} is a veth in generic (SKB) mode: TCP through it runs far slower than in native mode, the veth default (see README, Real traffic)"
                ));
            }
        }
        out
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
                (Some(s), _) => m(m(s.value.queues.value as u64, s.value.ring_size.value as u64), 2),
                (None, Some(a)) => {
                    // Per queue: a full fill ring (frames the kernel may move to RX) and a full
                    // TX ring in flight. Where the interface exists here, the queues and rings
                    // `run` will open (without `queues:`, every queue it has); elsewhere what
                    // the config says.
                    let (queues, r) = if wasmswitch_afxdp::sys::ifindex(&a.value.interface.value).is_some() {
                        let d = wasmswitch_afxdp::decide(&a.value.spec());
                        (d.queues.len() as u64, d.rings)
                    } else {
                        let r = a.value.ring_size.as_ref().map_or_else(wasmswitch_afxdp::RingSizes::default, |r| {
                            wasmswitch_afxdp::RingSizes::all(r.value)
                        });
                        (a.value.queues.as_ref().map_or(1, |q| q.value.len() as u64), r)
                    };
                    m(queues.max(workers), r.fill as u64 + r.tx as u64)
                }
                (None, None) => m(m(2, default_ring_size().value as u64), workers),
            });
        }
        if let Some(h) = &self.host {
            // Both directions' rings per (datapath worker, host worker) pair, plus reads in flight.
            let hw = h.workers.value as u64;
            n = n.saturating_add(m(m(m(2, workers), hw), h.ring_size.value as u64)).saturating_add(m(hw, 256));
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

/// Whether a server bound to `listen` answers on `addr`: a wildcard is every address of its
/// family (`[::]` takes IPv4 too; IPv6 link-local addresses need a scope, so not those).
fn listens_on(listen: std::net::IpAddr, addr: std::net::IpAddr) -> bool {
    match listen {
        l if !l.is_unspecified() => addr == l,
        std::net::IpAddr::V4(_) => addr.is_ipv4(),
        std::net::IpAddr::V6(_) => !matches!(addr, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local()),
    }
}

/// Every (interface, address) of this namespace whose address `wanted` accepts.
fn interfaces_with(wanted: impl Fn(std::net::IpAddr) -> bool) -> Vec<(String, std::net::IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says which struct it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET means a sockaddr_in.
                let a = unsafe { *ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                std::net::IpAddr::from(a.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 means a sockaddr_in6.
                let a = unsafe { *ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                std::net::IpAddr::from(a.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        if wanted(addr) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            out.push((unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned(), addr));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
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
