//! An AF_PACKET socket in a lab host's namespace: sends hand-made frames and captures what
//! arrives, VLAN tags put back where the kernel took them out.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use wasmswitch::lab::LabHost;

const TPID_C: u16 = 0x8100;

/// An AF_PACKET socket bound to `eth0` of one lab host, with PACKET_AUXDATA on.
pub struct HostSocket(OwnedFd);

/// `struct tpacket_auxdata` of <linux/if_packet.h>.
#[allow(dead_code)]
struct AuxData {
    status: u32,
    len: u32,
    snaplen: u32,
    mac: u16,
    net: u16,
    vlan_tci: u16,
    vlan_tpid: u16,
}
const PACKET_AUXDATA: libc::c_int = 8;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
const PACKET_OUTGOING: u8 = 4;

pub fn check(rc: libc::c_int, what: &str) -> libc::c_int {
    assert!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
    rc
}

impl HostSocket {
    /// Opens the socket on the host's `eth0`.
    pub fn open(host: &LabHost) -> HostSocket {
        HostSocket::open_on(Some(host.pid()), "eth0")
    }

    /// Opens the socket on `ifname` from a thread that joined the namespace of process `pid`
    /// (ours when `None`); the socket keeps that namespace.
    pub fn open_on(pid: Option<u32>, ifname: &str) -> HostSocket {
        let ifname = std::ffi::CString::new(ifname).unwrap();
        let fd = std::thread::spawn(move || {
            if let Some(pid) = pid {
                let ns = format!("/proc/{pid}/ns/net");
                let ns = std::fs::File::open(&ns).unwrap_or_else(|e| panic!("{ns}: {e}"));
                // SAFETY: setns on a descriptor we own; it changes only this thread's namespace.
                check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, "setns");
            }
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: socket takes no pointers.
            let fd =
                unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as libc::c_int) };
            check(fd, "socket(AF_PACKET)");
            // SAFETY: fd is a fresh descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: ifname is a live NUL-terminated string.
            let ifindex = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
            assert!(ifindex != 0, "no {ifname:?} in the namespace");
            let sll = libc::sockaddr_ll {
                sll_family: libc::AF_PACKET as u16,
                sll_protocol: proto,
                sll_ifindex: ifindex as i32,
                sll_hatype: 0,
                sll_pkttype: 0,
                sll_halen: 0,
                sll_addr: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: sll is a live sockaddr_ll of the length given.
            let rc = unsafe { libc::bind(fd.as_raw_fd(), &sll as *const _ as *const libc::sockaddr, len) };
            check(rc, "bind");
            for (level, name, value, what) in [
                (libc::SOL_PACKET, PACKET_AUXDATA, 1, "PACKET_AUXDATA"),
                (libc::SOL_SOCKET, libc::SO_RCVBUF, 1 << 20, "SO_RCVBUF"),
            ] {
                let value: libc::c_int = value;
                let len = std::mem::size_of::<libc::c_int>() as u32;
                // SAFETY: value is a live c_int of the length given.
                let rc = unsafe {
                    libc::setsockopt(fd.as_raw_fd(), level, name, &value as *const _ as *const libc::c_void, len)
                };
                check(rc, what);
            }
            fd
        })
        .join()
        .expect("opening a socket in the host's namespace");
        HostSocket(fd)
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: send on a socket we own, from a live buffer of the given length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
        assert_eq!(n, frame.len() as isize, "send: {}", std::io::Error::last_os_error());
    }

    /// Every frame received since the last call (not the ones this socket's host sent), with
    /// the VLAN tag the kernel moved into metadata put back in place.
    pub fn drain(&self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        loop {
            let mut buf = vec![0u8; 4096];
            let mut ctrl = [0u64; 16];
            let mut sll = libc::sockaddr_ll {
                sll_family: 0,
                sll_protocol: 0,
                sll_ifindex: 0,
                sll_hatype: 0,
                sll_pkttype: 0,
                sll_halen: 0,
                sll_addr: [0; 8],
            };
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
            // SAFETY: msghdr is plain integers and pointers, for which all zeroes is valid.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = &mut sll as *mut _ as *mut libc::c_void;
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = std::mem::size_of_val(&ctrl);
            // SAFETY: every pointer in msg points at a live local of the stated size.
            let n = unsafe { libc::recvmsg(self.0.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "recvmsg: {e}");
                return frames;
            }
            assert!(msg.msg_flags & libc::MSG_TRUNC == 0, "a captured frame was truncated");
            if sll.sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            buf.truncate(n as usize);
            let ctrl: Vec<u8> = ctrl.iter().flat_map(|w| w.to_ne_bytes()).take(msg.msg_controllen).collect();
            let aux = auxdata(&ctrl).expect("PACKET_AUXDATA is on");
            if aux.vlan_tci != 0 || aux.status & TP_STATUS_VLAN_VALID != 0 {
                let tpid = if aux.status & TP_STATUS_VLAN_TPID_VALID != 0 { aux.vlan_tpid } else { TPID_C };
                let mut tag = tpid.to_be_bytes().to_vec();
                tag.extend_from_slice(&aux.vlan_tci.to_be_bytes());
                buf.splice(12..12, tag);
            }
            frames.push(buf);
        }
    }
}

/// The PACKET_AUXDATA message among the control messages `ctrl` (a `struct cmsghdr` is a
/// `size_t` length, an `int` level and an `int` type; data and the next header are aligned to
/// `size_t`).
fn auxdata(ctrl: &[u8]) -> Option<AuxData> {
    const W: usize = std::mem::size_of::<usize>();
    let hdr = W + 8;
    let mut at = 0;
    while at + hdr <= ctrl.len() {
        let len = usize::from_ne_bytes(ctrl[at..at + W].try_into().unwrap());
        let level = i32::from_ne_bytes(ctrl[at + W..at + W + 4].try_into().unwrap());
        let kind = i32::from_ne_bytes(ctrl[at + W + 4..at + hdr].try_into().unwrap());
        if len < hdr || at + len > ctrl.len() {
            return None;
        }
        if level == libc::SOL_PACKET && kind == PACKET_AUXDATA && len >= hdr + 20 {
            let d = &ctrl[at + hdr..];
            let u32_at = |i: usize| u32::from_ne_bytes(d[i..i + 4].try_into().unwrap());
            let u16_at = |i: usize| u16::from_ne_bytes(d[i..i + 2].try_into().unwrap());
            return Some(AuxData {
                status: u32_at(0),
                len: u32_at(4),
                snaplen: u32_at(8),
                mac: u16_at(12),
                net: u16_at(14),
                vlan_tci: u16_at(16),
                vlan_tpid: u16_at(18),
            });
        }
        at += len.div_ceil(W) * W;
    }
    None
}
