//! HTTP endpoint on localhost: `/metrics`, `/healthz` and a small JSON control API.
//!
//! The API knows the daemon only through [`Control`], so it never waits on a lock a reload
//! holds: reloads run on the daemon's control thread and the handler awaits their answer. The
//! server is our own accept loop over hyper's HTTP/1 connection (not `axum::serve`) so that a
//! client cannot hold it: request heads must arrive within [`Limits::header_read`] (this also
//! closes idle keep-alive connections), a connection lives at most [`Limits::connection`],
//! at most [`Limits::max_connections`] are open at once, and shutdown waits at most
//! [`Limits::shutdown_grace`] for requests in flight.
//!
//! Access ([`guard`], one layer over every route, so an endpoint added later is covered
//! without doing anything): a request whose `Host` is not this server (DNS rebinding: a web
//! page's script reaching the loopback listener under its own domain name) is refused with 421.
//! A mutating request (any method but GET and HEAD) is refused with 403 if it carries an
//! `Origin` (a browser sent it), with 401 unless it carries the configured bearer token
//! (`control.token_file`), and with 413 if its body is over [`MAX_BODY_BYTES`]; each one is
//! logged with the peer, method, path and status, at most one line per kind (status and
//! reason, or method and route when it succeeded) every [`REFUSAL_LOG_EVERY`], and a count of
//! those not logged when that period ends.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Path, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use wasmswitch_core::fdb::MacPrefix;
use wasmswitch_core::vlan::Vid;
use wasmswitch_core::wire::MacAddr;

/// Why a reload or a shadow change did not simply apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeError {
    /// Refused: nothing was changed. The file's or the client's to fix (answered 422).
    Refused(String),
    /// Applied, but some worker did not take it in time (it takes it when it next completes a
    /// round): the switch's own trouble (answered 500). Says which workers and what applied.
    AppliedLate(String),
}

impl ChangeError {
    /// The HTTP status the API answers it with.
    pub fn status(&self) -> StatusCode {
        match self {
            ChangeError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ChangeError::AppliedLate(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// How the control-plane metrics count it.
    pub fn outcome(&self) -> ReloadOutcome {
        match self {
            ChangeError::Refused(_) => ReloadOutcome::Refused,
            ChangeError::AppliedLate(_) => ReloadOutcome::Late,
        }
    }
}

/// How the message of a change applied late begins, for whoever reads it (log, API answer).
pub const APPLIED_LATE: &str = "applied late: ";

impl fmt::Display for ChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeError::Refused(why) => f.write_str(why),
            ChangeError::AppliedLate(what) => write!(f, "{APPLIED_LATE}{what}"),
        }
    }
}

impl std::error::Error for ChangeError {}

/// The result of a reload: its summary, or why it did not simply apply.
pub type ReloadResult = Result<String, ChangeError>;

/// The result of a shadow promotion or discard: the answer's JSON, or why not.
pub type ShadowResult = Result<serde_json::Value, ChangeError>;

/// Why a reload request was not started.
#[derive(Debug)]
pub enum ReloadBusy {
    /// Another reload is running; one at a time.
    InProgress,
    /// The daemon is shutting down.
    ShuttingDown,
}

/// What the HTTP API needs from the daemon. Every method returns quickly: none of them may
/// wait for a reload.
pub trait Control: Send + Sync + 'static {
    /// Prometheus text exposition.
    fn metrics(&self) -> String;
    /// Ok, or which worker is unhealthy and why.
    fn health(&self) -> Result<(), String>;
    /// Every running port with its driver, state and packet totals (`GET /api/v1/ports`).
    fn ports_json(&self) -> serde_json::Value;
    /// One page of the FDB listing (`GET /api/v1/fdb`): bounded by [`FDB_PAGE_MAX`] entries and
    /// [`FDB_PAGE_SCAN`] slots looked at, whatever the table holds.
    fn fdb_page(&self, query: &FdbQuery) -> Result<FdbPage, FdbPageError>;
    /// An FDB edit (lock-free table operations: quick); the answer's JSON, or why not.
    fn fdb_change(&self, change: FdbChange) -> Result<serde_json::Value, String>;
    /// Every plugin instance with its state and counters (`GET /api/v1/plugins`).
    fn plugins_json(&self) -> serde_json::Value;
    /// The config the switch runs (after the last reload that applied).
    fn config_json(&self) -> serde_json::Value;
    /// Starts a reload on the control thread; the receiver gets its result.
    fn start_reload(&self) -> Result<oneshot::Receiver<ReloadResult>, ReloadBusy>;
    /// Every port's shadow chain and its live × shadow verdict matrix.
    fn shadow_json(&self) -> serde_json::Value;
    /// Starts promoting or discarding `port`'s shadow chain on the control thread (one job at
    /// a time, reloads included); the receiver gets its result.
    fn start_shadow(
        &self,
        port: String,
        op: crate::dataplane::ShadowOp,
    ) -> Result<oneshot::Receiver<ShadowResult>, ReloadBusy>;
    /// The token mutating requests must carry (`control.token_file` of the running config),
    /// or `None` when none is configured.
    fn token(&self) -> Option<crate::config::Token>;
}

/// An edit of the FDB through the API (`POST /api/v1/fdb`, `DELETE /api/v1/fdb/{vlan}/{mac}`,
/// `POST /api/v1/fdb/flush`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FdbChange {
    /// A static entry.
    Add {
        /// The station (not a group address).
        mac: MacAddr,
        /// Its VLAN, 1-4094, which `port` must carry.
        vlan: u16,
        /// The port's name: frames to `mac` leave by it.
        port: String,
    },
    /// The entry of `mac` in `vlan`, static or learned.
    Remove {
        /// The entry's MAC.
        mac: MacAddr,
        /// The entry's VLAN, 1-4094.
        vlan: u16,
    },
    /// Every entry matching all the conditions given; static ones only with `statics`.
    Flush {
        /// Only entries on this port (a port's name).
        port: Option<String>,
        /// Only entries in this VLAN.
        vlan: Option<u16>,
        /// Static entries too (learned ones always).
        statics: bool,
    },
}

/// Entries in a page of `GET /api/v1/fdb` when the request names no `limit`.
pub const FDB_PAGE_DEFAULT: usize = 1000;
/// The most entries a page may hold (`limit`): some 90 bytes of JSON each, under 1 MB a page,
/// which a client on a connection of its own has the connection's whole time to read (60 s:
/// 16 KiB/s); one cut short still gets fewer bytes than its `Content-Length`, never a
/// complete-looking answer.
pub const FDB_PAGE_MAX: usize = 10_000;
/// Slots a page looks at, at most, however few of them hold an entry its filters select: 64 Ki
/// buckets (8 MiB of table, a few milliseconds), so a filter that matches nothing costs each
/// request no more than one that matches everything. A table of 16 Mi entries (the largest
/// `fdb.capacity`) takes 32 such pages.
pub const FDB_PAGE_SCAN: usize = 1 << 19;

/// What a `GET /api/v1/fdb` asks: its query parameters, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdbQuery {
    /// 1 to [`FDB_PAGE_MAX`].
    pub limit: usize,
    /// Where the last page ended; `None` for the first.
    pub cursor: Option<FdbCursor>,
    /// A port name (checked against the running ports by the daemon).
    pub port: Option<String>,
    /// A VLAN id, 1-4094.
    pub vlan: Option<Vid>,
    /// A prefix of 0-6 bytes the entries' MACs must start with (empty: any).
    pub mac: MacPrefix,
}

impl Default for FdbQuery {
    fn default() -> Self {
        FdbQuery { limit: FDB_PAGE_DEFAULT, cursor: None, port: None, vlan: None, mac: MacPrefix::default() }
    }
}

/// Where a listing goes on: a slot of one table ([`wasmswitch_core::fdb::Fdb::page`]). Written
/// `<table id, 16 hex digits>-<slot>`; clients pass it back as they got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdbCursor {
    /// The id of the table the listing reads; a new table (a resize, a restart) has a new one.
    pub table: u64,
    /// The slot the next page starts at.
    pub slot: usize,
}

impl std::fmt::Display for FdbCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}-{}", self.table, self.slot)
    }
}

impl std::str::FromStr for FdbCursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parsed = s.split_once('-').and_then(|(t, n)| {
            let digits = |x: &str, hex: bool| {
                !x.is_empty() && x.bytes().all(|b| if hex { b.is_ascii_hexdigit() } else { b.is_ascii_digit() })
            };
            if t.len() != 16 || !digits(t, true) || !digits(n, false) {
                return None;
            }
            Some(FdbCursor { table: u64::from_str_radix(t, 16).ok()?, slot: n.parse().ok()? })
        });
        parsed.ok_or_else(|| {
            format!("`{}` is not a cursor: pass back the `next` of the last page as it came", shorten(s))
        })
    }
}

/// A page of the FDB listing, serialized as the answer of `GET /api/v1/fdb`.
#[derive(Debug, serde::Serialize)]
pub struct FdbPage {
    /// Slots in the table.
    pub capacity: usize,
    /// Entries in the whole table as the aging sweep last counted them (every 100 ms): no page
    /// walks the table to count.
    pub table_entries: usize,
    /// The entries found, in table (hash) order.
    pub entries: Vec<FdbEntry>,
    /// The cursor of the next page, `None` (null) when this one reached the table's end.
    #[serde(serialize_with = "as_text_or_null")]
    pub next: Option<FdbCursor>,
}

/// One entry of an [`FdbPage`].
#[derive(Debug, serde::Serialize)]
pub struct FdbEntry {
    /// The entry's VLAN.
    pub vlan: u16,
    /// The station's MAC (`02:00:00:00:00:01`).
    #[serde(serialize_with = "as_text")]
    pub mac: MacAddr,
    /// `None` (null) for a port that went since the entry was read.
    #[serde(serialize_with = "as_text_or_null")]
    pub port: Option<Arc<str>>,
    /// A static entry (the config's `fdb.static` or the API's): never aged or moved (`static`).
    #[serde(rename = "static")]
    pub is_static: bool,
    /// Seconds since the station's last frame (0 for a static entry).
    pub age_seconds: u32,
}

/// Serializes a value as its `Display` text.
fn as_text<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// [`as_text`], `None` as null.
fn as_text_or_null<T: std::fmt::Display, S: serde::Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Why a page was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FdbPageError {
    /// A filter the switch cannot apply (no such port): 400.
    Bad(String),
    /// The cursor is of a table that is gone (a reload resized it): 409, start again.
    Stale(String),
}

/// At most 40 characters of `s` (a quoted request part in an error), with an ellipsis.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// `%XX` escapes of a query value decoded (a `+` stays a `+`: no value here has a space).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
            let Some(byte) = hex else { return Err(format!("`{}` has a bad %-escape", shorten(s))) };
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{}` is not UTF-8 once decoded", shorten(s)))
}

impl FdbQuery {
    /// The query string of a `GET /api/v1/fdb`, checked: each parameter known, given once, and
    /// in range; else why not (answered 400).
    pub fn parse(query: Option<&str>) -> Result<FdbQuery, String> {
        const KNOWN: &str = "limit, cursor, port, vlan or mac";
        let mut q = FdbQuery::default();
        let mut seen: Vec<&str> = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
            if !KNOWN.split(", ").flat_map(|k| k.split(" or ")).any(|k| k == key) {
                return Err(format!("unknown parameter `{}`: expected {KNOWN}", shorten(key)));
            }
            if seen.contains(&key) {
                return Err(format!("`{key}` is given twice"));
            }
            seen.push(key);
            let v = percent_decode(raw).map_err(|e| format!("{key}: {e}"))?;
            match key {
                "limit" => {
                    let n = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| v.parse::<usize>().unwrap_or(usize::MAX));
                    q.limit = match n {
                        Some(n @ 1..=FDB_PAGE_MAX) => n,
                        _ => {
                            return Err(format!(
                                "limit `{}` is out of range: expected 1-{FDB_PAGE_MAX} (the most one page holds; follow `next` for the rest)",
                                shorten(&v)
                            ))
                        }
                    }
                }
                "cursor" => q.cursor = Some(v.parse()?),
                "port" if v.is_empty() => return Err("port: expected a port's name".into()),
                "port" => q.port = Some(v),
                "vlan" => {
                    let vid = v.parse::<u16>().ok().filter(|&n| n.to_string() == v).and_then(Vid::new);
                    let Some(vid) = vid else {
                        return Err(format!(
                            "vlan `{}` is out of range: expected a VLAN id {}-{}",
                            shorten(&v),
                            Vid::MIN,
                            Vid::MAX
                        ));
                    };
                    q.vlan = Some(vid);
                }
                _ => q.mac = v.parse().map_err(|e| format!("mac: {e}"))?,
            }
        }
        Ok(q)
    }
}

/// What the HTTP handlers share: the daemon they serve and the API's own limits and counters.
#[derive(Clone)]
pub struct ApiState {
    /// The daemon the API answers for.
    pub control: Arc<dyn Control>,
    /// The address the server listens on: a `Host` naming it is this server.
    pub listen: SocketAddr,
    /// Rate limit of the refusal warnings.
    pub refusals: Arc<RefusalLog>,
    /// One answer that walks every port, worker or table entry at a time (see [`off_thread`]).
    walks: Arc<Semaphore>,
    /// Such answers running or waiting; past [`WALKS_QUEUED`] a request is refused at once.
    walks_queued: Arc<Semaphore>,
    /// FDB pages, one at a time as the walks but in a queue of their own: a client paging
    /// through a large table does not crowd out Prometheus' scrapes, nor they its pages.
    pages: Arc<Semaphore>,
    pages_queued: Arc<Semaphore>,
    /// The control plane's counters, for `/metrics`.
    pub stats: Arc<ControlStats>,
}

impl ApiState {
    /// The state of an API for `control` listening on `listen`, no request running yet.
    pub fn new(control: Arc<dyn Control>, listen: SocketAddr, stats: Arc<ControlStats>) -> Self {
        Self {
            control,
            listen,
            refusals: Arc::default(),
            walks: Arc::new(Semaphore::new(1)),
            walks_queued: Arc::new(Semaphore::new(WALKS_QUEUED)),
            pages: Arc::new(Semaphore::new(1)),
            pages_queued: Arc::new(Semaphore::new(WALKS_QUEUED)),
            stats,
        }
    }
}

/// How many of the answers [`off_thread`] runs may be running or waiting at once. A waiting
/// request holds one of the server's connection slots: hundreds of scrapers queued behind a
/// render of a tenth of a second would hold them all, `/healthz`'s included.
const WALKS_QUEUED: usize = 4;

/// Runs `f` on the blocking pool, one such call at a time, at most [`WALKS_QUEUED`] waiting
/// (past that, 503 at once). For the GETs that walk every port, worker, plugin or table entry,
/// or render the whole config: `/metrics` of a switch of 64 ports and 64 workers is 2 MB and
/// takes a tenth of a second, and on the server's one thread each scrape would hold up
/// `/healthz` and every other request that long (as a flood of `GET /api/v1/config` of a
/// 1 MB config held it up to 1.9 s).
async fn off_thread<T: Send + 'static>(
    s: &ApiState,
    f: impl FnOnce(&dyn Control) -> T + Send + 'static,
) -> Result<T, Response> {
    let what = "reads of /metrics, the config, the plugins or the shadows";
    queued_off_thread(s, (&s.walks, &s.walks_queued), what, f).await
}

/// [`off_thread`] with the semaphores `(running, queued)`, `what` naming their requests in a 503.
async fn queued_off_thread<T: Send + 'static>(
    s: &ApiState,
    (running, queued): (&Arc<Semaphore>, &Arc<Semaphore>),
    what: &str,
    f: impl FnOnce(&dyn Control) -> T + Send + 'static,
) -> Result<T, Response> {
    let Ok(queued) = queued.clone().try_acquire_owned() else {
        let busy = format!("{WALKS_QUEUED} {what} are running or waiting already: retry\n");
        return Err((StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], busy).into_response());
    };
    let permit = running.clone().acquire_owned().await.map_err(|_| shutting_down())?;
    // The permits go with the call: a client that leaves does not let a second walk start
    // beside one still running.
    blocking(s, move |c| {
        let _one_at_a_time = (permit, queued);
        f(c)
    })
    .await
}

/// Runs `f` on the blocking pool, so that the server's one thread never waits on it.
async fn blocking<T: Send + 'static>(
    s: &ApiState,
    f: impl FnOnce(&dyn Control) -> T + Send + 'static,
) -> Result<T, Response> {
    let control = s.control.clone();
    tokio::task::spawn_blocking(move || f(&*control)).await.map_err(|_| shutting_down())
}

fn shutting_down() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "the daemon is shutting down\n").into_response()
}

/// Counters of the control plane, for `/metrics`: what the log lines about refusals, full
/// connection slots and reloads say, countable. Written by the HTTP thread and the control
/// thread, for events far rarer than packets: plain shared atomics and one small lock.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Answers with an error status (4xx, 5xx), by status.
    errors: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    connections_refused: std::sync::atomic::AtomicU64,
    connections_evicted: std::sync::atomic::AtomicU64,
    /// Connections that ended in an error of the HTTP layer, by [`ConnectionError`].
    connection_errors: [std::sync::atomic::AtomicU64; 3],
    /// Reloads (API and SIGHUP) by result.
    reloads: [std::sync::atomic::AtomicU64; 3],
    /// Shadow promotes and discards, by action (promote, discard) and result.
    shadow_changes: [[std::sync::atomic::AtomicU64; 3]; 2],
}

/// How a connection ended in an error that the HTTP layer handled before any handler saw a
/// request (so neither the guard's counts nor its log lines cover it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnectionError {
    /// No complete request head within `Limits::header_read` of the connection's start: a slow
    /// or stalled client (slowloris), closed unanswered. (After an answered request the same
    /// timeout closes an idle keep-alive connection: not counted.)
    HeaderTimeout,
    /// A head that does not parse, or too long a URI or too many headers: answered 400, 414
    /// or 431 by the HTTP layer.
    BadRequest,
    /// The client went away in the middle of a request or an answer, or the socket failed.
    Broken,
}

impl ConnectionError {
    const ALL: [ConnectionError; 3] =
        [ConnectionError::HeaderTimeout, ConnectionError::BadRequest, ConnectionError::Broken];

    fn of(e: &hyper::Error) -> Self {
        if e.is_timeout() {
            ConnectionError::HeaderTimeout
        } else if e.is_parse() || e.is_parse_too_large() || e.is_parse_status() {
            ConnectionError::BadRequest
        } else {
            ConnectionError::Broken
        }
    }

    fn label(self) -> &'static str {
        match self {
            ConnectionError::HeaderTimeout => "header_timeout",
            ConnectionError::BadRequest => "bad_request",
            ConnectionError::Broken => "broken",
        }
    }
}

/// How a reload ended, for [`ControlStats::reloaded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// Applied, every worker in time.
    Applied,
    /// Refused; nothing changed.
    Refused,
    /// Applied, but some worker took the change late.
    Late,
}

impl ReloadOutcome {
    const ALL: [ReloadOutcome; 3] = [ReloadOutcome::Applied, ReloadOutcome::Refused, ReloadOutcome::Late];

    fn label(self) -> &'static str {
        match self {
            ReloadOutcome::Applied => "applied",
            ReloadOutcome::Refused => "refused",
            ReloadOutcome::Late => "late",
        }
    }
}

impl ControlStats {
    fn answered(&self, status: StatusCode) {
        if status.is_client_error() || status.is_server_error() {
            *self.errors.lock().unwrap_or_else(|e| e.into_inner()).entry(status.as_u16()).or_default() += 1;
        }
    }

    fn bump(c: &std::sync::atomic::AtomicU64) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts (and, the first time and every power of two of its kind, logs) a connection that
    /// ended in `e`; not a header timeout after answered requests, which is how an idle
    /// keep-alive connection ends.
    fn connection_failed(&self, e: &hyper::Error, conn: &Answering) {
        let kind = ConnectionError::of(e);
        if kind == ConnectionError::HeaderTimeout && conn.0.heads.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return;
        }
        let n = self.connection_errors[kind as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            log::warn!("control API: a connection ended in an error ({}): {e}; {n} such so far", kind.label());
        }
    }

    /// Counts one reload that ended as `how`.
    pub fn reloaded(&self, how: ReloadOutcome) {
        Self::bump(&self.reloads[how as usize]);
    }

    /// Counts one shadow promote (`promote`) or discard that ended as `how`.
    pub fn shadow_changed(&self, promote: bool, how: ReloadOutcome) {
        Self::bump(&self.shadow_changes[usize::from(!promote)][how as usize]);
    }
}

impl crate::metrics::MetricsSource for ControlStats {
    fn encode(&self, enc: &mut prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use crate::metrics::counter_family;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        // One series per value of `label`, each `(value, counter)`.
        let by = |label: &'static str,
                  series: &mut dyn Iterator<Item = (&'static str, &std::sync::atomic::AtomicU64)>| {
            series.map(|(v, c)| (vec![(label, v.to_string())], get(c))).collect::<Vec<_>>()
        };
        // The statuses the guard and the handlers answer are there from the start, at 0, so
        // that a rate over them has a beginning; any other appears when first answered.
        const KNOWN: [u16; 12] = [400, 401, 403, 404, 405, 408, 409, 413, 421, 422, 500, 503];
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for status in KNOWN {
            errors.entry(status).or_default();
        }
        let errors: Vec<_> = errors.iter().map(|(status, n)| (vec![("status", status.to_string())], *n)).collect();
        counter_family(
            enc,
            "wasmswitch_api_errors",
            "Control API answers with an error status (refused: wrong token, Origin, Host, body too large or too slow, a reload in progress or refused, a bad edit; or not found), by status.",
            &errors,
        )?;
        counter_family(
            enc,
            "wasmswitch_api_connections_refused",
            "Control API connections closed unanswered: every slot (256) was busy answering.",
            &[(vec![], get(&self.connections_refused))],
        )?;
        counter_family(
            enc,
            "wasmswitch_api_connections_evicted",
            "Control API connections closed to make room for a new one (idle, halfway through a request, or not reading its answers), or past their time with answers the client did not read.",
            &[(vec![], get(&self.connections_evicted))],
        )?;
        let connection_errors =
            by("kind", &mut ConnectionError::ALL.iter().map(|&k| (k.label(), &self.connection_errors[k as usize])));
        counter_family(
            enc,
            "wasmswitch_api_connection_errors",
            "Control API connections that ended in an error of the HTTP layer, before any handler: header_timeout (a request head not complete in 5 s), bad_request (a head that does not parse or is too large, answered 400/414/431), broken (the client went away mid-request or mid-answer).",
            &connection_errors,
        )?;
        let reloads = by("result", &mut ReloadOutcome::ALL.iter().map(|&o| (o.label(), &self.reloads[o as usize])));
        counter_family(
            enc,
            "wasmswitch_reloads",
            "Reloads (API and SIGHUP) by result: applied, refused (nothing changed), late (applied, a worker took it late).",
            &reloads,
        )?;
        let shadow: Vec<_> = ["promote", "discard"]
            .iter()
            .zip(&self.shadow_changes)
            .flat_map(|(action, results)| {
                ReloadOutcome::ALL.iter().map(move |&o| {
                    (vec![("action", action.to_string()), ("result", o.label().to_string())], get(&results[o as usize]))
                })
            })
            .collect();
        counter_family(
            enc,
            "wasmswitch_shadow_changes",
            "Shadow promotes and discards through the API, by action and result: applied, refused (nothing changed), late (applied, a worker took it late).",
            &shadow,
        )
    }
}

/// How often a line of one kind (status and reason) is logged: a client retrying with a
/// wrong token, a page hammering the port, or a client with the token changing the FDB in a
/// loop would otherwise fill the log.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Kinds of refusal tracked apart; reasons may quote the request (its Host), so past this
/// the rest of a status share one entry and the map stays bounded.
const REFUSAL_KINDS: usize = 64;

/// Per (status, reason): when a line of that kind was last logged, and how many were not
/// logged since. Refusals are keyed by their reason; successful changes by what they did
/// (the API's by method and route, the daemon's by kind of change), with a 2xx status.
#[derive(Debug, Default)]
pub struct RefusalLog(std::sync::Mutex<std::collections::HashMap<(u16, String), (std::time::Instant, u64)>>);

impl RefusalLog {
    /// `None` when this refusal is not to be logged (counted instead); else how many of its
    /// kind were not logged since the last line.
    pub fn admit(&self, code: StatusCode, why: &str) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = (code.as_u16(), why.to_owned());
        if !m.contains_key(&key) && m.len() >= REFUSAL_KINDS {
            key.1.clear();
        }
        match m.get_mut(&key) {
            Some((last, quiet)) if now.duration_since(*last) < REFUSAL_LOG_EVERY => {
                *quiet += 1;
                None
            }
            Some((last, quiet)) => {
                *last = now;
                Some(std::mem::take(quiet))
            }
            None => {
                m.insert(key, (now, 0));
                Some(0)
            }
        }
    }

    /// The kinds whose period is over with refusals not logged, each `(status, reason, count)`;
    /// their counts start again. Called once a period, so that a count is written even when its
    /// reason does not come back. Kinds quiet for a whole period are forgotten (the next is
    /// logged at once, as it would be anyway).
    pub fn overdue(&self) -> Vec<(u16, String, u64)> {
        self.counts(false)
    }

    /// Every count not logged yet, its period over or not (at shutdown, so that the last
    /// burst is counted in the log too).
    pub fn remaining(&self) -> Vec<(u16, String, u64)> {
        self.counts(true)
    }

    fn counts(&self, all: bool) -> Vec<(u16, String, u64)> {
        let now = std::time::Instant::now();
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        m.retain(|(code, why), (last, quiet)| {
            if !all && now.duration_since(*last) < REFUSAL_LOG_EVERY {
                return true;
            }
            if *quiet == 0 {
                return false;
            }
            out.push((*code, why.clone(), std::mem::take(quiet)));
            *last = now;
            true
        });
        out
    }
}

/// Writes, once a period, the counts of requests whose line [`RefusalLog::admit`] did not
/// let through, so that the last burst of a kind is not left uncounted in the log. Runs until
/// the runtime ends.
pub async fn log_overdue_refusals(refusals: Arc<RefusalLog>) {
    let mut every = tokio::time::interval(REFUSAL_LOG_EVERY);
    loop {
        every.tick().await;
        log_not_logged(refusals.overdue());
    }
}

/// The lines of [`log_overdue_refusals`] (and of the daemon's shutdown, with
/// [`RefusalLog::remaining`]): successful changes at INFO, refusals at WARN, as their own
/// lines are.
pub fn log_not_logged(counts: Vec<(u16, String, u64)>) {
    for (status, why, n) in counts {
        let level = if (200..300).contains(&status) { log::Level::Info } else { log::Level::Warn };
        log::log!(level, "control API: {n} more answered {status} ({why}) since the last such line, not logged");
    }
}

/// How long a mutating request's body may take to arrive.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request body a mutating endpoint accepts (reload takes none).
pub const MAX_BODY_BYTES: usize = 4096;

/// The API's routes (`/metrics`, `/healthz`, `/api/v1/...`), every request, unknown paths
/// and methods included, through the access checks first.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/ports", get(ports))
        .route("/api/v1/fdb", get(fdb).post(fdb_add))
        .route("/api/v1/fdb/flush", post(fdb_flush))
        .route("/api/v1/fdb/{vlan}/{mac}", delete(fdb_remove))
        .route("/api/v1/plugins", get(plugins))
        .route("/api/v1/config", get(config))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/shadow", get(shadow))
        .route("/api/v1/ports/{port}/shadow/{action}", post(shadow_action))
        .fallback(no_such_path)
        .method_not_allowed_fallback(no_such_method)
        // Over every route and every method, unmatched ones included.
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// 404 with a message (axum's own has an empty body, which the CLI would print as nothing).
async fn no_such_path(uri: axum::http::Uri) -> Response {
    let why = format!("no endpoint at {}: see the README's Control API", uri.path());
    json_error(StatusCode::NOT_FOUND, &why)
}

/// 405 with a message; axum has set the `Allow` header.
async fn no_such_method(method: Method, uri: axum::http::Uri) -> Response {
    let why = format!("{} does not take {method}", uri.path());
    json_error(StatusCode::METHOD_NOT_ALLOWED, &why)
}

/// What [`serve`] knows of a connection's requests: whether one is being answered (its head and
/// body are in), so that when full it can tell a connection worth its slot from one that only
/// holds it; and how many heads came, so that a header timeout after answered requests (an idle
/// keep-alive connection closing) is told from one before any (a client that never sends a
/// whole head).
#[derive(Clone, Default)]
struct Answering(Arc<ConnState>);

#[derive(Default)]
struct ConnState {
    busy: std::sync::atomic::AtomicBool,
    heads: std::sync::atomic::AtomicU64,
}

impl Answering {
    /// Runs `next` with the flag set (cleared when the answer is made or the request dropped).
    async fn run(req: Request, next: Next) -> Response {
        struct Clear(Option<Answering>);
        impl Drop for Clear {
            fn drop(&mut self) {
                if let Some(a) = &self.0 {
                    a.0.busy.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let flag = req.extensions().get::<Answering>().cloned();
        if let Some(a) = &flag {
            a.0.busy.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let _clear = Clear(flag);
        next.run(req).await
    }
}

/// The access checks of the module doc, then the route.
async fn guard(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    if let Some(a) = req.extensions().get::<Answering>() {
        a.0.heads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let response = checked(&s, req, next).await;
    s.stats.answered(response.status());
    response
}

async fn checked(s: &ApiState, req: Request, next: Next) -> Response {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD);
    if !mutating {
        if let Err(why) = host_allowed(&req, s.listen) {
            return refuse(StatusCode::MISDIRECTED_REQUEST, &why);
        }
        return Answering::run(req, next).await;
    }
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string());
    let peer = peer.unwrap_or_else(|| "unknown peer".into());
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    // The route (`/api/v1/fdb/{vlan}/{mac}`), not the path, so that deletes of many entries
    // are one kind of line.
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| path.clone(), |m| m.as_str().to_owned());
    let (response, why) = match check_mutation(s, req).await {
        Ok(req) => (Answering::run(req, next).await, None),
        Err((code, why)) => (refuse(code, &why), Some(why)),
    };
    let status = response.status();
    match why {
        // Successful changes too, per method and route: a client with the token (or any local
        // process, on loopback without one) changing the FDB in a loop wrote a line each.
        None if status.is_success() => match s.refusals.admit(status, &format!("{method} {route}")) {
            Some(0) => log::info!("control API: {peer} {method} {path}: {status}"),
            Some(n) => log::info!(
                "control API: {peer} {method} {path}: {status} (and {n} more {method} {route} answered {status} since the last such line, not logged)"
            ),
            None => {}
        },
        // A handler's refusal (409 while a reload runs, 422 for a bad edit): rate-limited per
        // status and route like the guard's, so a client retrying in a loop cannot flood the log.
        None => match s.refusals.admit(status, &format!("{method} {route}")) {
            Some(0) => log::warn!("control API: {peer} {method} {path}: {status}"),
            Some(n) => log::warn!(
                "control API: {peer} {method} {path}: {status} (and {n} more answered {status} since the last such line, not logged)"
            ),
            None => {}
        },
        Some(why) => match s.refusals.admit(status, &why) {
            Some(0) => log::warn!("control API: {peer} {method} {path}: {status}: refused: {why}"),
            Some(n) => log::warn!(
                "control API: {peer} {method} {path}: {status}: refused: {why} (and {n} more refused with {status} since the last such line, not logged)"
            ),
            None => {}
        },
    }
    response
}

/// Host, Origin, token and body size of a mutating request; the request (its body read into
/// memory) if it may go on.
async fn check_mutation(s: &ApiState, req: Request) -> Result<Request, (StatusCode, String)> {
    host_allowed(&req, s.listen).map_err(|why| (StatusCode::MISDIRECTED_REQUEST, why))?;
    if req.headers().contains_key(header::ORIGIN) {
        return Err((
            StatusCode::FORBIDDEN,
            "a request with an Origin header (from a web page) may not change the switch".into(),
        ));
    }
    if let Some(token) = s.control.token() {
        authorized(req.headers(), token.as_bytes()).map_err(|why| (StatusCode::UNAUTHORIZED, why))?;
    }
    let too_big = || (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {MAX_BODY_BYTES} bytes"));
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_big());
    }
    // Read with the bound (a chunked body declares no length), so a handler never sees more.
    let (parts, body) = req.into_parts();
    // A body that is declared but does not come must not hold the connection (the header
    // timeout covers only the head).
    let bytes = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES))
        .await
        .map_err(|_| {
            (StatusCode::REQUEST_TIMEOUT, format!("the request body did not arrive within {BODY_READ_TIMEOUT:?}"))
        })?
        .map_err(|e| {
            // Over the bound, or a body that does not parse (a bad chunk, or a declared length and
            // chunks both: the chunks count, and these are none).
            if e.into_inner().is::<http_body_util::LengthLimitError>() {
                too_big()
            } else {
                (StatusCode::BAD_REQUEST, "the request body does not parse as HTTP/1.1 (a bad chunk?)".into())
            }
        })?;
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// The API's error answer: `{"status": "error", "error": why}` with `code`.
fn json_error(code: StatusCode, why: &str) -> Response {
    (code, error_body(why)).into_response()
}

fn error_body(why: &str) -> Json<serde_json::Value> {
    Json(json!({"status": "error", "error": why}))
}

/// A JSON error, with the challenge a 401 must carry.
fn refuse(code: StatusCode, why: &str) -> Response {
    let body = error_body(why);
    // Closed after the answer: hyper would otherwise keep the connection (and its slot) to
    // drain a body the request declared but never sends.
    let close = (header::CONNECTION, "close");
    if code == StatusCode::UNAUTHORIZED {
        return (code, [(header::WWW_AUTHENTICATE, "Bearer realm=\"wasmswitch\""), close], body).into_response();
    }
    (code, [close], body).into_response()
}

/// Whether the request carries `Authorization: Bearer <token>`.
fn authorized(headers: &HeaderMap, token: &[u8]) -> Result<(), String> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        let n = headers.get_all(header::AUTHORIZATION).iter().count();
        return Err(if n == 0 {
            "this request needs an `Authorization: Bearer <token>` header (control.token_file)".into()
        } else {
            format!("this request carries {n} Authorization headers: send exactly one `Authorization: Bearer <token>`")
        });
    };
    let bytes = value.as_bytes();
    let sent = match bytes.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => bytes[7..].trim_ascii(),
        _ => return Err("the Authorization header is not `Bearer <token>`".into()),
    };
    if equal_in_constant_time(sent, token) {
        Ok(())
    } else {
        Err("wrong token".into())
    }
}

/// Compares the SHA-256 digests of `a` and `b` without an early exit, so the time taken says
/// nothing about how much of a guess was right, nor about the token's length.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    let diff = x.iter().zip(y.iter()).fold(0u8, |acc, (p, q)| acc | (p ^ q));
    std::hint::black_box(diff) == 0
}

/// Whether the request names this server: its `Host` (and the authority of an absolute-form
/// URI, if any) is `localhost`, a loopback address, the listen address, or, when listening on
/// every address, any IP address. A domain name other than `localhost` is refused: that is
/// how a DNS-rebinding page reaches a loopback listener. Any port is accepted (port forwards).
fn host_allowed(req: &Request, listen: SocketAddr) -> Result<(), String> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => h.to_str().map_err(|_| "the Host header is not text".to_string())?,
        // HTTP/1.0 needs none (health checkers send none), and a browser, whose requests are
        // what this check is about, always sends one.
        (None, _) if req.version() == axum::http::Version::HTTP_10 => return Ok(()),
        (None, _) => return Err("the request has no Host header".into()),
        (Some(_), Some(_)) => return Err("the request has more than one Host header".into()),
    };
    for name in std::iter::once(host).chain(req.uri().authority().map(|a| a.as_str())) {
        if !names_this_server(name, listen) {
            return Err(format!("Host `{name}` does not name this server (expected localhost or an address of it)"));
        }
    }
    Ok(())
}

fn names_this_server(authority: &str, listen: SocketAddr) -> bool {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return false;
    }
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == listen.ip() || listen.ip().is_unspecified(),
        Err(_) => false,
    }
}

async fn metrics(State(s): State<ApiState>) -> Response {
    match off_thread(&s, |c| c.metrics()).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(r) => r,
    }
}

async fn healthz(State(s): State<ApiState>) -> Response {
    match s.control.health() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn ports(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.control.ports_json())
}

/// `GET /api/v1/fdb?limit=&cursor=&port=&vlan=&mac=`: one page of the table, made and
/// serialized on the blocking pool (under 1 MB, a few milliseconds), with a `Content-Length`,
/// so a client that gets less than that knows the answer was cut.
async fn fdb(State(s): State<ApiState>, uri: axum::http::Uri) -> Response {
    let query = match FdbQuery::parse(uri.query()) {
        Ok(q) => q,
        Err(why) => return bad_request(why),
    };
    let page = move |c: &dyn Control| c.fdb_page(&query).map(|p| serde_json::to_vec(&p));
    match queued_off_thread(&s, (&s.pages, &s.pages_queued), "pages of the FDB", page).await {
        Ok(Ok(body)) => json_bytes(body),
        Ok(Err(FdbPageError::Bad(why))) => bad_request(why),
        Ok(Err(FdbPageError::Stale(why))) => json_error(StatusCode::CONFLICT, &why),
        Err(r) => r,
    }
}

/// A JSON answer made and serialized by [`off_thread`]: a large one serialized on the
/// server's one thread would hold up every other request as long.
async fn json_off_thread(s: &ApiState, f: impl FnOnce(&dyn Control) -> serde_json::Value + Send + 'static) -> Response {
    match off_thread(s, move |c| serde_json::to_vec(&f(c))).await {
        Ok(body) => json_bytes(body),
        Err(r) => r,
    }
}

/// A 200 of JSON `body`, or a 500 if it could not be serialized.
fn json_bytes(body: serde_json::Result<Vec<u8>>) -> Response {
    match body {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot serialize the answer: {e}")),
    }
}

/// Body of `POST /api/v1/fdb`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    mac: String,
    #[serde(default = "vlan_one")]
    vlan: u16,
    port: String,
}

/// Body of `POST /api/v1/fdb/flush` (an empty body flushes every learned entry).
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FlushBody {
    port: Option<String>,
    vlan: Option<u16>,
    #[serde(default, rename = "static")]
    statics: bool,
}

fn vlan_one() -> u16 {
    1
}

fn bad_request(why: String) -> Response {
    json_error(StatusCode::BAD_REQUEST, &why)
}

/// An FDB edit, on the blocking pool: it waits while a reload copies the table into a new one
/// (a large table takes a while), and the server's thread must not.
async fn fdb_answer(s: &ApiState, change: FdbChange) -> Response {
    match blocking(s, move |c| c.fdb_change(change)).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => json_error(StatusCode::UNPROCESSABLE_ENTITY, &e),
        Err(r) => r,
    }
}

async fn fdb_add(State(s): State<ApiState>, body: axum::body::Bytes) -> Response {
    let b: AddBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("expected {{\"mac\": \"02:..\", \"vlan\": 1, \"port\": \"name\"}}: {e}")),
    };
    match b.mac.parse::<MacAddr>() {
        Ok(mac) => fdb_answer(&s, FdbChange::Add { mac, vlan: b.vlan, port: b.port }).await,
        Err(e) => bad_request(e),
    }
}

async fn fdb_remove(State(s): State<ApiState>, Path((vlan, m)): Path<(String, String)>) -> Response {
    let Ok(vlan) = vlan.parse::<u16>() else { return bad_request(format!("`{vlan}` is not a VLAN id")) };
    match m.parse::<MacAddr>() {
        Ok(mac) => fdb_answer(&s, FdbChange::Remove { mac, vlan }).await,
        Err(e) => bad_request(e),
    }
}

async fn fdb_flush(State(s): State<ApiState>, body: axum::body::Bytes) -> Response {
    let b: FlushBody = if body.iter().all(u8::is_ascii_whitespace) {
        FlushBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => return bad_request(format!("expected {{\"port\": .., \"vlan\": .., \"static\": false}}: {e}")),
        }
    };
    fdb_answer(&s, FdbChange::Flush { port: b.port, vlan: b.vlan, statics: b.statics }).await
}

async fn plugins(State(s): State<ApiState>) -> Response {
    json_off_thread(&s, |c| c.plugins_json()).await
}

async fn config(State(s): State<ApiState>) -> Response {
    json_off_thread(&s, |c| c.config_json()).await
}

async fn reload(State(s): State<ApiState>) -> Response {
    let rx = match s.control.start_reload() {
        Ok(rx) => rx,
        Err(ReloadBusy::InProgress) => {
            return json_error(StatusCode::CONFLICT, "reload in progress: try again when it has finished")
        }
        Err(ReloadBusy::ShuttingDown) => {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is shutting down")
        }
    };
    match rx.await {
        Ok(Ok(summary)) => (StatusCode::OK, Json(json!({"status": "ok", "summary": summary}))).into_response(),
        Ok(Err(e)) => json_error(e.status(), &e.to_string()),
        Err(_) => json_error(StatusCode::SERVICE_UNAVAILABLE, "the control thread ended before the reload finished"),
    }
}

async fn shadow(State(s): State<ApiState>) -> Response {
    json_off_thread(&s, |c| c.shadow_json()).await
}

/// `POST /api/v1/ports/{port}/shadow/promote` or `.../discard`.
async fn shadow_action(State(s): State<ApiState>, Path((port, action)): Path<(String, String)>) -> Response {
    use crate::dataplane::ShadowOp;
    let op = match action.as_str() {
        "promote" => ShadowOp::Promote,
        "discard" => ShadowOp::Discard,
        _ => return json_error(StatusCode::NOT_FOUND, &format!("no shadow action `{action}`: promote or discard")),
    };
    let rx = match s.control.start_shadow(port, op) {
        Ok(rx) => rx,
        Err(ReloadBusy::InProgress) => {
            return json_error(
                StatusCode::CONFLICT,
                "a reload or shadow change is in progress: try again when it has finished",
            )
        }
        Err(ReloadBusy::ShuttingDown) => {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is shutting down")
        }
    };
    match rx.await {
        Ok(Ok(answer)) => (StatusCode::OK, Json(answer)).into_response(),
        Ok(Err(e)) => json_error(e.status(), &e.to_string()),
        Err(_) => json_error(StatusCode::SERVICE_UNAVAILABLE, "the control thread ended before the change finished"),
    }
}

/// Bounds that keep clients from holding the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to send a complete request head, counted from when the server starts waiting for
    /// one (so it is also the keep-alive idle timeout).
    pub header_read: Duration,
    /// Longest a connection may stay open, whatever it does, but for finishing the answer it
    /// is making then (for at most [`ANSWER_GRACE`] more).
    pub connection: Duration,
    /// Connections open at once. When full, every open connection that is not being answered
    /// (idle, or with half a request head or a body that has not come) is closed at once, the
    /// others after their answer, and a newcomer that finds no room within 200 ms is closed.
    pub max_connections: usize,
    /// How long shutdown lets requests in flight finish before dropping them.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read: Duration::from_secs(5),
            connection: Duration::from_secs(60),
            max_connections: 256,
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// How long past `Limits::connection` a connection may stay to finish the answer it is making
/// (a body that does not come is bounded by its own timeout): as long as the CLI waits for a
/// reload's answer.
const ANSWER_GRACE: Duration = Duration::from_secs(300);

/// How long a connection past its time, with no handler running, may take to send what it
/// answered: a client that pipelines requests and never reads the answers would otherwise hold
/// its slot until [`ANSWER_GRACE`] ran out (256 of them kept `/healthz` out for minutes).
const FINISH_GRACE: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` until `shutdown` becomes true; then stops accepting, asks open
/// connections to finish (keep-alive ones close after their current request) and waits at most
/// `limits.shutdown_grace` before dropping the rest.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: Arc<ControlStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut conns = JoinSet::new();
    let mut refused: u64 = 0;
    let evict = Arc::new(Notify::new());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                log::warn!("control API: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Full: ask every connection to close once its current request (if any) is
                // answered, so idle ones make room for this one at once.
                evict.notify_waiters();
                match tokio::time::timeout(Duration::from_millis(200), slots.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        ControlStats::bump(&stats.connections_refused);
                        refused += 1;
                        if refused.is_power_of_two() {
                            log::warn!(
                                "control API: {} connections busy, refused {refused} so far",
                                limits.max_connections
                            );
                        }
                        continue;
                    }
                }
            }
        };
        let _ = stream.set_nodelay(true);
        // The peer, for the log of mutating requests.
        let answering = Answering::default();
        let service = TowerToHyperService::new(
            router.clone().layer(Extension(ConnectInfo(peer))).layer(Extension(answering.clone())),
        );
        let stop = shutdown.clone();
        let evict = evict.clone();
        let stats = stats.clone();
        let deadline = tokio::time::Instant::now() + limits.connection;
        conns.spawn(connection(Conn { stream, service, answering, stop, evict, stats, deadline, limits }, permit));
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.shutdown_grace, drain(&mut conns)).await;
    conns.abort_all();
}

/// One accepted connection and what serving it needs.
struct Conn {
    stream: tokio::net::TcpStream,
    service: TowerToHyperService<Router>,
    /// Whether a handler is answering on it now.
    answering: Answering,
    /// Becomes true at shutdown.
    stop: watch::Receiver<bool>,
    /// Notified when every slot is taken: idle connections make room.
    evict: Arc<Notify>,
    stats: Arc<ControlStats>,
    /// When its time is up.
    deadline: tokio::time::Instant,
    limits: Limits,
}

/// Serves one connection until it closes, its time is up, or it is evicted or shut down;
/// `_permit` is its slot, given back when it ends.
async fn connection(c: Conn, _permit: tokio::sync::OwnedSemaphorePermit) {
    let Conn { stream, service, answering, mut stop, evict, stats, deadline, limits } = c;
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(64 << 10)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let run = async {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    stats.connection_failed(&e, &answering);
                }
                return;
            }
            _ = stop.wait_for(|s| *s) => {}
            _ = evict.notified() => {
                // Holding a slot with nothing to answer (idle, half a head, a body
                // that does not come, which hyper's graceful close would wait out):
                // dropped now.
                if !answering.0.busy.load(std::sync::atomic::Ordering::Relaxed) {
                    ControlStats::bump(&stats.connections_evicted);
                    return;
                }
            }
            // Its time is up: closed once the request it is answering, if any, is
            // answered (a reload may take longer than a connection's time).
            _ = tokio::time::sleep_until(deadline) => {}
        }
        // Closes an idle connection now, and a busy one after its response. What holds
        // the slot then is a handler still answering (a reload), or a client that does
        // not read what it was answered: the latter is closed to make room, and in any
        // case once its answers had FINISH_GRACE to go out.
        conn.as_mut().graceful_shutdown();
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        stats.connection_failed(&e, &answering);
                    }
                    return;
                }
                _ = evict.notified() => {}
                _ = tokio::time::sleep(FINISH_GRACE) => {}
            }
            if !answering.0.busy.load(std::sync::atomic::Ordering::Relaxed) {
                ControlStats::bump(&stats.connections_evicted);
                return;
            }
        }
    };
    let _ = tokio::time::timeout(limits.connection + ANSWER_GRACE, run).await;
}

async fn drain(conns: &mut JoinSet<()>) {
    while conns.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon whose `/metrics`, FDB, config, plugins and shadow answers take until the test
    /// lets them go.
    struct HeldWalks(std::sync::Mutex<std::sync::mpsc::Receiver<()>>);

    impl HeldWalks {
        fn wait(&self) {
            let _ = self.0.lock().unwrap().recv();
        }
    }

    impl Control for HeldWalks {
        fn metrics(&self) -> String {
            self.wait();
            "# metrics\n".into()
        }
        fn health(&self) -> Result<(), String> {
            Ok(())
        }
        fn ports_json(&self) -> serde_json::Value {
            json!({})
        }
        fn fdb_page(&self, q: &FdbQuery) -> Result<FdbPage, FdbPageError> {
            self.wait();
            if q.port.as_deref() == Some("nope") {
                return Err(FdbPageError::Bad("`nope` is not a port of the switch".into()));
            }
            let entry = |i: u64| FdbEntry {
                vlan: 1,
                mac: MacAddr::from_u64(0x0200_0000_0000 | i),
                port: Some("p0".into()),
                is_static: false,
                age_seconds: 3,
            };
            let entries = (0..q.limit as u64).map(entry).collect();
            Ok(FdbPage {
                capacity: 1 << 20,
                table_entries: 1 << 20,
                entries,
                next: Some(FdbCursor { table: 7, slot: 9 }),
            })
        }
        fn fdb_change(&self, _: FdbChange) -> Result<serde_json::Value, String> {
            Err("not here".into())
        }
        fn plugins_json(&self) -> serde_json::Value {
            self.wait();
            json!({})
        }
        fn config_json(&self) -> serde_json::Value {
            self.wait();
            json!({})
        }
        fn start_reload(&self) -> Result<oneshot::Receiver<ReloadResult>, ReloadBusy> {
            Err(ReloadBusy::ShuttingDown)
        }
        fn shadow_json(&self) -> serde_json::Value {
            self.wait();
            json!({})
        }
        fn start_shadow(
            &self,
            _: String,
            _: crate::dataplane::ShadowOp,
        ) -> Result<oneshot::Receiver<ShadowResult>, ReloadBusy> {
            Err(ReloadBusy::ShuttingDown)
        }
        fn token(&self) -> Option<crate::config::Token> {
            None
        }
    }

    /// A server of [`HeldWalks`] under `limits`, on a thread and runtime of its own as in the
    /// daemon (were the walks on that one thread, it could answer nothing while they are held).
    struct HeldServer {
        addr: SocketAddr,
        /// One send lets one held walk answer.
        release: std::sync::mpsc::Sender<()>,
        stats: Arc<ControlStats>,
        stop: watch::Sender<bool>,
        thread: std::thread::JoinHandle<()>,
    }

    impl HeldServer {
        fn start(limits: Limits) -> Self {
            let (release, held) = std::sync::mpsc::channel();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopping) = watch::channel(false);
            let stats = Arc::new(ControlStats::default());
            let thread = std::thread::spawn({
                let stats = stats.clone();
                move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(async move {
                        let state =
                            ApiState::new(Arc::new(HeldWalks(std::sync::Mutex::new(held))), addr, stats.clone());
                        serve(TcpListener::from_std(listener).unwrap(), router(state), limits, stats, stopping).await
                    })
                }
            });
            HeldServer { addr, release, stats, stop, thread }
        }

        /// A `GET path` on a connection of its own; the answer as read until the server closes.
        fn getter(&self) -> impl Fn(&str, Option<Duration>) -> std::io::Result<String> + Copy + Send + 'static {
            let addr = self.addr;
            move |path, wait| {
                use std::io::{Read, Write};
                let mut c = std::net::TcpStream::connect(addr)?;
                c.set_read_timeout(wait)?;
                write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
                let mut answer = String::new();
                c.read_to_string(&mut answer)?;
                Ok(answer)
            }
        }

        fn stop(self) {
            self.stop.send(true).unwrap();
            self.thread.join().unwrap();
        }
    }

    #[test]
    fn healthz_answers_while_metrics_fdb_config_plugins_and_shadow_walks_are_under_way() {
        let server = HeldServer::start(Limits::default());
        let get = server.getter();
        // Four walks fill their queue, four FDB pages theirs.
        let walks: Vec<_> = ["/api/v1/config", "/api/v1/plugins", "/api/v1/shadow", "/metrics"]
            .into_iter()
            .chain(["/api/v1/fdb"; 4])
            .map(|p| std::thread::spawn(move || get(p, None).unwrap()))
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        // Past a queue's room, refused at once (holding no connection slot while waiting).
        let busy = get("/metrics", Some(Duration::from_secs(5))).expect("answered at once");
        assert!(busy.starts_with("HTTP/1.1 503") && busy.contains("retry-after: 1"), "{busy}");
        assert!(busy.contains("4 reads of /metrics, the config, the plugins or the shadows"), "{busy}");
        let busy = get("/api/v1/fdb?limit=1", Some(Duration::from_secs(5))).expect("answered at once");
        assert!(busy.starts_with("HTTP/1.1 503") && busy.contains("4 pages of the FDB are running"), "{busy}");
        let health = get("/healthz", Some(Duration::from_secs(5)));
        for _ in 0..walks.len() {
            server.release.send(()).unwrap();
        }
        let health = health.expect("/healthz answered within 5 s while eight walks were held");
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        for w in walks {
            let answer = w.join().unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        server.stop();
    }

    /// The body of an answer `get` read, and its `Content-Length`.
    fn body_and_length(answer: &str) -> (&str, Option<usize>) {
        let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
        let len = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ")?.parse().ok());
        (body, len)
    }

    #[test]
    fn an_fdb_page_is_json_of_the_length_it_says_and_bad_queries_are_refused_before_any_walk() {
        let server = HeldServer::start(Limits::default());
        let get = server.getter();
        let wait = Some(Duration::from_secs(10));
        server.release.send(()).unwrap();
        let answer = get("/api/v1/fdb?limit=3&vlan=7&mac=02%3A00", wait).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("content-type: application/json"), "{answer}");
        let (body, len) = body_and_length(&answer);
        assert_eq!(len, Some(body.len()), "framed by its length, so a cut answer is told from a whole one");
        let page: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(page["entries"].as_array().unwrap().len(), 3, "{page}");
        assert_eq!(
            page["entries"][2],
            json!({"vlan": 1, "mac": "02:00:00:00:00:02", "port": "p0", "static": false, "age_seconds": 3})
        );
        assert_eq!((page["capacity"].as_u64(), page["table_entries"].as_u64()), (Some(1 << 20), Some(1 << 20)));
        assert_eq!(page["next"], "0000000000000007-9");
        // Refused with the reason, and no walk started: none was released for them.
        for (query, why) in [
            ("limit=10001", "limit `10001` is out of range: expected 1-10000"),
            ("limit=0", "expected 1-10000"),
            ("limit=99999999999999999999999", "expected 1-10000"),
            ("limit=-1", "expected 1-10000"),
            ("vlan=4095", "vlan `4095` is out of range: expected a VLAN id 1-4094"),
            ("vlan=010", "out of range"),
            ("mac=02:zz", "`02:zz` is not a MAC prefix"),
            ("cursor=12-3", "`12-3` is not a cursor"),
            ("port=", "expected a port's name"),
            ("limit=5&limit=6", "`limit` is given twice"),
            ("colour=red", "unknown parameter `colour`: expected limit, cursor, port, vlan or mac"),
            ("port=%zz", "bad %-escape"),
        ] {
            let answer = get(&format!("/api/v1/fdb?{query}"), wait).unwrap();
            assert!(answer.starts_with("HTTP/1.1 400"), "{query}: {answer}");
            assert!(answer.contains(why), "{query}: {answer}");
        }
        // The daemon's own refusal (no such port) is a 400 too.
        server.release.send(()).unwrap();
        let answer = get("/api/v1/fdb?port=nope", wait).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("`nope` is not a port"), "{answer}");
        server.stop();
    }

    #[test]
    fn fdb_queries_parse_to_what_they_say() {
        let q = FdbQuery::parse(None).unwrap();
        assert_eq!(q, FdbQuery::default());
        assert_eq!(q.limit, FDB_PAGE_DEFAULT);
        let q = FdbQuery::parse(Some("limit=10000&port=p%2D1&vlan=4094&mac=0a:1&cursor=00000000000000ff-42&")).unwrap();
        assert_eq!(q.limit, FDB_PAGE_MAX);
        assert_eq!(q.port.as_deref(), Some("p-1"));
        assert_eq!(q.vlan, Vid::new(4094));
        assert_eq!(q.mac, "0a:01".parse().unwrap());
        assert_eq!(q.cursor, Some(FdbCursor { table: 0xff, slot: 42 }));
        let c = FdbCursor { table: u64::MAX, slot: 1 << 24 };
        assert_eq!(c.to_string().parse::<FdbCursor>(), Ok(c), "a cursor reads back as written");
        for bad in ["ffff-1", "00000000000000ff-", "00000000000000ff-+1", "0000000000000g0f-1", "x"] {
            assert!(bad.parse::<FdbCursor>().is_err(), "{bad}");
        }
        let long = FdbQuery::parse(Some(&format!("{}=1", "k".repeat(1000)))).unwrap_err();
        assert!(long.len() < 200, "a quoted parameter is shortened: {long}");
    }

    #[test]
    fn a_newcomer_finding_every_slot_answering_is_refused_and_counted() {
        let server = HeldServer::start(Limits { max_connections: 2, ..Limits::default() });
        let get = server.getter();
        let wait = Some(Duration::from_secs(10));
        // Both slots answering (one render held, one queued behind it): neither can be evicted.
        let walks: Vec<_> = (0..2).map(|_| std::thread::spawn(move || get("/metrics", wait).unwrap())).collect();
        // Time for both to be read into their handlers (local connections; a loaded runner
        // gets a wide margin).
        std::thread::sleep(Duration::from_millis(500));
        let refused = get("/healthz", wait);
        assert!(refused.as_ref().map_or(true, |a| a.is_empty()), "closed unanswered: {refused:?}");
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(count(&server.stats.connections_refused), 1);
        assert_eq!(count(&server.stats.connections_evicted), 0, "nothing idle to evict");
        for _ in 0..walks.len() {
            server.release.send(()).unwrap();
        }
        for w in walks {
            let answer = w.join().unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "the held requests are still answered: {answer}");
        }
        // With the slots free again, a newcomer is served.
        assert!(get("/healthz", wait).unwrap().starts_with("HTTP/1.1 200"));
        server.stop();
    }

    #[test]
    fn unknown_paths_and_methods_are_answered_with_a_message() {
        let server = HeldServer::start(Limits::default());
        let get = server.getter();
        let wait = Some(Duration::from_secs(10));
        let nope = get("/api/v1/nope", wait).unwrap();
        assert!(nope.starts_with("HTTP/1.1 404") && nope.contains("no endpoint at /api/v1/nope"), "{nope}");
        let get_reload = get("/api/v1/reload", wait).unwrap();
        assert!(get_reload.starts_with("HTTP/1.1 405"), "{get_reload}");
        assert!(get_reload.contains("/api/v1/reload does not take GET"), "{get_reload}");
        assert!(get_reload.to_ascii_lowercase().contains("allow: post"), "{get_reload}");
        server.stop();
    }

    #[test]
    fn connections_the_http_layer_ends_in_an_error_are_counted_by_kind() {
        use std::io::{Read, Write};
        let server = HeldServer::start(Limits { header_read: Duration::from_millis(300), ..Limits::default() });
        let count =
            |k: ConnectionError| server.stats.connection_errors[k as usize].load(std::sync::atomic::Ordering::Relaxed);
        // Sends `bytes`, then reads until the server closes; the answer.
        let send = |bytes: &[u8]| {
            let mut c = std::net::TcpStream::connect(server.addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(bytes).unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            answer
        };
        // Counted as the connection's task ends, just after the client sees the close.
        let settled = |k: ConnectionError, n: u64, wait: Duration| {
            let t = std::time::Instant::now();
            while count(k) < n && t.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(50));
            count(k)
        };
        let slow = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
        assert_eq!(slow, "", "half a head is closed unanswered");
        assert_eq!(settled(ConnectionError::HeaderTimeout, 1, Duration::from_secs(5)), 1);
        let garbage = send(b"BLAH\r\n\r\n");
        assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
        assert_eq!(settled(ConnectionError::BadRequest, 1, Duration::from_secs(5)), 1);
        // A keep-alive connection closed idle after its answer is no error.
        let idle = send(format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).as_bytes());
        assert!(idle.starts_with("HTTP/1.1 200"), "{idle}");
        let idle_closed = settled(ConnectionError::HeaderTimeout, 2, Duration::from_millis(500));
        assert_eq!(idle_closed, 1, "an idle keep-alive connection's close is not counted");
        assert_eq!(count(ConnectionError::Broken), 0);
        server.stop();
    }

    /// A connection with a small receive buffer that pipelines `/healthz` requests until its
    /// writes stall and never reads an answer: the server's writes to it are stuck.
    fn unread_client(addr: SocketAddr) -> std::net::TcpStream {
        use std::io::Write;
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2), no pointers.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a new socket that nothing else owns; the stream closes it.
        let s = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        let small: libc::c_int = 2048;
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: setsockopt reads `len` bytes of `small`, an int that outlives the call.
        let rc = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw const small).cast(), len) };
        assert_eq!(rc, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let std::net::SocketAddr::V4(v4) = addr else { unreachable!("bound on 127.0.0.1") };
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `sa` is a sockaddr_in of `len` bytes; the fd is the stream's.
        let rc = unsafe { libc::connect(std::os::fd::AsRawFd::as_raw_fd(&s), (&raw const sa).cast(), len) };
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        let mut s = s;
        // A write blocked this long means the server has stopped reading: its writes to this
        // client are stuck. Shorter, a server that was only descheduled (a loaded machine) ends
        // the burst early, its answers all fit in the socket buffers and nothing is stuck.
        s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        let burst = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").repeat(100);
        while s.write_all(burst.as_bytes()).is_ok() {}
        s
    }

    #[test]
    fn clients_that_never_read_their_answers_give_their_slots_up_past_their_time() {
        // Each client takes a second or more to get stuck (see `unread_client`): their time
        // must not run out before (a connection closed at its time with nothing stuck is not
        // evicted).
        let connection = Duration::from_millis(2500);
        let server = HeldServer::start(Limits { connection, max_connections: 2, ..Limits::default() });
        let t = std::time::Instant::now();
        let stuck: Vec<_> = (0..2).map(|_| unread_client(server.addr)).collect();
        // Past their time (they kept the slots until ANSWER_GRACE ran out: 5 minutes).
        std::thread::sleep((connection + Duration::from_millis(300)).saturating_sub(t.elapsed()));
        let health = server.getter()("/healthz", Some(Duration::from_secs(5))).expect("answered");
        assert!(health.starts_with("HTTP/1.1 200"), "a newcomer gets the slot of one that does not read: {health:?}");
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        assert!(count(&server.stats.connections_evicted) >= 1);
        assert_eq!(count(&server.stats.connections_refused), 0);
        drop(stuck);
        server.stop();
    }

    #[test]
    fn a_request_being_answered_when_its_connections_time_is_up_is_still_answered() {
        let server = HeldServer::start(Limits { connection: Duration::from_millis(300), ..Limits::default() });
        let get = server.getter();
        let held = std::thread::spawn(move || get("/metrics", Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(800));
        server.release.send(()).unwrap();
        let answer = held.join().unwrap().expect("answered");
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("# metrics\n"), "{answer:?}");
        server.stop();
    }

    #[test]
    fn a_body_that_does_not_parse_is_told_from_one_too_large() {
        use std::io::{Read, Write};
        let server = HeldServer::start(Limits::default());
        let post = |body: &str| {
            let mut c = std::net::TcpStream::connect(server.addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let head = format!(
                "POST /api/v1/fdb HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                server.addr
            );
            c.write_all(format!("{head}{body}").as_bytes()).unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            answer
        };
        let bad = post("zz\r\n{}\r\n0\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400") && bad.contains("does not parse"), "{bad}");
        let chunk = "x".repeat(1000);
        let big = post(&format!("{}0\r\n\r\n", format!("3e8\r\n{chunk}\r\n").repeat(5)));
        assert!(big.starts_with("HTTP/1.1 413") && big.contains("over 4096 bytes"), "{big}");
        server.stop();
    }

    #[test]
    fn a_change_applied_late_is_answered_500_and_a_refusal_422() {
        let late = ChangeError::AppliedLate("worker(s) [1] did not apply the change within 5 s; applied: ...".into());
        assert_eq!(late.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(late.to_string().starts_with(APPLIED_LATE), "{late}");
        let refused = ChangeError::Refused("reload refused: x.yaml:3:5: unknown key".into());
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn refusals_of_one_kind_are_logged_once_per_period() {
        let l = RefusalLog::default();
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "wrong token"), Some(0));
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "wrong token"), None);
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "no header"), Some(0), "another reason");
        assert_eq!(l.admit(StatusCode::FORBIDDEN, "wrong token"), Some(0), "another status");
        // A period later the next line carries the count of those not logged.
        l.0.lock().unwrap().get_mut(&(401, "wrong token".into())).unwrap().0 -= REFUSAL_LOG_EVERY;
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "wrong token"), Some(1));
        // Reasons that quote the request cannot grow the map without bound.
        for i in 0..1000 {
            l.admit(StatusCode::MISDIRECTED_REQUEST, &format!("host h{i}"));
        }
        assert!(l.0.lock().unwrap().len() <= REFUSAL_KINDS + 1);
    }

    #[test]
    fn a_count_not_logged_is_written_when_its_period_ends_even_if_its_reason_does_not_return() {
        let l = RefusalLog::default();
        let age = |why: &str| l.0.lock().unwrap().get_mut(&(401, why.into())).unwrap().0 -= REFUSAL_LOG_EVERY;
        l.admit(StatusCode::UNAUTHORIZED, "wrong token");
        l.admit(StatusCode::UNAUTHORIZED, "wrong token");
        l.admit(StatusCode::UNAUTHORIZED, "wrong token");
        l.admit(StatusCode::UNAUTHORIZED, "no header");
        assert_eq!(l.overdue(), vec![], "the period is not over");
        age("wrong token");
        age("no header");
        assert_eq!(l.overdue(), vec![(401, "wrong token".to_string(), 2)], "only the kind with a count");
        assert!(!l.0.lock().unwrap().contains_key(&(401, "no header".into())), "a quiet kind is forgotten");
        // The count was written: it starts again, and the period with it.
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "wrong token"), None);
        assert_eq!(l.admit(StatusCode::UNAUTHORIZED, "no header"), Some(0));
        age("wrong token");
        assert_eq!(l.overdue(), vec![(401, "wrong token".to_string(), 1)]);
        // At shutdown every count is written, its period over or not.
        for _ in 0..3 {
            l.admit(StatusCode::OK, "POST /api/v1/fdb");
        }
        assert_eq!(l.overdue(), vec![]);
        assert_eq!(l.remaining(), vec![(200, "POST /api/v1/fdb".to_string(), 2)]);
        assert_eq!(l.remaining(), vec![], "written once");
    }

    #[test]
    fn only_names_of_this_server_pass_the_host_check() {
        let lo: SocketAddr = "127.0.0.1:9187".parse().unwrap();
        for ok in ["localhost", "LOCALHOST:9187", "127.0.0.1", "127.0.0.1:8080", "[::1]", "[::1]:9187", "127.0.0.2:1"] {
            assert!(names_this_server(ok, lo), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9187",
            "localhost.evil.example",
            "10.0.0.1:9187",
            "::1",
            "[::1",
            "[::1]x",
            "localhost:x",
            "localhost:99999",
            "",
        ] {
            assert!(!names_this_server(bad, lo), "{bad}");
        }
        let one: SocketAddr = "10.0.0.1:9187".parse().unwrap();
        assert!(names_this_server("10.0.0.1:9187", one) && !names_this_server("10.0.0.2", one));
        let any: SocketAddr = "0.0.0.0:9187".parse().unwrap();
        assert!(names_this_server("192.0.2.7:9187", any) && names_this_server("[2001:db8::1]", any));
        assert!(!names_this_server("switch.example:9187", any), "a domain name is what DNS rebinding uses");
    }

    #[test]
    fn only_an_http_1_0_request_may_come_without_a_host() {
        let lo: SocketAddr = "127.0.0.1:9187".parse().unwrap();
        let bare = |v: axum::http::Version| {
            Request::builder().version(v).uri("/healthz").body(axum::body::Body::empty()).unwrap()
        };
        assert!(host_allowed(&bare(axum::http::Version::HTTP_10), lo).is_ok());
        let why = host_allowed(&bare(axum::http::Version::HTTP_11), lo).unwrap_err();
        assert!(why.contains("no Host header"), "{why}");
        let mut evil = bare(axum::http::Version::HTTP_10);
        evil.headers_mut().insert(header::HOST, "evil.example".parse().unwrap());
        assert!(host_allowed(&evil, lo).is_err(), "a Host given is checked, whatever the version");
    }

    #[test]
    fn only_the_exact_bearer_token_is_authorized() {
        let with = |v: &[&str]| {
            let mut h = HeaderMap::new();
            for v in v {
                h.append(header::AUTHORIZATION, v.parse().unwrap());
            }
            authorized(&h, b"s3cret")
        };
        assert!(with(&["Bearer s3cret"]).is_ok() && with(&["bearer  s3cret "]).is_ok());
        for bad in [&[][..], &["Bearer s3cre"], &["Bearer s3cret2"], &["Basic s3cret"], &["s3cret"], &["Bearer"]] {
            assert!(with(bad).is_err(), "{bad:?}");
        }
        let two = with(&["Bearer s3cret", "Bearer s3cret"]).unwrap_err();
        assert!(two.contains("carries 2 Authorization headers: send exactly one"), "{two}");
        assert!(with(&[]).unwrap_err().contains("needs an `Authorization: Bearer <token>` header"));
        assert!(equal_in_constant_time(b"a", b"a") && !equal_in_constant_time(b"a", b"b"));
    }
}
