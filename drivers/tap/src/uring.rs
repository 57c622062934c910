//! One io_uring per host worker, set up with the cheapest options the kernel accepts, and the
//! list delivery: N write SQEs straight from UMEM frames, one `io_uring_enter`.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use wasmswitch_core::{Desc, Umem};

use crate::error::TapError;

/// What to ask of the kernel. Everything refused falls back (logged) to the plain variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Submission queue entries (the completion queue is twice that).
    pub entries: u32,
    /// `register_files` the TAP fd and use `Fixed(0)` in SQEs (no fd lookup per request).
    pub registered_file: bool,
    /// Register the whole UMEM as one fixed buffer and use `WriteFixed`/`ReadFixed` (no page
    /// pinning per request). Needs RLIMIT_MEMLOCK ≥ the UMEM size or CAP_IPC_LOCK.
    pub fixed_buffers: bool,
    /// `IORING_SETUP_SINGLE_ISSUER` (only the host worker thread touches its ring).
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (needs single issuer): completion work runs only when the
    /// worker asks for events, not as an interrupting task_work.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN`, used when defer taskrun is off or refused.
    pub coop_taskrun: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        Self {
            entries: 256,
            registered_file: true,
            fixed_buffers: true,
            single_issuer: true,
            defer_taskrun: true,
            coop_taskrun: true,
        }
    }
}

impl UringOptions {
    /// Nothing but a plain ring (the baseline of the step-by-step measurements).
    pub fn plain() -> Self {
        Self {
            entries: 256,
            registered_file: false,
            fixed_buffers: false,
            single_issuer: false,
            defer_taskrun: false,
            coop_taskrun: false,
        }
    }
}

/// What the kernel actually gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringFeatures {
    /// The TAP fd is registered: SQEs name it as `Fixed(0)`.
    pub registered_file: bool,
    /// The UMEM is registered as one fixed buffer: `ReadFixed`/`WriteFixed`.
    pub fixed_buffers: bool,
    /// `IORING_SETUP_SINGLE_ISSUER` was accepted.
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` was accepted.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN` was accepted.
    pub coop_taskrun: bool,
}

/// Result of one list delivery.
#[derive(Clone, Copy, Debug, Default)]
pub struct Delivered {
    /// Writes that succeeded.
    pub packets: u64,
    /// Bytes they wrote.
    pub bytes: u64,
    /// Frames not written: outside the UMEM, or the write failed.
    pub errors: u64,
    /// io_uring_enter calls made.
    pub enters: u64,
}

const IORING_ENTER_GETEVENTS: u32 = 1;

/// A host worker's ring over one TAP queue fd and the UMEM.
pub struct HostRing {
    ring: IoUring,
    fd: RawFd,
    umem: Arc<Umem>,
    features: UringFeatures,
}

impl HostRing {
    /// Builds the ring on the calling thread (with `single_issuer`, only this thread may use it).
    pub fn new(fd: RawFd, umem: Arc<Umem>, opts: &UringOptions) -> Result<Self, TapError> {
        let entries = opts.entries.max(8).next_power_of_two();
        // Try the requested flags, then step down: the kernel says EINVAL for what it lacks.
        let mut tries: Vec<(bool, bool, bool)> = Vec::new(); // (single, defer, coop)
        if opts.single_issuer && opts.defer_taskrun {
            tries.push((true, true, false));
        }
        if opts.single_issuer {
            tries.push((true, false, opts.coop_taskrun));
        }
        tries.push((false, false, opts.coop_taskrun));
        tries.push((false, false, false));
        let mut last = None;
        let mut built = None;
        for (single, defer, coop) in tries {
            let mut b = IoUring::builder();
            if single {
                b.setup_single_issuer();
            }
            if defer {
                b.setup_defer_taskrun();
            }
            if coop {
                b.setup_coop_taskrun();
            }
            match b.build(entries) {
                Ok(r) => {
                    built = Some((
                        r,
                        UringFeatures {
                            single_issuer: single,
                            defer_taskrun: defer,
                            coop_taskrun: coop,
                            ..Default::default()
                        },
                    ));
                    break;
                }
                Err(e) => {
                    log::warn!("io_uring setup (single_issuer={single}, defer_taskrun={defer}, coop_taskrun={coop}) refused: {e}; trying less");
                    last = Some(e);
                }
            }
        }
        let Some((ring, mut features)) = built else {
            return Err(TapError::Uring {
                what: "setup",
                source: last.unwrap_or_else(|| io::Error::other("no attempt")),
            });
        };
        if opts.registered_file {
            match ring.submitter().register_files(&[fd]) {
                Ok(()) => features.registered_file = true,
                Err(e) => log::warn!("io_uring register_files refused ({e}); using the plain fd"),
            }
        }
        if opts.fixed_buffers {
            let iov = libc::iovec { iov_base: umem.as_ptr().cast(), iov_len: umem.len() };
            // SAFETY: the iovec covers the UMEM mapping, which `self.umem` (an Arc) keeps alive
            // until the ring is dropped (the ring field drops first, unregistering it).
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => features.fixed_buffers = true,
                Err(e) => log::warn!(
                    "io_uring register_buffers of the {} MiB UMEM refused ({e}{}); falling back to plain writes/reads",
                    umem.len() >> 20,
                    if e.raw_os_error() == Some(libc::ENOMEM) {
                        ": RLIMIT_MEMLOCK too low? raise it or grant CAP_IPC_LOCK"
                    } else {
                        ""
                    }
                ),
            }
        }
        Ok(Self { ring, fd, umem, features })
    }

    /// What the kernel gave this ring.
    pub fn features(&self) -> UringFeatures {
        self.features
    }

    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the caller checked `addr` is inside the UMEM, a usize-long region"
    )]
    fn ptr(&self, addr: u64) -> *mut u8 {
        // The caller checked `addr + len` is inside the UMEM.
        self.umem.as_ptr().wrapping_add(addr as usize)
    }

    /// A read SQE into frame bytes `[addr, addr + len)` of the UMEM.
    #[inline]
    pub(crate) fn read_sqe(&self, addr: u64, len: u32, user_data: u64) -> squeue::Entry {
        let buf = self.ptr(addr);
        let e = match (self.features.registered_file, self.features.fixed_buffers) {
            (true, true) => opcode::ReadFixed::new(types::Fixed(0), buf, len, 0).build(),
            (false, true) => opcode::ReadFixed::new(types::Fd(self.fd), buf, len, 0).build(),
            (true, false) => opcode::Read::new(types::Fixed(0), buf, len).build(),
            (false, false) => opcode::Read::new(types::Fd(self.fd), buf, len).build(),
        };
        e.user_data(user_data)
    }

    /// Queues one SQE.
    ///
    /// # Safety
    /// The buffer the entry names stays valid and owned by the ring until its CQE is reaped.
    pub(crate) unsafe fn push(&mut self, e: &squeue::Entry) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.ring.submission().push(e).is_ok() }
    }

    /// Submits what is queued and waits for at least `want` completions (retrying on EINTR).
    pub(crate) fn submit_and_wait(&self, want: usize) -> io::Result<usize> {
        loop {
            match self.ring.submit_and_wait(want) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) || e.raw_os_error() == Some(libc::EAGAIN) => {
                    return Ok(0)
                }
                r => return r,
            }
        }
    }

    /// Submits what is queued and waits up to `timeout` for one completion.
    pub(crate) fn wait_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One `io_uring_enter` that submits whatever is queued and lets ready completions post
    /// their CQEs (GETEVENTS, no wait): the poll of an idle worker.
    pub(crate) fn kick(&mut self) {
        #[expect(clippy::cast_possible_truncation, reason = "at most the submission queue's entries, a u32")]
        let n = self.ring.submission().len() as u32;
        // SAFETY: a plain io_uring_enter: submit the `n` queued SQEs (each pushed under its own
        // safety contract), wait for nothing, no argument.
        let _ = unsafe { self.ring.submitter().enter::<libc::sigset_t>(n, 0, IORING_ENTER_GETEVENTS, None) };
    }

    /// Pops one CQE (user_data, result).
    #[inline]
    pub(crate) fn next_cqe(&mut self) -> Option<(u64, i32)> {
        let mut cq = self.ring.completion();
        cq.next().map(|c: cqueue::Entry| (c.user_data(), c.result()))
    }

    /// Queues an async-cancel of every in-flight request.
    pub(crate) fn cancel_all(&mut self, user_data: u64) -> bool {
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(user_data);
        // SAFETY: a cancel request names no buffer.
        unsafe { self.push(&e) }
    }

    /// Delivers `descs` (frames of this ring's UMEM) as one list: one write SQE each, one
    /// `io_uring_enter` that submits them all and waits for all of them. Completions that are not
    /// writes (reads in flight) go to `other`. The frames are free again when this returns.
    pub fn deliver(&mut self, descs: &[Desc], mut other: impl FnMut(u64, i32)) -> Delivered {
        let mut out = Delivered::default();
        let mut queued = 0usize;
        let mut i = 0;
        while i < descs.len() {
            // One SQ view per pass: the tail is published once, not per SQE.
            let mut full = false;
            {
                let (ff, fb, fd, base) = (
                    self.features.registered_file,
                    self.features.fixed_buffers,
                    self.fd,
                    self.umem.as_ptr() as *const u8,
                );
                let umem = &self.umem;
                let mut sq = self.ring.submission();
                while i < descs.len() {
                    let d = descs[i];
                    if !umem.in_bounds(d.addr, d.len as usize) {
                        out.errors += 1;
                        i += 1;
                        continue;
                    }
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "in bounds (checked above): below the UMEM's usize length"
                    )]
                    let buf = base.wrapping_add(d.addr as usize);
                    let e = match (ff, fb) {
                        (true, true) => opcode::WriteFixed::new(types::Fixed(0), buf, d.len, 0).build(),
                        (false, true) => opcode::WriteFixed::new(types::Fd(fd), buf, d.len, 0).build(),
                        (true, false) => opcode::Write::new(types::Fixed(0), buf, d.len).build(),
                        (false, false) => opcode::Write::new(types::Fd(fd), buf, d.len).build(),
                    }
                    .user_data(WRITE_TAG | i as u64);
                    // SAFETY: the caller owns every frame of `descs` until this function
                    // returns, and it returns only after every write queued here completed.
                    if unsafe { sq.push(&e) }.is_err() {
                        full = true;
                        break;
                    }
                    queued += 1;
                    i += 1;
                }
            }
            if full {
                // SQ full: submit what is queued (reaped below) and go on.
                let _ = self.submit_and_wait(0);
                out.enters += 1;
            }
        }
        let mut pending = queued;
        let mut want = queued;
        while pending > 0 {
            match self.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) => {
                    log::error!("io_uring_enter failed while writes are in flight: {e}");
                    std::thread::yield_now();
                }
            }
            out.enters += 1;
            for c in self.ring.completion() {
                let (ud, res) = (c.user_data(), c.result());
                if ud & TAG_MASK == WRITE_TAG {
                    pending -= 1;
                    if res >= 0 {
                        out.packets += 1;
                        out.bytes += res as u64;
                    } else {
                        out.errors += 1;
                    }
                } else {
                    other(ud, res);
                }
            }
            want = pending.min(1);
        }
        out
    }
}

pub(crate) const TAG_MASK: u64 = 0b11 << 62;
pub(crate) const WRITE_TAG: u64 = 0b01 << 62;
pub(crate) const READ_TAG: u64 = 0b10 << 62;
pub(crate) const MISC_TAG: u64 = 0b11 << 62;
