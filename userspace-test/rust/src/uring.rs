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
use std::{io, marker::PhantomData};

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
}

impl Completion {
    /// The result as an `io::Result`.
    pub fn bytes(&self) -> io::Result<u64> {
        self.result.map_err(io::Error::from_raw_os_error)
    }
}

/// An io_uring of 128-byte SQEs and 32-byte CQEs for one open device.
pub struct Ring<'d> {
    ring: IoUring<squeue::Entry128, cqueue::Entry32>,
    dev: i32,
    _dev: PhantomData<&'d Device>,
}

impl<'d> Ring<'d> {
    /// A ring of `entries` submission slots (a power of two) for `dev`.
    pub fn new(dev: &'d Device, entries: u32) -> io::Result<Self> {
        Ok(Self {
            ring: IoUring::builder().build(entries)?,
            dev: dev.as_raw_fd(),
            _dev: PhantomData,
        })
    }

    /// Queues a READ (device memory from the file) or, with `write`, a WRITE;
    /// `user_data` comes back in its [`Completion`]. `EBUSY` if the
    /// submission queue is full (submit first).
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
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Submits what was pushed; returns how many the kernel took.
    pub fn submit(&mut self) -> io::Result<usize> {
        self.ring.submit()
    }

    /// Submits what was pushed and waits until `want` completions are ready.
    pub fn submit_and_wait(&mut self, want: usize) -> io::Result<usize> {
        self.ring.submit_and_wait(want)
    }

    /// The completions ready now.
    pub fn completions(&mut self) -> Vec<Completion> {
        self.ring
            .completion()
            .map(|c| {
                let big = c.big_cqe()[0];
                Completion {
                    user_data: c.user_data(),
                    result: if c.result() < 0 {
                        Err(-c.result())
                    } else {
                        Ok(c.result() as u64)
                    },
                    p2p_bytes: big & 0xffff_ffff,
                    bounce_bytes: big >> 32,
                }
            })
            .collect()
    }

    /// Pushes nothing, waits for and returns `n` completions.
    pub fn wait(&mut self, n: usize) -> io::Result<Vec<Completion>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            self.ring.submit_and_wait(1)?;
            out.extend(self.completions());
        }
        Ok(out)
    }
}
