// SPDX-License-Identifier: GPL-2.0

//! io_uring commands (`IORING_OP_URING_CMD`) of a file.
//!
//! C header: [`include/linux/io_uring/cmd.h`](srctree/include/linux/io_uring/cmd.h)
//!
//! The file operation `uring_cmd` hands the driver an [`UringCmd`]. The
//! driver either returns a result at once (posted by io_uring), or
//! [queues](UringCmd::queue) the command and gets a [`PendingCmd`] that
//! completes it later, from any context: every completion goes through task
//! work, in the submitter's task, where a [`TaskWork`] may sleep before the
//! CQE is posted. A pending command completes exactly once: dropping its
//! handle completes it with `-ECANCELED`.

use core::ptr::NonNull;
use kernel::{
    bindings,
    ffi::{c_int, c_void},
    prelude::*,
};

// What the kernel offers only as static inlines and macros: the shim's
// functions, as bindgen declares them (`super::c`).
use super::c as helpers;

/// Bytes of an SQE's command area with 128-byte SQEs.
pub(crate) const SQE128_CMD_BYTES: usize = 80;

/// A command being issued to the driver.
///
/// # Invariants
///
/// `raw` is a command io_uring issues to the driver for the duration of the
/// `uring_cmd` call that created this value; `queued` tells whether a
/// [`PendingCmd`] took over its completion.
pub(crate) struct UringCmd {
    raw: NonNull<bindings::io_uring_cmd>,
    issue_flags: u32,
    queued: bool,
}

impl UringCmd {
    /// # Safety
    ///
    /// `raw` is the command of a `uring_cmd` call, which must return
    /// `-EIOCBQUEUED` if [`UringCmd::queued`] says so afterwards.
    pub(crate) unsafe fn from_raw(raw: NonNull<bindings::io_uring_cmd>, issue_flags: u32) -> Self {
        // INVARIANT: the caller's promise.
        Self {
            raw,
            issue_flags,
            queued: false,
        }
    }

    /// The `struct file` the command was issued on.
    pub(crate) fn file_raw(&self) -> *mut bindings::file {
        // SAFETY: the command is valid during the issue (type invariant).
        unsafe { helpers::p2pdirect_uring_file(self.raw.as_ptr()) }
    }

    /// `sqe->cmd_op`.
    pub(crate) fn op(&self) -> u32 {
        // SAFETY: as in `file_raw`.
        unsafe { helpers::p2pdirect_uring_op(self.raw.as_ptr()) }
    }

    /// `sqe->uring_cmd_flags`: the `IORING_URING_CMD_*` flags the submitter
    /// set (io_uring's own, such as its reissue mark, left out).
    pub(crate) fn cmd_flags(&self) -> u32 {
        // SAFETY: as in `file_raw`.
        unsafe { helpers::p2pdirect_uring_cmd_flags(self.raw.as_ptr()) }
    }

    /// Whether the issue must not block (io_uring retries a command that
    /// returns `EAGAIN` then from a worker that may).
    pub(crate) fn nonblock(&self) -> bool {
        // SAFETY: decodes flags; no pointer involved.
        unsafe { helpers::p2pdirect_uring_nonblock(self.issue_flags) }
    }

    /// A copy of the SQE's command area, read once; `None` if the ring does
    /// not use 128-byte SQEs.
    pub(crate) fn payload(&self) -> Option<[u8; SQE128_CMD_BYTES]> {
        // SAFETY: as in `file_raw`; the command area of a 128-byte SQE has
        // `SQE128_CMD_BYTES` readable bytes for the issue. On an inline issue
        // they are in the ring, which userspace may write meanwhile, so they
        // are copied once, here, and only the copy is used.
        unsafe {
            let p = helpers::p2pdirect_uring_sqe_cmd(self.raw.as_ptr(), self.issue_flags);
            (!p.is_null()).then(|| p.cast::<[u8; SQE128_CMD_BYTES]>().read_unaligned())
        }
    }

    /// Takes over the command's completion: the `uring_cmd` call then
    /// returns `-EIOCBQUEUED`, whatever the driver returns. `None` if it
    /// was taken over already (one handle completes a command).
    pub(crate) fn queue(&mut self) -> Option<PendingCmd> {
        if self.queued {
            return None;
        }
        self.queued = true;
        // INVARIANT: `queued` is set, so the issue returns -EIOCBQUEUED and
        // this pending handle is the only one to complete the command.
        Some(PendingCmd {
            raw: self.raw,
            cqe32: {
                // SAFETY: decodes flags; no pointer involved.
                unsafe { helpers::p2pdirect_uring_cqe32(self.issue_flags) }
            },
        })
    }

    /// Gives back the completion [`UringCmd::queue`] took during this
    /// issue: the issue returns its own result again (`EAGAIN` sends the
    /// command to io_uring's worker). A handle of another command is
    /// returned.
    pub(crate) fn unqueue(&mut self, pending: PendingCmd) -> core::result::Result<(), PendingCmd> {
        if !self.queued || pending.raw != self.raw {
            return Err(pending);
        }
        // The command was never handed to anything else: forgetting the
        // handle leaves it to the issue again.
        core::mem::forget(pending);
        // INVARIANT: no pending handle of the command exists any more.
        self.queued = false;
        Ok(())
    }

    /// Whether [`UringCmd::queue`] was called.
    pub(crate) fn queued(&self) -> bool {
        self.queued
    }
}

/// Work that completes a command in its submitter's task (process
/// context: it may sleep); returns the CQE's `res` and, with 32-byte CQEs,
/// `big_cqe[0]`.
pub(crate) trait TaskWork: Send + 'static {
    /// Runs once.
    fn run(self: KBox<Self>) -> (i32, u64);
}

/// A queued command, completed by its handle.
///
/// # Invariants
///
/// `raw` is a command whose issue returned `-EIOCBQUEUED` and that nothing
/// else completes: it stays valid until this handle completes it, which it
/// does exactly once (`complete*` or `Drop`).
pub(crate) struct PendingCmd {
    raw: NonNull<bindings::io_uring_cmd>,
    cqe32: bool,
}

// SAFETY: a queued command may be completed from any context and thread.
unsafe impl Send for PendingCmd {}

impl PendingCmd {
    /// Runs `work` in the submitter's task and posts its result. Any
    /// context (interrupts included).
    pub(crate) fn complete<W: TaskWork>(self, work: KBox<W>) {
        let me = core::mem::ManuallyDrop::new(self);
        // SAFETY: the command is pending (type invariant) and completed once,
        // here; `run::<W>` gets the box back exactly once.
        unsafe {
            helpers::p2pdirect_uring_complete_in_task(
                me.raw.as_ptr(),
                Some(run::<W>),
                KBox::into_raw(work).cast(),
                0,
                0,
                me.cqe32,
            )
        };
    }

    /// Posts `res` and `res2` from the submitter's task. Any context.
    pub(crate) fn complete_with(self, res: i32, res2: u64) {
        let me = core::mem::ManuallyDrop::new(self);
        // SAFETY: the command is pending (type invariant) and completed
        // once, here.
        unsafe {
            helpers::p2pdirect_uring_complete_in_task(
                me.raw.as_ptr(),
                None,
                core::ptr::null_mut(),
                res,
                res2,
                me.cqe32,
            )
        };
    }
}

impl Drop for PendingCmd {
    fn drop(&mut self) {
        // SAFETY: the command is pending (type invariant); completed once.
        unsafe {
            helpers::p2pdirect_uring_complete_in_task(
                self.raw.as_ptr(),
                None,
                core::ptr::null_mut(),
                -(bindings::ECANCELED as c_int),
                0,
                self.cqe32,
            )
        };
    }
}

/// The task-work callback of [`PendingCmd::complete`].
///
/// # Safety
///
/// `ctx` comes from `KBox::<W>::into_raw` and is used once.
unsafe extern "C" fn run<W: TaskWork>(
    _cmd: *mut bindings::io_uring_cmd,
    ctx: *mut c_void,
    res2: *mut u64,
) -> c_int {
    // SAFETY: the caller's promise.
    let work = unsafe { KBox::<W>::from_raw(ctx.cast()) };
    let (res, extra) = work.run();
    // SAFETY: the shim passes a valid pointer to its local.
    unsafe { *res2 = extra };
    res
}

/// The `uring_cmd` file operation's glue: the result `UringCmd` and the
/// handler agree on.
pub(crate) fn issue_result(cmd: &UringCmd, r: Result<i32>) -> c_int {
    if cmd.queued() {
        return -(bindings::EIOCBQUEUED as c_int);
    }
    match r {
        Ok(v) => v,
        Err(e) => e.to_errno(),
    }
}
