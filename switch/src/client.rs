//! `wasmswitch status | ports | fdb [show|add|del|flush] | plugins | shadow [show|promote|discard] | reload`: a client for a running daemon's control
//! API. The address and token come from the daemon's config file (`-c`) or from flags; output is
//! a table, or the API's JSON with `--json`.
//!
//! A minimal HTTP/1.1 client over a `TcpStream` (one request per connection): the API is local
//! and small, and this keeps an HTTP client stack out of the binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Where the daemon listens and the token its mutating endpoints want.
pub struct Target {
    /// The daemon's address: `--addr`, else its config's `metrics.listen`, else 127.0.0.1:9187.
    pub addr: SocketAddr,
    token: Option<Vec<u8>>,
}

impl Target {
    /// From the config file when given (its `metrics.listen` and `control.token_file`), then
    /// the flags (which win), else the default address without a token.
    pub fn new(config: Option<&Path>, addr: Option<SocketAddr>, token_file: Option<&Path>) -> Result<Target> {
        // Only the keys that find the daemon: the rest of the file is the daemon's to judge.
        let keys = config.map(crate::config::daemon_keys).transpose()?;
        let addr = addr.or(keys.as_ref().map(|k| k.0)).unwrap_or(([127, 0, 0, 1], 9187).into());
        let from_config = keys.and_then(|k| k.1);
        let file = match (token_file, &from_config) {
            (Some(f), _) => Some((f, "--token-file".to_string())),
            (None, Some(f)) => Some((f.as_path(), format!("control.token_file {}", f.display()))),
            (None, None) => None,
        };
        let token = match file {
            Some((f, what)) => {
                Some(crate::config::read_token(f).map_err(|e| anyhow::anyhow!("{what}: {e}"))?.as_bytes().to_vec())
            }
            None => None,
        };
        Ok(Target { addr, token })
    }

    /// One request; (status, body). Reloads may compile plugins for a while: `timeout` says how
    /// long to wait for the answer.
    fn request(&self, method: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
        self.request_with(method, path, "", timeout)
    }

    /// [`Target::request`] with a JSON body.
    fn request_with(&self, method: &str, path: &str, body: &str, timeout: Duration) -> Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))
            .with_context(|| format!("cannot reach the daemon at {} (is it running? see `-c`/`--addr`)", self.addr))?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(Duration::from_secs(3)))?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        if method != "GET" {
            if let Some(t) = &self.token {
                req += &format!("Authorization: Bearer {}\r\n", String::from_utf8_lossy(t));
            }
            req += &format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len());
        }
        req += "\r\n";
        req += body;
        s.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        if let Err(e) = s.read_to_end(&mut raw) {
            // A read timeout shows as EAGAIN, which does not say that time ran out.
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                bail!("{method} {path}: the daemon at {} did not answer within {timeout:?}", self.addr);
            }
            return Err(anyhow::Error::new(e).context("reading the answer"));
        }
        parse_response(&raw)
    }

    fn get_json(&self, path: &str) -> Result<Value> {
        let (st, body) = self.request("GET", path, Duration::from_secs(10))?;
        if st != 200 {
            bail!("GET {path}: {st} {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON"))
    }
}

/// Status and body of an HTTP/1.1 response (plain or chunked body). A body shorter than its
/// `Content-Length` is an error: the connection closed before the whole answer came (the
/// daemon ends a connection past its time, whoever is reading), and half an answer is none.
fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").context("an incomplete HTTP answer")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if !chunked {
        if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            if body.len() < len {
                bail!("the answer was cut short: {} of its {len} bytes came before the connection closed", body.len());
            }
        }
        return Ok((status, String::from_utf8_lossy(body).into_owned()));
    }
    let body = String::from_utf8_lossy(body);
    let mut out = String::new();
    let mut rest = &*body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).context("a bad chunk size")?;
        if n == 0 {
            return Ok((status, out));
        }
        if after.len() < n {
            break;
        }
        out += &after[..n];
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    bail!("the answer was cut short: its last chunk did not come before the connection closed")
}

/// What the client asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Health and ports (`/healthz`, `GET /api/v1/ports`); unhealthy or a port down fails.
    Status,
    /// The ports and their counters (`GET /api/v1/ports`).
    Ports,
    /// The FDB's entries that every filter given selects.
    Fdb {
        /// Only entries on this port (a port's name).
        port: Option<String>,
        /// Only entries in this VLAN.
        vlan: Option<u16>,
        /// A MAC prefix, 1 to 6 bytes.
        mac: Option<String>,
    },
    /// A static FDB entry.
    FdbAdd {
        /// The station's MAC.
        mac: String,
        /// Its VLAN.
        vlan: u16,
        /// The port frames to `mac` leave by.
        port: String,
    },
    /// Removes the entry of `mac` in `vlan`, static or learned.
    FdbDel {
        /// The entry's MAC.
        mac: String,
        /// The entry's VLAN.
        vlan: u16,
    },
    /// Learned entries (static ones too with `statics`) matching every condition given.
    FdbFlush {
        /// Only entries on this port.
        port: Option<String>,
        /// Only entries in this VLAN.
        vlan: Option<u16>,
        /// Static entries too.
        statics: bool,
    },
    /// Every plugin instance with its state and counters (`GET /api/v1/plugins`).
    Plugins,
    /// Reloads the config (`POST /api/v1/reload`); a refused reload fails.
    Reload,
    /// Every port's shadow chain and its verdict matrix.
    Shadow,
    /// Promote (`true`) or discard a port's shadow chain.
    ShadowChange {
        /// The port whose shadow chain changes.
        port: String,
        /// `true` to promote, `false` to discard.
        promote: bool,
    },
}

/// Asks the daemon and prints the answer; an error (or a refused reload) is a failure.
pub fn run(target: &Target, ask: Ask, json: bool) -> Result<()> {
    match ask {
        Ask::Status => show_status(target, json),
        Ask::Ports => {
            let ports = target.get_json("/api/v1/ports")?;
            if json {
                println!("{ports}");
            } else {
                print_ports(&ports);
            }
            Ok(())
        }
        Ask::Fdb { port, vlan, mac } => show_fdb(target, port, vlan, mac, json),
        Ask::FdbAdd { mac, vlan, port } => {
            let body = serde_json::json!({"mac": mac, "vlan": vlan, "port": port});
            edit(target, "POST", "/api/v1/fdb", &body.to_string(), json)
        }
        Ask::FdbDel { mac, vlan } => {
            edit(target, "DELETE", &format!("/api/v1/fdb/{vlan}/{}", path_segment(&mac)), "", json)
        }
        Ask::FdbFlush { port, vlan, statics } => {
            let body = serde_json::json!({"port": port, "vlan": vlan, "static": statics});
            edit(target, "POST", "/api/v1/fdb/flush", &body.to_string(), json)
        }
        Ask::Plugins => show_plugins(target, json),
        Ask::Shadow => show_shadow(target, json),
        Ask::ShadowChange { port, promote } => change_shadow(target, &port, promote, json),
        Ask::Reload => reload(target, json),
    }
}

/// A number of the API's answer (0 where it is not one).
fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A string of the API's answer as it reads (anything else as JSON).
fn text(v: &Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())
}

/// Health and ports; an unhealthy daemon or a port that cannot forward is a failure.
fn show_status(target: &Target, json: bool) -> Result<()> {
    let (st, health) = target.request("GET", "/healthz", Duration::from_secs(5))?;
    let ports = target.get_json("/api/v1/ports")?;
    let down = ports_down(&ports);
    if json {
        println!(
            "{}",
            serde_json::json!({"healthy": st == 200, "health": health.trim(), "ports_down": down.len(), "ports": ports["ports"]})
        );
    } else {
        let state = match (st == 200, down.is_empty()) {
            (false, _) => "UNHEALTHY",
            (true, true) => "healthy",
            (true, false) => "DEGRADED",
        };
        println!("wasmswitch at {}: {state}", target.addr);
        if st != 200 {
            println!("  {}", health.trim());
        }
        if !down.is_empty() {
            println!("  ports down: {}", down.join(", "));
        }
        print_ports(&ports);
    }
    if st != 200 {
        bail!("the daemon is not healthy");
    }
    if !down.is_empty() {
        bail!("{} port(s) cannot forward: {}", down.len(), down.join(", "));
    }
    Ok(())
}

/// Every plugin, one row per (port, chain, plugin) summed over workers.
fn show_plugins(target: &Target, json: bool) -> Result<()> {
    let plugins = target.get_json("/api/v1/plugins")?;
    if json {
        println!("{plugins}");
    } else {
        // One row per (port, chain, plugin), summed over workers.
        struct Row {
            key: (String, String, String),
            component: String,
            workers: u64,
            batches: u64,
            packets: u64,
            faults: u64,
            quarantined: u64,
            /// Verdicts: pass, drop, and the rest (redirect, host, host-copy).
            verdicts: [u64; 3],
        }
        let mut rows: Vec<Row> = Vec::new();
        for p in plugins["plugins"].as_array().into_iter().flatten() {
            let key = (text(&p["port"]), text(&p["chain"]), text(&p["plugin"]));
            let i = match rows.iter().position(|r| r.key == key) {
                Some(i) => i,
                None => {
                    // The first 12 hex digits of the component's SHA-256, as `git` shortens.
                    let component = text(&p["component_sha256"]).chars().take(12).collect();
                    rows.push(Row {
                        key,
                        component,
                        workers: 0,
                        batches: 0,
                        packets: 0,
                        faults: 0,
                        quarantined: 0,
                        verdicts: [0; 3],
                    });
                    rows.len() - 1
                }
            };
            let r = &mut rows[i];
            r.workers += 1;
            r.batches += num(&p["batches"]);
            r.packets += num(&p["packets"]);
            r.faults += num(&p["faults"]);
            r.quarantined += u64::from(p["quarantined"].as_bool().unwrap_or(false));
            let v = &p["verdicts"];
            r.verdicts[0] += num(&v["pass"]);
            r.verdicts[1] += num(&v["drop"]);
            r.verdicts[2] += num(&v["redirect"]) + num(&v["host"]) + num(&v["host_copy"]);
        }
        println!(
            "{:<16} {:<6} {:<16} {:<12} {:>7} {:>12} {:>14} {:>8} {:>11} {:>14} {:>14} {:>14}",
            "port",
            "chain",
            "plugin",
            "component",
            "workers",
            "batches",
            "packets",
            "faults",
            "quarantined",
            "pass",
            "drop",
            "other"
        );
        for r in rows {
            let (port, chain, plugin) = &r.key;
            let [pass, drop, other] = r.verdicts;
            println!(
                "{port:<16} {chain:<6} {plugin:<16} {:<12} {:>7} {:>12} {:>14} {:>8} {:>11} {pass:>14} {drop:>14} {other:>14}",
                r.component,
                r.workers,
                r.batches,
                r.packets,
                r.faults,
                format!("{}/{}", r.quarantined, r.workers)
            );
        }
    }
    Ok(())
}

/// Every port's shadow chain and its verdict matrix.
fn show_shadow(target: &Target, json: bool) -> Result<()> {
    let shadow = target.get_json("/api/v1/shadow")?;
    if json {
        println!("{shadow}");
    } else {
        let ports = shadow["ports"].as_array().cloned().unwrap_or_default();
        if ports.is_empty() {
            println!("no port has a shadow chain");
        }
        for p in &ports {
            let names = |v: &Value| v.as_array().into_iter().flatten().map(text).collect::<Vec<_>>().join(", ");
            println!(
                "port {}: live [{}], shadow [{}]: {} packets compared, {} with another verdict",
                text(&p["port"]),
                names(&p["live"]),
                names(&p["shadow"]),
                num(&p["packets"]),
                num(&p["differ"])
            );
            let quarantined = names(&p["quarantined"]);
            if !quarantined.is_empty() {
                println!(
                    "  quarantined on some worker: {quarantined}: there its verdicts are its on_error policy's, not its own"
                );
            }
            // Rows: the live verdict; columns: the shadow verdict.
            let kinds = ["pass", "drop", "redirect", "host", "host_copy"];
            print!("  {:<12}", "live\\shadow");
            for k in kinds {
                print!(" {k:>12}");
            }
            println!();
            for l in kinds {
                print!("  {l:<12}");
                for k in kinds {
                    print!(" {:>12}", num(&p["matrix"][l][k]));
                }
                println!();
            }
        }
    }
    Ok(())
}

/// Promotes (`promote`) or discards port `port`'s shadow chain.
fn change_shadow(target: &Target, port: &str, promote: bool, json: bool) -> Result<()> {
    let (action, done) = if promote { ("promote", "promoted") } else { ("discard", "discarded") };
    let path = format!("/api/v1/ports/{}/shadow/{action}", path_segment(port));
    let (st, body) = target.request_with("POST", &path, "", Duration::from_secs(60))?;
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| Value::String(body.trim().to_string()));
    if json {
        println!("{answer}");
    }
    match st {
        200 if json => {}
        200 => {
            let names = answer
                .get(done)
                .and_then(Value::as_array)
                .map(|a| a.iter().map(text).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            println!("port {port}: shadow chain [{names}] {done}");
            println!("note: {}", text(&answer["note"]));
        }
        401 => bail!("refused: the daemon wants its token (`-c` with the daemon's config, or --token-file)"),
        _ => bail!("{action} answered {st}: {}", answer.get("error").and_then(Value::as_str).unwrap_or(&body)),
    }
    Ok(())
}

/// Asks for a reload; a refused or late one is a failure.
fn reload(target: &Target, json: bool) -> Result<()> {
    let (st, body) = target.request("POST", "/api/v1/reload", Duration::from_secs(300))?;
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| Value::String(body.trim().to_string()));
    if json {
        println!("{}", serde_json::json!({"status": st, "answer": answer}));
    } else {
        // The API answers {"status", "summary"} or {"status", "error"}.
        let t = answer.get("summary").or_else(|| answer.get("error")).unwrap_or(&answer);
        println!("{}", text(t));
    }
    match st {
        200 => {}
        401 => {
            bail!("reload refused: the daemon wants its token (`-c` with the daemon's config, or --token-file)")
        }
        500 => bail!("the reload was applied, but a worker took it late (above)"),
        _ => bail!("reload answered {st}"),
    }
    Ok(())
}

/// How often a page refused with 503 (the daemon's queue of pages full) is asked again.
const PAGE_RETRIES: u32 = 30;

/// Every page of the FDB listing, printed as it comes (the table's rows, or with `json` one
/// JSON document of the API's shape, `{"capacity", "entries"}`): the client holds one page at a
/// time, whatever the table holds.
fn show_fdb(target: &Target, port: Option<String>, vlan: Option<u16>, mac: Option<String>, json: bool) -> Result<()> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    let mut filters = String::new();
    for (k, v) in [("port", port), ("vlan", vlan.map(|v| v.to_string())), ("mac", mac)] {
        if let Some(v) = v {
            filters += &format!("&{k}={}", path_segment(&v));
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let (mut cursor, mut shown, mut capacity): (Option<String>, u64, Option<u64>) = (None, 0, None);
    loop {
        let after = cursor.as_deref().map(|c| format!("&cursor={}", path_segment(c))).unwrap_or_default();
        let path = format!("/api/v1/fdb?limit={}{filters}{after}", crate::api::FDB_PAGE_MAX);
        let page = page_of(target, &path, shown)?;
        if capacity.is_none() {
            capacity = Some(n(&page["capacity"]));
            if json {
                write!(out, "{{\"capacity\":{},\"entries\":[", n(&page["capacity"]))?;
            } else {
                writeln!(out, "{:>4} {:<18} {:<16} {:>8}", "vlan", "mac", "port", "age (s)")?;
            }
        }
        for e in page["entries"].as_array().into_iter().flatten() {
            if json {
                write!(out, "{}{e}", if shown == 0 { "" } else { "," })?;
            } else {
                let age = if e["static"].as_bool().unwrap_or(false) {
                    "static".to_string()
                } else {
                    n(&e["age_seconds"]).to_string()
                };
                writeln!(out, "{:>4} {:<18} {:<16} {:>8}", n(&e["vlan"]), s(&e["mac"]), s(&e["port"]), age)?;
            }
            shown += 1;
        }
        // Each page goes out as it comes (a pipe to `less` shows the first at once).
        out.flush()?;
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    if json {
        writeln!(out, "]}}")?;
    } else {
        let what = if shown == 1 { "entry" } else { "entries" };
        writeln!(out, "{shown} {what} (capacity {})", capacity.unwrap_or(0))?;
    }
    out.flush()?;
    Ok(())
}

/// One page of the FDB listing, asked again (after the `Retry-After` second) while the daemon's
/// queue of pages is full. `shown`: how many entries the listing printed before it.
fn page_of(target: &Target, path: &str, shown: u64) -> Result<Value> {
    for _ in 0..PAGE_RETRIES {
        let (st, body) = target.request("GET", path, Duration::from_secs(10))?;
        let error = || {
            serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| body.trim().to_string())
        };
        match st {
            200 => return serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON")),
            503 => std::thread::sleep(Duration::from_secs(1)),
            409 => bail!("the listing stopped after {shown} entries: {}", error()),
            _ => bail!("GET {path}: {st}: {}", error()),
        }
    }
    bail!("GET {path}: the daemon was busy (503) {PAGE_RETRIES} times in a row")
}

/// `s` as one segment of a URL path: every byte but the unreserved ones (and `:`, which MACs
/// carry) percent-encoded, so that a name with a `/`, a space or a `?` reaches the daemon as
/// typed, to be refused there by name, instead of naming another path.
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An FDB edit: prints what the daemon did (or its JSON); a refusal is a failure.
fn edit(target: &Target, method: &str, path: &str, body: &str, json: bool) -> Result<()> {
    let (st, text) = target.request_with(method, path, body, Duration::from_secs(10))?;
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.trim().to_string()));
    if json {
        println!("{answer}");
    }
    match st {
        200 if json => Ok(()),
        200 => {
            if let Some(n) = answer.get("removed") {
                println!("{n} entr{} removed", if n.as_u64() == Some(1) { "y" } else { "ies" });
            } else {
                println!("added");
            }
            Ok(())
        }
        401 => bail!("refused: the daemon wants its token (`-c` with the daemon's config, or --token-file)"),
        _ => bail!("{method} {path}: {st}: {}", answer.get("error").and_then(Value::as_str).unwrap_or(&text)),
    }
}

/// The ports of a `/api/v1/ports` answer that cannot forward (interface gone, link down), as
/// "`name` (why)": the daemon is well, the switch is not whole.
fn ports_down(ports: &Value) -> Vec<String> {
    ports["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["up"] == false)
        .map(|p| format!("`{}` ({})", p["name"].as_str().unwrap_or("?"), p["link"].as_str().unwrap_or("down")))
        .collect()
}

fn print_ports(ports: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    println!(
        "{:>3} {:<16} {:<7} {:<16} {:<10} {:>6} {:>4} {:>14} {:>14} {:>10}",
        "id", "port", "driver", "mode", "umem", "queues", "up", "rx packets", "tx packets", "drops"
    );
    for p in ports["ports"].as_array().into_iter().flatten() {
        println!(
            "{:>3} {:<16} {:<7} {:<16} {:<10} {:>6} {:>4} {:>14} {:>14} {:>10}",
            n(&p["id"]),
            p["name"].as_str().unwrap_or("?"),
            p["driver"].as_str().unwrap_or("?"),
            p["mode"].as_str().unwrap_or("?"),
            p["umem"].as_str().unwrap_or("?"),
            n(&p["queues"]),
            if p["up"].as_bool().unwrap_or(false) { "yes" } else { "no" },
            n(&p["rx_packets"]),
            n(&p["tx_packets"]),
            n(&p["drops"]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    #[test]
    fn status_names_the_ports_that_cannot_forward() {
        let ports = serde_json::json!({"ports": [
            {"name": "a", "up": true, "link": "up"},
            {"name": "b", "up": false, "link": "down"},
            {"name": "c", "up": false, "link": "gone"},
            {"name": "s", "up": true},
        ]});
        assert_eq!(super::ports_down(&ports), ["`b` (down)", "`c` (gone)"]);
    }

    #[test]
    fn names_go_into_the_path_as_one_segment() {
        assert_eq!(super::path_segment("02:00:00:00:00:0a"), "02:00:00:00:00:0a");
        assert_eq!(super::path_segment("zz/../../x"), "zz%2F..%2F..%2Fx");
        assert_eq!(super::path_segment("a b?c#d%"), "a%20b%3Fc%23d%25");
        assert_eq!(super::path_segment("é"), "%C3%A9");
    }

    #[test]
    fn plain_and_chunked_answers_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, "{}".to_string()));
        let chunked = b"HTTP/1.1 422 X\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (422, "hello world".to_string()));
        assert!(parse_response(b"HTTP/1.1 200").is_err());
        // Cut short: fewer bytes than the length said, or no last chunk.
        let cut = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{\"entries\": [").unwrap_err();
        assert!(cut.to_string().contains("cut short: 13 of its 20 bytes"), "{cut}");
        let cut = parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n").unwrap_err();
        assert!(cut.to_string().contains("its last chunk did not come"), "{cut}");
    }
}
