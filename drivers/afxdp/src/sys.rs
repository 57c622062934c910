//! Thin syscall wrappers: mmap regions, the `bpf(2)` commands the driver needs, ethtool ioctls,
//! rtnetlink queries (which XDP program, if any, is attached to an interface; a veth peer's
//! drops) and one generic-netlink query (the XDP features a driver declares).
//!
//! Nothing here knows about AF_XDP policy; errors come back as `io::Error` and are turned into
//! operator-facing messages by the caller, which knows the interface name.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Converts a `-1` return into the thread's `errno`.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A shared mapping of part of a socket's memory (an AF_XDP ring), unmapped on drop.
#[derive(Debug)]
pub struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with the kernel; the ring views built on it
// serialise access (one owner, `&mut` methods), the handle itself may move between threads.
unsafe impl Send for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` at page offset `off` (the `XDP_PGOFF_*` ring selectors).
    pub fn ring(fd: RawFd, len: usize, off: libc::off_t) -> io::Result<Self> {
        // SAFETY: no address hint, the kernel validates fd/len/offset; result checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr: ptr.cast(), len })
    }

    /// The address `off` bytes into the mapping.
    ///
    /// # Panics
    /// When `off` is outside the mapping.
    pub fn at(&self, off: u64) -> *mut u8 {
        // An offset past usize (a 32-bit target) is outside the mapping too, never wrapped into it.
        let at = usize::try_from(off).unwrap_or(usize::MAX);
        assert!(at < self.len, "ring offset {off} outside a {}-byte mapping", self.len);
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.add(at) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `ring`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// `setsockopt` with a plain-old-data value.
#[expect(clippy::cast_possible_truncation, reason = "a sockopt value is a small struct")]
pub fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points to `size_of::<T>()` readable bytes for the duration of the call.
    cvt(unsafe { libc::setsockopt(fd, level, name, (val as *const T).cast(), size_of::<T>() as libc::socklen_t) })?;
    Ok(())
}

/// `getsockopt` into a plain-old-data value; returns the length the kernel wrote.
///
/// # Safety
/// `T` must be valid for any bit pattern (a `repr(C)` struct of integers).
pub unsafe fn getsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &mut T) -> io::Result<usize> {
    #[expect(clippy::cast_possible_truncation, reason = "a sockopt value is a small struct")]
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `val` points to `len` writable bytes; the caller guarantees any bytes are valid.
    cvt(unsafe { libc::getsockopt(fd, level, name, (val as *mut T).cast(), &mut len) })?;
    Ok(len as usize)
}

// ---- bpf(2) -------------------------------------------------------------------------------

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

/// `BPF_MAP_TYPE_XSKMAP`: a map from queue id to AF_XDP socket.
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_XDP`: a program run on every received frame.
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`: the attach type of an XDP program on an interface.
pub const BPF_XDP: u32 = 37;

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[expect(clippy::cast_possible_truncation, reason = "a bpf_attr prefix is a small struct")]
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a `repr(C)` prefix of `union bpf_attr` for `cmd`, valid for the call;
    // the kernel zero-extends a shorter attr and reads/writes only within `size`.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, (attr as *mut T).cast::<libc::c_void>(), size_of::<T>() as libc::c_uint)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "the bpf syscall returns an int (here a file descriptor) in a long"
)]
fn owned_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the bpf syscall returned a fresh file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (d, s) in out.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    out
}

/// `BPF_MAP_CREATE` of an XSKMAP with `entries` slots (key: queue id, value: socket fd).
pub fn xskmap_create(entries: u32) -> io::Result<OwnedFd> {
    let mut a = MapCreateAttr {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        map_name: name16("wsx_xsks"),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut a).map(owned_fd)
}

/// Sets `map[key] = value` (an XSKMAP slot to a socket fd).
pub fn map_update_u32(map: RawFd, key: u32, value: u32) -> io::Result<()> {
    let mut a = MapElemAttr {
        map_fd: map as u32,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

/// Deletes `map[key]`.
pub fn map_delete_u32(map: RawFd, key: u32) -> io::Result<()> {
    let mut a = MapElemAttr { map_fd: map as u32, key: &key as *const u32 as u64, ..Default::default() };
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(drop)
}

/// `BPF_PROG_LOAD` of an XDP program. On failure the verifier log (if any) comes back with
/// the error so it can be shown to the operator.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the log buffer is 64 KiB; the programs here are a few dozen instructions"
)]
pub fn prog_load_xdp(insns: &[u64], name: &str, dev_bound: Option<u32>) -> Result<OwnedFd, (io::Error, String)> {
    /// `BPF_F_XDP_DEV_BOUND_ONLY`: a program that calls a driver's XDP metadata kfuncs.
    const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
    let license = CString::new("GPL").expect("no NUL");
    let attr = |log: Option<&mut [u8]>| {
        let (level, size, buf) = match log {
            Some(l) => (1, l.len() as u32, l.as_mut_ptr() as u64),
            None => (0, 0, 0),
        };
        ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: level,
            log_size: size,
            log_buf: buf,
            prog_name: name16(name),
            expected_attach_type: BPF_XDP,
            prog_flags: if dev_bound.is_some() { BPF_F_XDP_DEV_BOUND_ONLY } else { 0 },
            prog_ifindex: dev_bound.unwrap_or(0),
            ..Default::default()
        }
    };
    // First without a log (the verifier is faster and the log buffer can't be too small), then
    // again with one when that fails, so the error carries the verifier's explanation.
    let mut a = attr(None);
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned_fd(fd)),
        Err(e) => {
            let mut log = vec![0u8; 64 * 1024];
            let mut a = attr(Some(&mut log));
            match bpf(BPF_PROG_LOAD, &mut a) {
                Ok(fd) => Ok(owned_fd(fd)),
                Err(e2) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
                    Err((if e2.raw_os_error().is_some() { e2 } else { e }, text))
                }
            }
        }
    }
}

/// `BPF_LINK_CREATE` attaching an XDP program to `ifindex` with `XDP_FLAGS_*` mode `flags`.
/// The link (and so the attachment) lives exactly as long as the returned fd.
pub fn xdp_link_create(prog: RawFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a = LinkCreateAttr { prog_fd: prog as u32, target_ifindex: ifindex, attach_type: BPF_XDP, flags };
    bpf(BPF_LINK_CREATE, &mut a).map(owned_fd)
}

// ---- ethtool ------------------------------------------------------------------------------

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
/// `ETH_FLAG_LRO` in the `ETHTOOL_{G,S}FLAGS` value.
const ETH_FLAG_LRO: u32 = 1 << 15;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthtoolChannels {
    /// The command, `ETHTOOL_GCHANNELS`.
    pub cmd: u32,
    /// The most RX-only channels the device can have.
    pub max_rx: u32,
    /// The most TX-only channels.
    pub max_tx: u32,
    /// The most other channels (link interrupts and the like).
    pub max_other: u32,
    /// The most combined (RX and TX) channels.
    pub max_combined: u32,
    /// RX-only channels now.
    pub rx_count: u32,
    /// TX-only channels now.
    pub tx_count: u32,
    /// Other channels now.
    pub other_count: u32,
    /// Combined channels now.
    pub combined_count: u32,
}

#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool<T>(ifname: &str, cmd: &mut T) -> io::Result<()> {
    // SAFETY: plain socket creation; the result is checked and owned below.
    let sock = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `sock` is a fresh descriptor owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut ifr = IfreqData { name: [0; libc::IFNAMSIZ], data: (cmd as *mut T).cast(), _pad: [0; 16] };
    for (d, s) in ifr.name.iter_mut().zip(ifname.bytes().take(libc::IFNAMSIZ - 1)) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCETHTOOL reads `ifr` and reads/writes the command struct `data` points to,
    // which is a `repr(C)` ethtool struct starting with the matching `cmd`; both outlive the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr as *mut IfreqData) })?;
    Ok(())
}

/// The kernel driver name (`ethtool -i`), e.g. `veth`, `mlx5_core`.
pub fn driver_name(ifname: &str) -> io::Result<String> {
    // SAFETY: all-zero is a valid `EthtoolDrvinfo` (integers and byte arrays).
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    ethtool(ifname, &mut info)?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Channel counts (`ethtool -l`).
pub fn channels(ifname: &str) -> io::Result<EthtoolChannels> {
    let mut ch = EthtoolChannels { cmd: ETHTOOL_GCHANNELS, ..Default::default() };
    ethtool(ifname, &mut ch)?;
    Ok(ch)
}

/// Receive aggregation of an interface: generic receive offload (GRO) and large receive
/// offload (LRO), as `ethtool -k` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aggregation {
    /// Generic receive offload is on.
    pub gro: bool,
    /// Large receive offload is on.
    pub lro: bool,
}

/// Reads GRO and LRO (`ethtool -k`).
pub fn aggregation(ifname: &str) -> io::Result<Aggregation> {
    let mut gro = EthtoolValue { cmd: ETHTOOL_GGRO, data: 0 };
    ethtool(ifname, &mut gro)?;
    let mut flags = EthtoolValue { cmd: ETHTOOL_GFLAGS, data: 0 };
    ethtool(ifname, &mut flags)?;
    Ok(Aggregation { gro: gro.data != 0, lro: flags.data & ETH_FLAG_LRO != 0 })
}

/// Sets GRO and LRO (`ethtool -K IF gro on|off lro on|off`); only what differs is written.
pub fn set_aggregation(ifname: &str, want: Aggregation) -> io::Result<()> {
    let have = aggregation(ifname)?;
    if have.gro != want.gro {
        ethtool(ifname, &mut EthtoolValue { cmd: ETHTOOL_SGRO, data: want.gro as u32 })?;
    }
    if have.lro != want.lro {
        let mut flags = EthtoolValue { cmd: ETHTOOL_GFLAGS, data: 0 };
        ethtool(ifname, &mut flags)?;
        let data = if want.lro { flags.data | ETH_FLAG_LRO } else { flags.data & !ETH_FLAG_LRO };
        ethtool(ifname, &mut EthtoolValue { cmd: ETHTOOL_SFLAGS, data })?;
    }
    Ok(())
}

// ---- rtnetlink: an interface's XDP program, its veth peer's counters -----------------------

const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_STATS64: u16 = 23;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_TARGET_NETNSID: u16 = 46;
const NLA_F_NESTED: u16 = 1 << 15;
/// `tx_dropped` in `struct rtnl_link_stats64`: the eighth `__u64`.
const STATS64_TX_DROPPED: usize = 7 * 8;

/// `RTM_GETLINK` for one interface, optionally in another namespace (`IFLA_TARGET_NETNSID`).
#[repr(C)]
struct GetLinkReq {
    nlh: libc::nlmsghdr,
    ifi_family: u8,
    _pad: u8,
    ifi_type: u16,
    ifi_index: i32,
    ifi_flags: u32,
    ifi_change: u32,
    /// `IFLA_TARGET_NETNSID` (len 8); sent only when a namespace id is given.
    nsid_attr: [u16; 2],
    nsid: i32,
}

/// What is attached at an interface's XDP hook.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpAttached {
    /// `XDP_ATTACHED_*` (0 none, 1 driver, 2 generic/SKB, 3 offload, 4 several).
    pub mode: u8,
    /// The program id (0 when none, or when several are attached).
    pub prog_id: u32,
}

/// Asks rtnetlink (`RTM_GETLINK`) what XDP program `ifindex` has, in the caller's network namespace.
pub fn xdp_attached(ifindex: u32) -> io::Result<XdpAttached> {
    parse_xdp_attached(&getlink(ifindex, None)?)
}

/// The `tx_dropped` counter of `ifindex`'s veth peer: frames the peer dropped on their way
/// into `ifindex` (its ring to this end's XDP was full, or a frame was over this end's MTU),
/// which this end never sees. The peer may be in another namespace: it is read there through
/// the id this namespace has for it (`IFLA_LINK_NETNSID`), which takes `CAP_NET_ADMIN`.
/// `None` when `ifindex` is not a veth.
pub fn veth_peer_tx_dropped(ifindex: u32) -> io::Result<Option<u64>> {
    let own = getlink(ifindex, None)?;
    let (mut veth, mut peer, mut nsid) = (false, 0u32, None);
    for (ty, v) in link_attrs(&own)? {
        match ty {
            IFLA_LINKINFO => veth = nested(v).any(|(t, k)| t == IFLA_INFO_KIND && k.starts_with(b"veth\0")),
            IFLA_LINK if v.len() >= 4 => peer = rd32(v, 0),
            IFLA_LINK_NETNSID if v.len() >= 4 => nsid = Some(rd32(v, 0) as i32),
            _ => {}
        }
    }
    if !veth || peer == 0 {
        return Ok(None);
    }
    let theirs = getlink(peer, nsid)?;
    let stats = link_attrs(&theirs)?.find(|&(t, v)| t == IFLA_STATS64 && v.len() >= STATS64_TX_DROPPED + 8);
    let (_, v) = stats.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no IFLA_STATS64 in the reply"))?;
    Ok(Some(u64::from_ne_bytes(v[STATS64_TX_DROPPED..STATS64_TX_DROPPED + 8].try_into().expect("8 bytes"))))
}

/// One `RTM_GETLINK` round trip: the reply's bytes (one message).
#[expect(clippy::cast_possible_truncation, reason = "the request's size, NLM_F_REQUEST (1) and AF_UNSPEC (0)")]
fn getlink(ifindex: u32, target_nsid: Option<i32>) -> io::Result<Vec<u8>> {
    let len = if target_nsid.is_some() { size_of::<GetLinkReq>() } else { size_of::<GetLinkReq>() - 8 };
    let req = GetLinkReq {
        nlh: libc::nlmsghdr {
            nlmsg_len: len as u32,
            nlmsg_type: libc::RTM_GETLINK,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        ifi_family: libc::AF_UNSPEC as u8,
        _pad: 0,
        ifi_type: 0,
        ifi_index: ifindex as i32,
        ifi_flags: 0,
        ifi_change: 0,
        nsid_attr: [8, IFLA_TARGET_NETNSID],
        nsid: target_nsid.unwrap_or(0),
    };
    // SAFETY: `GetLinkReq` is plain old data without padding; the first `len` bytes (at most
    // its size) are read while `req` lives.
    let bytes = unsafe { std::slice::from_raw_parts((&req as *const GetLinkReq).cast::<u8>(), len) };
    roundtrip(libc::NETLINK_ROUTE, bytes.to_vec())
}

/// Sends one netlink request of `protocol` (its length field set here) and returns the first
/// reply message's bytes; an `NLMSG_ERROR` reply is left for the caller's parser to report.
fn roundtrip(protocol: libc::c_int, mut req: Vec<u8>) -> io::Result<Vec<u8>> {
    #[expect(clippy::cast_possible_truncation, reason = "the requests built here are a few dozen bytes")]
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: plain socket creation; checked and owned below.
    let fd = cvt(unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) })?;
    // SAFETY: fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sends `req`'s bytes, which live across the call.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: receives into `buf`, which has `buf.len()` writable bytes.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The length of the reply message in `b`, or the error an `NLMSG_ERROR` reply carries.
fn reply_len(b: &[u8]) -> io::Result<usize> {
    if b.len() < 16 {
        return Err(malformed("netlink"));
    }
    if i32::from(rd16(b, 4)) == libc::NLMSG_ERROR {
        let err = if b.len() >= 20 { rd32(b, 16) as i32 } else { -libc::EIO };
        return Err(io::Error::from_raw_os_error(-err));
    }
    Ok((rd32(b, 0) as usize).min(b.len()))
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn rd32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The top-level attributes of one `RTM_NEWLINK` reply, or the error an `NLMSG_ERROR` reply
/// carries.
fn link_attrs(b: &[u8]) -> io::Result<impl Iterator<Item = (u16, &[u8])>> {
    let len = reply_len(b)?;
    if rd16(b, 4) != libc::RTM_NEWLINK || len < 32 {
        return Err(malformed("rtnetlink"));
    }
    Ok(nested(&b[32..len])) // past nlmsghdr + ifinfomsg
}

/// The attributes in `b`, each as (type without the nested flag, payload); stops at the first
/// one whose length does not fit.
fn nested(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 4 > b.len() {
            return None;
        }
        let alen = rd16(b, at) as usize;
        if alen < 4 || at + alen > b.len() {
            return None;
        }
        let item = (rd16(b, at + 2) & !NLA_F_NESTED, &b[at + 4..at + alen]);
        at += (alen + 3) & !3;
        Some(item)
    })
}

/// `IFLA_XDP` of one reply.
fn parse_xdp_attached(b: &[u8]) -> io::Result<XdpAttached> {
    let mut out = XdpAttached::default();
    for (_, xdp) in link_attrs(b)?.filter(|&(t, _)| t == IFLA_XDP) {
        for (ty, v) in nested(xdp) {
            match ty {
                IFLA_XDP_ATTACHED if !v.is_empty() => out.mode = v[0],
                IFLA_XDP_PROG_ID if v.len() >= 4 => out.prog_id = rd32(v, 0),
                _ => {}
            }
        }
    }
    Ok(out)
}

// ---- generic netlink: what XDP an interface's driver offers -------------------------------

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
/// `nlmsghdr` + `genlmsghdr`.
const GENL_HDR: usize = 20;

/// The XDP features a driver declares (`enum netdev_xdp_act`, Linux 6.3+), as the netdev
/// generic-netlink family reports them (`ynl --family netdev --do dev-get`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpFeatures(pub u64);

impl XdpFeatures {
    const NAMES: [&'static str; 7] =
        ["basic", "redirect", "ndo-xmit", "xsk-zerocopy", "hw-offload", "rx-sg", "ndo-xmit-sg"];
    const XSK_ZEROCOPY: u64 = 1 << 3;

    /// Whether the driver declares AF_XDP zero-copy (`xsk-zerocopy`).
    pub fn zero_copy(self) -> bool {
        self.0 & Self::XSK_ZEROCOPY != 0
    }

    /// The features by their uapi names, e.g. `basic, redirect, rx-sg`; `none` for none.
    pub fn names(self) -> String {
        let on: Vec<&str> =
            Self::NAMES.iter().enumerate().filter(|(i, _)| self.0 & (1 << i) != 0).map(|(_, n)| *n).collect();
        if on.is_empty() {
            "none".into()
        } else {
            on.join(", ")
        }
    }
}

/// What XDP `ifindex`'s driver declares; `None` on a kernel without the netdev family (before
/// 6.3), where nothing is known.
pub fn xdp_features(ifindex: u32) -> io::Result<Option<XdpFeatures>> {
    let mut name = genl_request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY);
    put_attr(&mut name, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
    let reply = roundtrip(libc::NETLINK_GENERIC, name)?;
    let family = match genl_attrs(&reply, GENL_ID_CTRL) {
        Ok(mut attrs) => attrs.find(|&(t, v)| t == CTRL_ATTR_FAMILY_ID && v.len() >= 2).map(|(_, v)| rd16(v, 0)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let family = family.ok_or_else(|| malformed("generic netlink"))?;
    let mut get = genl_request(family, NETDEV_CMD_DEV_GET);
    put_attr(&mut get, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let reply = roundtrip(libc::NETLINK_GENERIC, get)?;
    let features = genl_attrs(&reply, family)?.find(|&(t, v)| t == NETDEV_A_DEV_XDP_FEATURES && v.len() >= 8);
    let (_, v) = features.ok_or_else(|| malformed("netdev dev-get"))?;
    Ok(Some(XdpFeatures(u64::from_ne_bytes(v[..8].try_into().expect("8 bytes")))))
}

/// A generic-netlink request header (its length is set by [`roundtrip`]).
fn genl_request(family: u16, cmd: u8) -> Vec<u8> {
    let mut m = vec![0u8; GENL_HDR];
    m[4..6].copy_from_slice(&family.to_ne_bytes());
    #[expect(clippy::cast_possible_truncation, reason = "NLM_F_REQUEST is 1")]
    let flags = libc::NLM_F_REQUEST as u16;
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence
    m[16] = cmd;
    m[17] = 1; // version
    m
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "the attributes put here are a few bytes (a family name, an ifindex)"
)]
fn put_attr(m: &mut Vec<u8>, ty: u16, v: &[u8]) {
    m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(v);
    m.resize((m.len() + 3) & !3, 0);
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed {what} reply"))
}

/// The attributes of one generic-netlink reply of `family`, or the error an `NLMSG_ERROR`
/// reply carries.
fn genl_attrs(b: &[u8], family: u16) -> io::Result<impl Iterator<Item = (u16, &[u8])>> {
    let len = reply_len(b)?;
    if rd16(b, 4) != family || len < GENL_HDR {
        return Err(malformed("generic netlink"));
    }
    Ok(nested(&b[GENL_HDR..len]))
}

pub(crate) use wasmswitch_sys::ifindex;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_the_uapi() {
        assert_eq!(size_of::<MapCreateAttr>(), 44);
        assert_eq!(size_of::<MapElemAttr>(), 32);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(size_of::<LinkCreateAttr>(), 16);
        assert_eq!(size_of::<EthtoolDrvinfo>(), 196);
        assert_eq!(size_of::<EthtoolChannels>(), 36);
    }

    #[test]
    fn xdp_features_are_named_as_the_uapi_names_them() {
        assert_eq!(XdpFeatures(0).names(), "none");
        assert_eq!(XdpFeatures(1 | 2 | 32).names(), "basic, redirect, rx-sg");
        assert!(!XdpFeatures(1 | 2 | 32).zero_copy() && XdpFeatures(8).zero_copy());
        assert_eq!(XdpFeatures(127).names().split(", ").count(), 7);
    }

    #[test]
    fn genl_reply_parsing_finds_attributes_and_errors_and_survives_garbage() {
        let family = 0x22;
        let mut m = genl_request(family, NETDEV_CMD_DEV_GET);
        put_attr(&mut m, NETDEV_A_DEV_IFINDEX, &7u32.to_ne_bytes());
        put_attr(&mut m, NETDEV_A_DEV_XDP_FEATURES, &35u64.to_ne_bytes());
        let len = u32::try_from(m.len()).unwrap();
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        let found: Vec<(u16, usize)> = genl_attrs(&m, family).unwrap().map(|(t, v)| (t, v.len())).collect();
        assert_eq!(found, [(NETDEV_A_DEV_IFINDEX, 4), (NETDEV_A_DEV_XDP_FEATURES, 8)]);
        assert!(genl_attrs(&m, family + 1).is_err(), "another family's reply");
        for cut in 0..m.len() {
            let _ = genl_attrs(&m[..cut], family).map(|a| a.count());
        }
        let mut err = vec![0u8; 20];
        err[4..6].copy_from_slice(&u16::try_from(libc::NLMSG_ERROR).unwrap().to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(genl_attrs(&err, family).err().and_then(|e| e.raw_os_error()), Some(libc::ENOENT));
    }

    #[test]
    fn getlink_reply_parsing_finds_xdp_and_survives_garbage() {
        // nlmsghdr(16) + ifinfomsg(16) + IFLA_XDP{ ATTACHED=1, PROG_ID=42 }
        let mut m = vec![0u8; 32];
        let xdp_attrs = [5u16.to_ne_bytes(), IFLA_XDP_ATTACHED.to_ne_bytes()].concat();
        let mut nested = xdp_attrs.clone();
        nested.extend_from_slice(&[1, 0, 0, 0]); // value + padding
        nested.extend_from_slice(&8u16.to_ne_bytes());
        nested.extend_from_slice(&IFLA_XDP_PROG_ID.to_ne_bytes());
        nested.extend_from_slice(&42u32.to_ne_bytes());
        m.extend_from_slice(&u16::try_from(4 + nested.len()).unwrap().to_ne_bytes());
        m.extend_from_slice(&(IFLA_XDP | NLA_F_NESTED).to_ne_bytes());
        m.extend_from_slice(&nested);
        let total = u32::try_from(m.len()).unwrap();
        m[0..4].copy_from_slice(&total.to_ne_bytes());
        m[4..6].copy_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        assert_eq!(parse_xdp_attached(&m).unwrap(), XdpAttached { mode: 1, prog_id: 42 });
        for cut in 0..m.len() {
            let _ = parse_xdp_attached(&m[..cut]);
        }
        let mut garbage = m.clone();
        garbage[32] = 0xff; // absurd attribute length
        assert_eq!(parse_xdp_attached(&garbage).unwrap(), XdpAttached::default());
    }
}
