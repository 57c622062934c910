//! Whether this machine can run a test that needs root, network namespaces, TUN or the lab's
//! tools. One rule for every crate: where it cannot, a test says why and passes, except under
//! `CI=true`, where it fails (CI is root; a test that cannot run there is a broken CI).

use std::process::Command;
use std::sync::OnceLock;

/// What a test needs of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Effective uid 0.
    Root,
    /// `ip netns add` works (root with CAP_SYS_ADMIN, namespaces enabled).
    Netns,
    /// `/dev/net/tun` exists.
    Tun,
    /// What [`crate::lab::Lab`] needs: root, and `ip`, `unshare`, `nsenter` installed.
    Lab,
}

impl Need {
    /// Why it is not met, or `None` when it is.
    fn missing(self) -> Option<String> {
        match self {
            // SAFETY: geteuid has no preconditions.
            Need::Root => (unsafe { libc::geteuid() } != 0).then(|| "not running as root".to_string()),
            Need::Netns => netns_probe().clone(),
            Need::Tun => {
                (!std::path::Path::new("/dev/net/tun").exists()).then(|| "/dev/net/tun is missing".to_string())
            }
            Need::Lab => crate::lab::can_build().err(),
        }
    }
}

/// Adding a namespace, tried once per test binary.
fn netns_probe() -> &'static Option<String> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let probe = format!("wsxprobe{}", std::process::id());
        match Command::new("ip").args(["netns", "add", &probe]).output() {
            Ok(o) if o.status.success() => {
                let _ = Command::new("ip").args(["netns", "del", &probe]).output();
                None
            }
            Ok(o) => Some(format!("network namespaces unavailable ({})", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Some(format!("network namespaces unavailable (running ip: {e})")),
        }
    })
}

/// True when `test` can run here. Otherwise it prints why and returns false, or, under
/// `CI=true`, panics naming what is missing.
pub fn ready(test: &str, needs: &[Need]) -> bool {
    let Some(why) = needs.iter().find_map(|n| n.missing()) else { return true };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: cannot run: {why} (CI=true)");
    }
    eprintln!("skipping {test}: {why}");
    false
}
