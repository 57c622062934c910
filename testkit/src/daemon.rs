//! Running the daemon from a test: a free port, HTTP against its API, waiting for health,
//! signals, a scratch folder for its files, metrics read back (and checked by promtool).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A minimal HTTP/1.1 request; returns (status, body).
pub fn http(port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_with(port, method, path, &[], b"").map(|r| (r.status, r.body))
}

/// A response as [`http_with`] reads it.
#[derive(Debug)]
pub struct Reply {
    /// The status code; 0 when the answer has none.
    pub status: u16,
    /// The head's header lines, as sent.
    pub head: String,
    /// What follows the head, with a chunked body's chunk sizes left in.
    pub body: String,
}

/// An HTTP/1.1 request with extra header lines (`"Name: value"`) and a body. `Host: localhost`
/// and `Content-Length` are added unless `headers` has a `Host` (or `Transfer-Encoding`, for a
/// body the caller has chunked).
pub fn http_with(port: u16, method: &str, path: &str, headers: &[&str], body: &[u8]) -> std::io::Result<Reply> {
    http_full(port, method, path, headers, body, Duration::from_secs(5))
}

/// [`http`] waiting up to `timeout` for the answer (a reload on a busy machine takes a while).
pub fn http_within(port: u16, method: &str, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    http_full(port, method, path, &[], b"", timeout).map(|r| (r.status, r.body))
}

fn http_full(
    port: u16,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<Reply> {
    let has = |name: &str| headers.iter().any(|h| h.to_ascii_lowercase().starts_with(&format!("{name}:")));
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !has("host") {
        req += "Host: localhost\r\n";
    }
    if !has("transfer-encoding") && !has("content-length") {
        req += &format!("Content-Length: {}\r\n", body.len());
    }
    for h in headers {
        req += &format!("{h}\r\n");
    }
    req += "\r\n";
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").map(|(h, b)| (h.to_string(), b.to_string())).unwrap_or_default();
    // Bodies may be chunked; tests only search them, so leave the chunk sizes in.
    Ok(Reply { status, head, body })
}

/// Waits until `/healthz` answers 200.
pub fn wait_healthy(port: u16, child: &mut std::process::Child) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("daemon exited early: {st}");
        }
        if matches!(http(port, "GET", "/healthz"), Ok((200, _))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("daemon did not become healthy");
}

/// Sum of a metric's samples (all label sets) in a Prometheus text body.
pub fn metric_sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of one series, written as exposed (`name{label="v"}`), in a Prometheus text body.
#[allow(dead_code)]
pub fn series(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Sends `SIGTERM` to `child` (the daemon's orderly shutdown).
pub fn sigterm(child: &std::process::Child) {
    // SAFETY: kill on a child pid we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// Sends signal `sig` to `child`.
pub fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill on a child pid we own.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// The spawned process is killed when the thread that spawned it ends, so a test that fails
/// halfway leaves no daemon behind (holding a port, or the output pipe of the test run).
pub fn die_with_test(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let hook = || {
        // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and makes one async-signal-safe
    // syscall, allocating nothing.
    unsafe { cmd.pre_exec(hook) };
}

/// A scratch folder (world-readable, for daemons that drop to another user), removed on drop.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    /// A fresh, empty folder in the temporary directory, named after `tag`, the process and a
    /// count.
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("wasmswitch-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    /// The path of `name` in the folder.
    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }

    /// Writes `switch.yaml` atomically (a reload never reads half a file) and returns its path.
    pub fn write(&self, yaml: &str) -> std::path::PathBuf {
        let tmp = self.path("switch.yaml.tmp");
        let path = self.path("switch.yaml");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The lab host's UDP `RcvbufErrors`: datagrams that found a receiving socket's buffer full
/// (its reader not scheduled in time on a loaded machine). Tests count these apart from the
/// path's losses.
pub fn udp_rcvbuf_errors(h: &crate::lab::LabHost) -> u64 {
    let out = h.run(&["cat", "/proc/net/snmp"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().expect("Udp header"), udp.next().expect("Udp values"));
    let i = names.split_whitespace().position(|n| n == "RcvbufErrors").expect("RcvbufErrors column");
    values.split_whitespace().nth(i).and_then(|v| v.parse().ok()).expect("RcvbufErrors value")
}

/// Column `col` (0 = received bytes) of interface `ifname` in a `/proc/net/dev` text.
pub fn dev_column(text: &str, ifname: &str, col: usize) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{ifname}:")))
        .unwrap_or_else(|| panic!("{ifname} in /proc/net/dev"));
    let fields = line.split_once(':').unwrap().1;
    fields.split_whitespace().nth(col).and_then(|v| v.parse().ok()).expect("a /proc/net/dev counter")
}

/// True while an XDP program is attached to `ifname`.
pub fn xdp_attached(ifname: &str) -> bool {
    let out = std::process::Command::new("ip").args(["-d", "link", "show", ifname]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("xdp")
}

/// Waits up to 10 s for `cond`; a timeout fails the test naming `what`.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// promtool, when installed (CI installs it: a failure there when it is not), must accept the
/// exposition `metrics` without a word.
#[allow(dead_code)]
pub fn assert_promtool_accepts(metrics: &str) {
    use std::process::{Command, Stdio};
    // What `promtool check metrics` lets through: a histogram without its `+Inf` bucket
    // (`histogram_quantile` then answers NaN).
    for family in metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" histogram")) {
        for count in metrics.lines().filter_map(|l| l.strip_prefix(&format!("{family}_count"))) {
            let (labels, value) = count.rsplit_once(' ').unwrap();
            let inf = match labels.strip_suffix('}') {
                Some(l) => format!("{family}_bucket{l},le=\"+Inf\"}} {value}"),
                None => format!("{family}_bucket{{le=\"+Inf\"}} {value}"),
            };
            assert!(metrics.lines().any(|l| l == inf), "{family}: no `{inf}` for its count:\n{metrics}");
        }
    }
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut p) => {
            use std::io::Write;
            p.stdin.take().unwrap().write_all(metrics.as_bytes()).unwrap();
            let out = p.wait_with_output().unwrap();
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");
        }
        Err(_) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("promtool is not installed (scripts/setup.sh installs it)")
        }
        Err(_) => eprintln!("promtool not installed: exposition format not checked"),
    }
}
