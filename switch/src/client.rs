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

/// Status and body of an HTTP/1.1 response (plain or chunked body).
fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").context("an incomplete HTTP answer")?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if !chunked {
        return Ok((status, body.to_string()));
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).context("a bad chunk size")?;
        if n == 0 || after.len() < n {
            break;
        }
        out += &after[..n];
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    Ok((status, out))
}

/// What the client asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    Status,
    Ports,
    Fdb,
    /// A static FDB entry.
    FdbAdd {
        mac: String,
        vlan: u16,
        port: String,
    },
    FdbDel {
        mac: String,
        vlan: u16,
    },
    /// Learned entries (static ones too with `statics`) matching every condition given.
    FdbFlush {
        port: Option<String>,
        vlan: Option<u16>,
        statics: bool,
    },
    Plugins,
    Reload,
    /// Every port's shadow chain and its verdict matrix.
    Shadow,
    /// Promote (`true`) or discard a port's shadow chain.
    ShadowChange {
        port: String,
        promote: bool,
    },
}

/// Asks the daemon and prints the answer; an error (or a refused reload) is a failure.
pub fn run(target: &Target, ask: Ask, json: bool) -> Result<()> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    match ask {
        Ask::Status => {
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
        }
        Ask::Ports => {
            let ports = target.get_json("/api/v1/ports")?;
            if json {
                println!("{ports}");
            } else {
                print_ports(&ports);
            }
        }
        Ask::Fdb => {
            let fdb = target.get_json("/api/v1/fdb")?;
            if json {
                println!("{fdb}");
            } else {
                let entries = fdb["entries"].as_array().cloned().unwrap_or_default();
                println!("{} entries (capacity {})", entries.len(), n(&fdb["capacity"]));
                println!("{:>4} {:<18} {:<16} {:>8}", "vlan", "mac", "port", "age (s)");
                for e in &entries {
                    let age = if e["static"].as_bool().unwrap_or(false) {
                        "static".to_string()
                    } else {
                        n(&e["age_seconds"]).to_string()
                    };
                    println!("{:>4} {:<18} {:<16} {:>8}", n(&e["vlan"]), s(&e["mac"]), s(&e["port"]), age);
                }
            }
        }
        Ask::FdbAdd { mac, vlan, port } => {
            let body = serde_json::json!({"mac": mac, "vlan": vlan, "port": port});
            edit(target, "POST", "/api/v1/fdb", &body.to_string(), json)?;
        }
        Ask::FdbDel { mac, vlan } => {
            edit(target, "DELETE", &format!("/api/v1/fdb/{vlan}/{}", path_segment(&mac)), "", json)?;
        }
        Ask::FdbFlush { port, vlan, statics } => {
            let body = serde_json::json!({"port": port, "vlan": vlan, "static": statics});
            edit(target, "POST", "/api/v1/fdb/flush", &body.to_string(), json)?;
        }
        Ask::Plugins => {
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
                    let key = (s(&p["port"]), s(&p["chain"]), s(&p["plugin"]));
                    let i = match rows.iter().position(|r| r.key == key) {
                        Some(i) => i,
                        None => {
                            // The first 12 hex digits of the component's SHA-256, as `git` shortens.
                            let component = s(&p["component_sha256"]).chars().take(12).collect();
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
                    r.batches += n(&p["batches"]);
                    r.packets += n(&p["packets"]);
                    r.faults += n(&p["faults"]);
                    r.quarantined += u64::from(p["quarantined"].as_bool().unwrap_or(false));
                    let v = &p["verdicts"];
                    r.verdicts[0] += n(&v["pass"]);
                    r.verdicts[1] += n(&v["drop"]);
                    r.verdicts[2] += n(&v["redirect"]) + n(&v["host"]) + n(&v["host_copy"]);
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
        }
        Ask::Shadow => {
            let shadow = target.get_json("/api/v1/shadow")?;
            if json {
                println!("{shadow}");
            } else {
                let ports = shadow["ports"].as_array().cloned().unwrap_or_default();
                if ports.is_empty() {
                    println!("no port has a shadow chain");
                }
                for p in &ports {
                    let names = |v: &Value| v.as_array().into_iter().flatten().map(&s).collect::<Vec<_>>().join(", ");
                    println!(
                        "port {}: live [{}], shadow [{}]: {} packets compared, {} with another verdict",
                        s(&p["port"]),
                        names(&p["live"]),
                        names(&p["shadow"]),
                        n(&p["packets"]),
                        n(&p["differ"])
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
                            print!(" {:>12}", n(&p["matrix"][l][k]));
                        }
                        println!();
                    }
                }
            }
        }
        Ask::ShadowChange { port, promote } => {
            let (action, done) = if promote { ("promote", "promoted") } else { ("discard", "discarded") };
            let path = format!("/api/v1/ports/{}/shadow/{action}", path_segment(&port));
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
                        .map(|a| a.iter().map(&s).collect::<Vec<_>>().join(", "))
                        .unwrap_or_default();
                    println!("port {port}: shadow chain [{names}] {done}");
                    println!("note: {}", s(&answer["note"]));
                }
                401 => bail!("refused: the daemon wants its token (`-c` with the daemon's config, or --token-file)"),
                _ => bail!("{action} answered {st}: {}", answer.get("error").and_then(Value::as_str).unwrap_or(&body)),
            }
        }
        Ask::Reload => {
            let (st, body) = target.request("POST", "/api/v1/reload", Duration::from_secs(300))?;
            let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| Value::String(body.trim().to_string()));
            if json {
                println!("{}", serde_json::json!({"status": st, "answer": answer}));
            } else {
                // The API answers {"status", "summary"} or {"status", "error"}.
                let text = answer.get("summary").or_else(|| answer.get("error")).unwrap_or(&answer);
                println!("{}", s(text));
            }
            match st {
                200 => {}
                401 => {
                    bail!("reload refused: the daemon wants its token (`-c` with the daemon's config, or --token-file)")
                }
                500 => bail!("the reload was applied, but a worker took it late (above)"),
                _ => bail!("reload answered {st}"),
            }
        }
    }
    Ok(())
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
    }
}
