// SPDX-License-Identifier: GPL-2.0
//! Asynchronous READ and WRITE through io_uring (ABI 1.8).
//!
//! A [`Ring`] queues `P2PDIRECT_URING_CMD_READ`/`WRITE` commands (the
//! argument inline in 128-byte SQEs), submits many at once and reaps their
//! completions (32-byte CQEs carry the P2P and bounce byte counts). One
//! thread keeps as many I/Os in flight as the ring holds, up to
//! [`MAX_INFLIGHT`] per open `/dev/p2pdirect`.
//!
//! The io-uring crate (tokio-rs) does the ring itself: setup, the mmap'ed
//! queues and `io_uring_enter`, kept correct against new kernels by its
//! maintainers; this module only builds p2pdirect's commands.

use crate::{sys, Device, Io};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::{collections::VecDeque, io, marker::PhantomData};

/// `P2PDIRECT_URING_MAX_INFLIGHT`: commands in flight per open device file.
pub const MAX_INFLIGHT: u32 = sys::P2PDIRECT_URING_MAX_INFLIGHT;

/// What one command did: bytes moved (as the ioctls' `bytes`), or the errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The `user_data` the command was pushed with.
    pub user_data: u64,
    /// Bytes moved, or the error (`raw_os_error()` is the errno).
    pub result: Result<u64, i32>,
    /// Of the bytes, moved by DMA between the storage and device memory.
    pub p2p_bytes: u64,
    /// Of the bytes, moved through host memory (COMPAT).
    pub bounce_bytes: u64,
    /// Of the bytes, read from holes or unwritten extents (zeroed by the
    /// CPU): the rest of `bytes` after `p2p_bytes` and `bounce_bytes`, as
    /// the header defines it; 0 for an error.
    pub zeroed_bytes: u64,
}

impl Completion {
    /// The result as an `io::Result`.
    pub fn bytes(&self) -> io::Result<u64> {
        self.result.map_err(io::Error::from_raw_os_error)
    }

    /// A completion as its 32-byte CQE gives it.
    fn from_cqe(c: &cqueue::Entry32) -> Self {
        let big = c.big_cqe()[0];
        let (p2p_bytes, bounce_bytes) = (big & 0xffff_ffff, big >> 32);
        let result = if c.result() < 0 {
            Err(-c.result())
        } else {
            Ok(c.result() as u64)
        };
        Completion {
            user_data: c.user_data(),
            result,
            p2p_bytes,
            bounce_bytes,
            zeroed_bytes: result.map_or(0, |bytes| bytes.saturating_sub(p2p_bytes + bounce_bytes)),
        }
    }
}

/// An io_uring of 128-byte SQEs and 32-byte CQEs for one open device.
///
/// It counts the commands pushed whose completion it has not handed out
/// ([`Ring::pending`]): [`Ring::wait`] refuses to wait for more than that
/// (it would wait forever). Dropping the ring waits for every command it
/// submitted, so that none still uses its file or memory once the ring is
/// gone; commands pushed but never submitted are dropped with it, not run.
pub struct Ring<'d> {
    ring: IoUring<squeue::Entry128, cqueue::Entry32>,
    dev: i32,
    /// Commands pushed whose completion was not handed out yet.
    pending: usize,
    /// Of them, those pushed but not submitted yet.
    unsubmitted: usize,
    /// The kernel dropped completions (`EBADR`): `pending` is not known.
    lost: bool,
    /// Completions taken off the ring and not handed out yet.
    ready: VecDeque<Completion>,
    _dev: PhantomData<&'d Device>,
}

/// The argument must fit the 80 bytes of a 128-byte SQE's command.
const _: () = assert!(std::mem::size_of::<sys::p2pdirect_uring_io>() <= 80);

impl<'d> Ring<'d> {
    /// A ring of `entries` submission slots (a power of two) for `dev`.
    pub fn new(dev: &'d Device, entries: u32) -> io::Result<Self> {
        Ok(Self {
            ring: IoUring::builder().build(entries)?,
            dev: dev.as_raw_fd(),
            pending: 0,
            unsubmitted: 0,
            lost: false,
            ready: VecDeque::new(),
            _dev: PhantomData,
        })
    }

    /// Queues a READ (device memory from the file) or, with `write`, a WRITE;
    /// `user_data` comes back in its [`Completion`]. A full submission
    /// queue is refused, the command not queued, with an error of kind
    /// `WouldBlock` that says so: submit first.
    ///
    /// The command names its file by number (`io.fd`) and its memory by
    /// address or registration: keep both as they are until its completion
    /// (a command io_uring's worker runs looks them up when it starts, after
    /// the submission; a number or address reused meanwhile is what it
    /// uses).
    pub fn push(&mut self, write: bool, io: &Io, user_data: u64) -> io::Result<()> {
        let (addr, flags) = io.addr_flags();
        let arg = sys::p2pdirect_uring_io {
            fd: io.fd,
            flags,
            addr,
            size: io.size,
            file_offset: io.file_offset,
            buf_offset: io.buf_offset,
        };
        let mut cmd = [0u8; 80];
        let n = std::mem::size_of::<sys::p2pdirect_uring_io>();
        // SAFETY: the struct is `repr(C)` plain integers with no padding
        // (two 32-bit fields, then 64-bit ones), `n` bytes that fit `cmd`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&arg).cast::<u8>(),
                cmd.as_mut_ptr(),
                n,
            )
        };
        let op = if write {
            sys::P2PDIRECT_URING_CMD_WRITE
        } else {
            sys::P2PDIRECT_URING_CMD_READ
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev), op)
            .cmd(cmd)
            .build()
            .user_data(user_data);
        // SAFETY: the command names its memory by address or registration
        // id, which the kernel resolves, checks and pins itself; it refers
        // to no buffer of this process that Rust owns, so nothing here must
        // outlive the command.
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "the submission queue is full ({} commands not submitted yet): \
                         submit, then push again",
                    self.unsubmitted
                ),
            )
        })?;
        self.pending += 1;
        self.unsubmitted += 1;
        Ok(())
    }

    /// Commands pushed whose completion was not handed out yet (by
    /// [`Ring::wait`] or [`Ring::completions`]).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Moves the completions in the ring to `ready`.
    fn reap(&mut self) {
        let mut cq = self.ring.completion();
        cq.sync();
        self.ready.extend(cq.map(|c| Completion::from_cqe(&c)));
    }

    /// Hands out the first `n` ready completions.
    fn take(&mut self, n: usize) -> Vec<Completion> {
        let out: Vec<Completion> = self.ready.drain(..n).collect();
        self.pending -= out.len();
        out
    }

    /// Submits what was pushed; returns how many the kernel took.
    pub fn submit(&mut self) -> io::Result<usize> {
        self.submit_and_wait(0)
    }

    /// Submits what was pushed and waits until `want` completions are ready
    /// (those taken off the ring and not handed out yet count); returns how
    /// many commands the kernel took. `InvalidInput` if fewer than `want`
    /// commands are pending (it would wait forever).
    pub fn submit_and_wait(&mut self, want: usize) -> io::Result<usize> {
        self.check_pending(want)?;
        let more = want.saturating_sub(self.ready.len());
        // The count comes back even when the wait after the submission
        // fails; an error means nothing was taken.
        let taken = self.ring.submit_and_wait(more).inspect_err(|e| {
            if e.raw_os_error() == Some(libc::EBADR) {
                self.lost = true;
            }
        })?;
        self.unsubmitted -= taken.min(self.unsubmitted);
        Ok(taken)
    }

    /// `InvalidInput` unless `n` completions can still come;
    /// `EBADR` once the kernel dropped completions.
    fn check_pending(&self, n: usize) -> io::Result<()> {
        if self.lost {
            // The kernel dropped completions (out of memory): what is
            // pending is not known any more.
            return Err(io::Error::from_raw_os_error(libc::EBADR));
        }
        if n > self.pending {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "waiting for {n} completions with {} commands pending",
                    self.pending
                ),
            ));
        }
        Ok(())
    }

    /// The completions ready now (none if none is).
    pub fn completions(&mut self) -> Vec<Completion> {
        self.reap();
        self.take(self.ready.len())
    }

    /// Submits what was pushed, waits until `n` completions are ready and
    /// returns exactly `n` of them, in the order they completed (the others
    /// stay for the next call). `InvalidInput` if fewer than `n` commands
    /// are pending: it would wait forever. A signal does not end the wait;
    /// on another error the completions already taken stay for the next
    /// call.
    pub fn wait(&mut self, n: usize) -> io::Result<Vec<Completion>> {
        loop {
            match self.submit_and_wait(n) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            self.reap();
            if self.ready.len() >= n {
                return Ok(self.take(n));
            }
        }
    }
}

/// `IORING_ENTER_GETEVENTS` of `<linux/io_uring.h>`.
const IORING_ENTER_GETEVENTS: u32 = 1;

impl Drop for Ring<'_> {
    /// Waits for every submitted command (their completions are dropped):
    /// closing the ring's file would cancel those io_uring's worker had not
    /// started and leave the others running, their memory and file still
    /// in use after the drop. What was pushed and not submitted is not
    /// submitted now. Once the kernel dropped completions (out of memory)
    /// nothing can be counted and nothing is waited for.
    fn drop(&mut self) {
        while !self.lost && self.ready.len() + self.unsubmitted < self.pending {
            // SAFETY: nothing to submit and no argument: the call only
            // waits for a completion of this ring.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
            };
            match r {
                Ok(_) => self.reap(),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // Nothing more can be waited for.
                Err(_) => break,
            }
        }
    }
}
