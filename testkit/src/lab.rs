//! A lab of hosts on veth pairs, for the demo and the real-interface tests.
//!
//! Each host is a network namespace owned by a tiny child process (`unshare --net sleep`), made
//! with PR_SET_PDEATHSIG so it dies with us: when the host process dies its namespace goes, and
//! with it the veth pair. Every command run in a host ([`LabHost::cmd`]) dies with us too: a
//! process left in the namespace would keep it, and the veth pair, alive. So nothing is left
//! behind even when the lab's owner is SIGKILLed. The switch side of each veth stays in the
//! caller's namespace, where the switch attaches to it.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// One host: a namespace with `eth0` (its end of the veth) and an IPv4 address (IPv6 after
/// [`Lab::enable_ipv6`]). `eth0` keeps the kernel's default offloads, TX checksum offload
/// included, as a container's veth does.
pub struct LabHost {
    /// `h<i>`, counted from 1: how errors name the host.
    pub name: String,
    /// The switch-side veth end, in the caller's namespace.
    pub switch_if: String,
    /// `10.77.<subnet>.<i>`, a /24 on `eth0`.
    pub ip: String,
    /// `fd77:<subnet>::<i>`, configured by [`Lab::enable_ipv6`].
    pub ip6: String,
    /// `eth0`'s MAC address, `02:77:<subnet>:00:00:<i>` (hex).
    pub mac: String,
    keeper: Child,
}

impl LabHost {
    /// Runs `args` inside this host's namespace. The process is SIGKILLed when the thread that
    /// spawns it ends (see [`die_with_parent`]): the demo's iperf3 and ping (spawned by its main
    /// thread) end with the demo, however it ends. `nsenter` with only `-n` execs `args` in
    /// its own process (it forks only to enter a PID namespace), which keeps the signal.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t").arg(self.keeper.id().to_string()).arg("-n").arg("--").args(args);
        die_with_parent(&mut c);
        c
    }

    /// Runs `args` inside this host's namespace and collects its output; a failed exit is
    /// not an error.
    pub fn run(&self, args: &[&str]) -> Result<Output> {
        self.cmd(args).output().with_context(|| format!("cannot run {args:?} in host {}", self.name))
    }

    /// Sends `count` pings to `ip`; true when at least one answer came back.
    pub fn ping(&self, ip: &str, count: u32) -> Result<bool> {
        let out = self.run(&["ping", "-c", &count.to_string(), "-W", "1", "-i", "0.2", ip])?;
        Ok(out.status.success())
    }

    /// Runs `args` inside this host's namespace; an error names the command and its stderr.
    pub fn must(&self, args: &[&str]) -> Result<()> {
        let out = self.run(args)?;
        if !out.status.success() {
            bail!("host {}: `{}` failed: {}", self.name, args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// The PID of the process that holds the host's namespace (`/proc/<pid>/ns/net`, or
    /// `netns <pid>` to `ip link`).
    pub fn pid(&self) -> u32 {
        self.keeper.id()
    }
}

/// The hosts of one lab; dropping it ends their namespaces and deletes their veths.
pub struct Lab {
    /// The hosts, `h1` first.
    pub hosts: Vec<LabHost>,
}

/// True when we can make namespaces and veths (root with CAP_NET_ADMIN and CAP_SYS_ADMIN).
pub fn can_build() -> Result<(), String> {
    // SAFETY: geteuid has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    for tool in ["ip", "unshare", "nsenter"] {
        if Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            return Err(format!("`{tool}` is not installed"));
        }
    }
    Ok(())
}

/// Has the process `cmd` starts SIGKILLed when its parent goes (PR_SET_PDEATHSIG). The kernel
/// sends the signal when the *thread* that forked it ends, so spawn from a thread that lives as
/// long as the process should; an exec that gains privileges (setuid) clears it. A parent
/// that died before the child set it sends nothing: the child sees another parent then and
/// fails to start.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    let hook = move || {
        // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getppid has no side effects.
        if unsafe { libc::getppid() } as u32 != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and makes two async-signal-safe
    // syscalls, allocating nothing.
    unsafe { cmd.pre_exec(hook) };
}

fn sh(args: &[&str]) -> Result<()> {
    let out =
        Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Lab {
    /// `n` hosts `10.77.<subnet>.{1..n}/24` on veths named `<prefix>s<i>` (switch side), each with
    /// `queues` RX/TX queues. `prefix` must be short (interface names are at most 15 bytes).
    pub fn create(prefix: &str, n: usize, queues: u32, subnet: u8) -> Result<Lab> {
        can_build().map_err(|e| anyhow::anyhow!("cannot build the lab: {e}"))?;
        let mut lab = Lab { hosts: Vec::new() };
        for i in 1..=n {
            let mut keeper = Command::new("unshare");
            keeper
                .args(["--net", "sleep", "infinity"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            die_with_parent(&mut keeper);
            let keeper = keeper.spawn().context("cannot start a lab host (unshare)")?;
            let pid = keeper.id().to_string();
            let switch_if = format!("{prefix}s{i}");
            let ip = format!("10.77.{subnet}.{i}");
            let mac = format!("02:77:{subnet:02x}:00:00:{i:02x}");
            let host = LabHost {
                name: format!("h{i}"),
                switch_if: switch_if.clone(),
                ip: ip.clone(),
                ip6: format!("fd77:{subnet}::{i}"),
                mac: mac.clone(),
                keeper,
            };
            lab.hosts.push(host);
            // Wait until unshare has switched namespaces (its /proc ns link differs from ours).
            for _ in 0..100 {
                let ours = std::fs::read_link("/proc/self/ns/net").ok();
                let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
                if theirs.is_some() && theirs != ours {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let q = queues.to_string();
            sh(&[
                "ip",
                "link",
                "add",
                &switch_if,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "netns",
                &pid,
            ])?;
            sh(&["ip", "link", "set", &switch_if, "up"])?;
            let h = lab.hosts.last().expect("just pushed");
            for args in [
                vec!["ip", "link", "set", "eth0", "address", &mac],
                vec!["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
                vec!["ip", "link", "set", "eth0", "up"],
                vec!["ip", "link", "set", "lo", "up"],
                vec!["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ] {
                h.must(&args)?;
            }
        }
        Ok(lab)
    }
}

impl Lab {
    /// Turns IPv6 on in every host (it is off by default, so tests that count frames see no
    /// router or neighbour solicitations) with address `ip6/64`, no duplicate detection.
    pub fn enable_ipv6(&self) -> Result<()> {
        for h in &self.hosts {
            let addr = format!("{}/64", h.ip6);
            for args in [
                vec!["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.eth0.disable_ipv6=0"],
                vec!["ip", "-6", "addr", "add", &addr, "dev", "eth0", "nodad"],
            ] {
                h.must(&args)?;
            }
        }
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            let _ = h.keeper.kill();
            let _ = h.keeper.wait();
        }
        // The namespaces die with their keepers, taking the veth pairs along; make sure.
        for h in &self.hosts {
            let _ = Command::new("ip").args(["link", "del", &h.switch_if]).stderr(Stdio::null()).status();
        }
    }
}
