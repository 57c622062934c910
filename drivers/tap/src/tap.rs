//! The TAP device itself: creation (TUNSETIFF), MAC, MTU and link state (ioctls).
//!
//! The device is created non-persistent: it exists exactly as long as one of its queue file
//! descriptors is open, so it disappears when the switch closes them, exits, or is SIGKILLed.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use wasmswitch_wire::MacAddr;

use crate::error::TapError;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
/// Fail with EBUSY instead of attaching when the name exists (an exclusive create).
const IFF_TUN_EXCL: libc::c_short = -0x8000; // 0x8000 as c_short
const ARPHRD_ETHER: u16 = 1;
/// `IFF_UP` as `ifr_flags` (a `short`) holds it.
#[expect(clippy::cast_possible_truncation, reason = "IFF_UP is 1")]
const IFF_UP: libc::c_short = libc::IFF_UP as libc::c_short;

/// What to create.
#[derive(Clone, Debug)]
pub struct TapConfig {
    /// Interface name (at most 15 bytes).
    pub name: String,
    /// The switch's own MAC on the host side (unicast, non-zero).
    pub mac: [u8; 6],
    /// MTU in bytes (1500 by default); at most what the host port's frames hold.
    pub mtu: u32,
    /// Queues (one file descriptor each, `IFF_MULTI_QUEUE` when more than one): one per host
    /// worker.
    pub queues: usize,
}

impl TapConfig {
    /// One queue named `name` with MAC `mac`, MTU 1500.
    pub fn new(name: &str, mac: [u8; 6]) -> Self {
        Self { name: name.to_string(), mac, mtu: 1500, queues: 1 }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff` (the one MAC parser, `wasmswitch_wire::MacAddr`'s) and
/// checks it is usable as an interface address.
pub fn parse_mac(s: &str) -> Result<[u8; 6], TapError> {
    let mac: MacAddr = s
        .parse()
        .map_err(|_| TapError::BadMac { mac: s.to_string(), why: "expected six hex bytes separated by ':'" })?;
    check_mac(mac)?;
    Ok(mac.0)
}

/// Checks that `mac` can be an interface's own address: unicast and not all zeros.
pub fn check_mac(mac: MacAddr) -> Result<(), TapError> {
    if mac.is_group() {
        return Err(TapError::BadMac {
            mac: mac.to_string(),
            why: "multicast/broadcast bit set: an interface address must be unicast",
        });
    }
    if mac == MacAddr::default() {
        return Err(TapError::BadMac { mac: mac.to_string(), why: "all zeros" });
    }
    Ok(())
}

/// A name the kernel takes for a new interface (what `wasmswitch check` asks of `host.tap`).
pub fn check_name(name: &str) -> Result<(), TapError> {
    let bad = |why| TapError::BadName { name: name.to_string(), why };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err(bad("longer than 15 bytes"));
    }
    // '%' too: the kernel takes a name with it as a pattern and makes "t%d" t0, not the name
    // asked for.
    if name.bytes().any(|b| matches!(b, b'/' | b':' | b'%' | 0) || b.is_ascii_whitespace()) {
        return Err(bad("contains '/', ':', '%', whitespace or NUL"));
    }
    if name == "." || name == ".." {
        return Err(bad("'.' and '..' are not interface names"));
    }
    Ok(())
}

/// Whether the switch could create its TAP as `name` here, as far as other interfaces go:
/// `Err(NameTaken)` when an interface that is not a TUN/TAP device has the name, so `run` could
/// never create it. An existing TAP passes: it may be a running switch's own (`check` before a
/// reload), and `run` names the conflict if it is not.
pub fn check_free(name: &str) -> Result<(), TapError> {
    if wasmswitch_sys::ifindex(name).is_some()
        && !std::path::Path::new("/sys/class/net").join(name).join("tun_flags").exists()
    {
        return Err(TapError::NameTaken { name: name.to_string() });
    }
    Ok(())
}

/// How long [`TapDevice::create`] waits for an existing TAP of its name to go away.
const GOING_AWAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the TUN/TAP device `name` goes away within [`GOING_AWAY`]: the previous instance's,
/// when the switch restarts, outlives that process by tens of milliseconds (io_uring hands
/// the TAP's file back from a kernel worker after the process is gone). Any other interface of
/// that name, or a TAP that stays, is taken.
fn going_away(name: &str) -> bool {
    let t = std::time::Instant::now();
    while std::path::Path::new("/sys/class/net").join(name).join("tun_flags").exists() {
        if t.elapsed() >= GOING_AWAY {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    wasmswitch_sys::ifindex(name).is_none()
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr
}

/// A TAP device owned by the switch.
#[derive(Debug)]
pub struct TapDevice {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    mtu: u32,
    /// Queue fds, taken by host workers; the device lives while any is open.
    queues: Vec<Option<OwnedFd>>,
    /// AF_INET datagram socket for the interface ioctls.
    ctl: OwnedFd,
}

impl TapDevice {
    /// Creates the device (exclusively: an existing interface of that name is an error), sets its
    /// MAC and MTU. The link stays down until [`set_up`](Self::set_up).
    pub fn create(cfg: &TapConfig) -> Result<Self, TapError> {
        check_name(&cfg.name)?;
        check_mac(MacAddr(cfg.mac))?;
        if !(68..=65535).contains(&cfg.mtu) {
            return Err(TapError::BadMtu { mtu: cfg.mtu, max: 65535 });
        }
        if cfg.queues == 0 {
            return Err(TapError::Config("a TAP needs at least one queue".into()));
        }
        if wasmswitch_sys::ifindex(&cfg.name).is_some() && !going_away(&cfg.name) {
            return Err(TapError::NameTaken { name: cfg.name.clone() });
        }
        let name = &cfg.name;
        let mut flags = IFF_TAP | IFF_NO_PI | IFF_TUN_EXCL;
        if cfg.queues > 1 {
            flags |= IFF_MULTI_QUEUE;
        }
        let mut queues = Vec::with_capacity(cfg.queues);
        for q in 0..cfg.queues {
            // SAFETY: the path is a valid C string; the result is checked.
            let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => TapError::NoTunDevice,
                    // The device file's mode, or a device cgroup (systemd's DeviceAllow=, which
                    // ProtectClock= and PrivateDevices= imply), not a capability (Debian's mode
                    // is 0666).
                    Some(libc::EPERM) | Some(libc::EACCES) => TapError::io(
                        "opening /dev/net/tun (its file mode does not let this user open it, or a device cgroup refuses it: under systemd, DeviceAllow=/dev/net/tun rw)",
                        name,
                        e,
                    ),
                    _ => TapError::io("opening /dev/net/tun", name, e),
                });
            }
            // SAFETY: `fd` was just opened and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut ifr = ifreq(name);
            // Only the first queue creates; later queues attach to it.
            ifr.ifr_ifru.ifru_flags = if q == 0 { flags } else { flags & !IFF_TUN_EXCL };
            // SAFETY: TUNSETIFF reads and writes one ifreq, which lives on our stack.
            let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut ifr) };
            if r < 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::EPERM) | Some(libc::EACCES) => TapError::PermissionDenied { name: name.clone() },
                    Some(libc::EBUSY) | Some(libc::EEXIST) if q == 0 => TapError::NameTaken { name: name.clone() },
                    Some(libc::EINVAL) if q == 0 && wasmswitch_sys::ifindex(name).is_some() => {
                        TapError::NameTaken { name: name.clone() }
                    }
                    _ => TapError::io("TUNSETIFF", name, e),
                });
            }
            queues.push(Some(fd));
        }
        // SAFETY: plain socket(2) call; the result is checked.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            return Err(TapError::io("socket(AF_INET) for ioctls", name, io::Error::last_os_error()));
        }
        // SAFETY: `s` was just created and is owned by nobody else.
        let ctl = unsafe { OwnedFd::from_raw_fd(s) };
        let ifindex = wasmswitch_sys::ifindex(name)
            .ok_or_else(|| TapError::io("if_nametoindex after create", name, io::Error::last_os_error()))?;
        let mut dev = TapDevice { name: name.clone(), ifindex, mac: cfg.mac, mtu: cfg.mtu, queues, ctl };
        dev.set_mac(cfg.mac)?;
        dev.set_mtu(cfg.mtu)?;
        Ok(dev)
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Its MAC address, as last set.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Its MTU in bytes, as last set.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Queues it was created with (taken ones included).
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// The fd of queue `q` while this device still holds it.
    pub fn queue_fd(&self, q: usize) -> Option<RawFd> {
        self.queues.get(q)?.as_ref().map(|f| f.as_raw_fd())
    }

    /// Takes queue `q`'s fd (a host worker owns it from then on).
    pub fn take_queue(&mut self, q: usize) -> Option<OwnedFd> {
        self.queues.get_mut(q)?.take()
    }

    fn ioctl(&self, what: &'static str, req: libc::c_ulong, ifr: &mut libc::ifreq) -> Result<(), TapError> {
        // SAFETY: every request used here reads/writes exactly one ifreq, which `ifr` is.
        let r = unsafe { libc::ioctl(self.ctl.as_raw_fd(), req as _, ifr as *mut libc::ifreq) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EPERM) {
                return Err(TapError::PermissionDenied { name: self.name.clone() });
            }
            return Err(TapError::io(what, &self.name, e));
        }
        Ok(())
    }

    /// Sets the interface's MAC address (a unicast, non-zero one).
    pub fn set_mac(&mut self, mac: [u8; 6]) -> Result<(), TapError> {
        check_mac(MacAddr(mac))?;
        let mut ifr = ifreq(&self.name);
        // SAFETY: sockaddr is plain data; all-zero is valid.
        let mut sa: libc::sockaddr = unsafe { std::mem::zeroed() };
        sa.sa_family = ARPHRD_ETHER;
        for (d, s) in sa.sa_data.iter_mut().zip(mac) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_hwaddr = sa;
        self.ioctl("SIOCSIFHWADDR", libc::SIOCSIFHWADDR as _, &mut ifr)?;
        self.mac = mac;
        Ok(())
    }

    /// Sets the interface's MTU; [`TapError::BadMtu`] when the kernel refuses it.
    pub fn set_mtu(&mut self, mtu: u32) -> Result<(), TapError> {
        let mut ifr = ifreq(&self.name);
        ifr.ifr_ifru.ifru_mtu = mtu as libc::c_int;
        self.ioctl("SIOCSIFMTU", libc::SIOCSIFMTU as _, &mut ifr).map_err(|e| match e {
            TapError::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
                TapError::BadMtu { mtu, max: 65535 }
            }
            e => e,
        })?;
        self.mtu = mtu;
        Ok(())
    }

    /// Brings the link up or down (follows the daemon: up when it runs, down when it stops).
    pub fn set_up(&self, up: bool) -> Result<(), TapError> {
        let mut ifr = ifreq(&self.name);
        self.ioctl("SIOCGIFFLAGS", libc::SIOCGIFFLAGS as _, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        let mut flags = unsafe { ifr.ifr_ifru.ifru_flags };
        if up {
            flags |= IFF_UP;
        } else {
            flags &= !IFF_UP;
        }
        ifr.ifr_ifru.ifru_flags = flags;
        self.ioctl("SIOCSIFFLAGS", libc::SIOCSIFFLAGS as _, &mut ifr)
    }

    /// True when the link is administratively up.
    pub fn is_up(&self) -> Result<bool, TapError> {
        let mut ifr = ifreq(&self.name);
        self.ioctl("SIOCGIFFLAGS", libc::SIOCGIFFLAGS as _, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        Ok(unsafe { ifr.ifr_ifru.ifru_flags } & IFF_UP != 0)
    }
}
