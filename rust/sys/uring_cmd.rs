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

// The command's layout, opaque in the kernel crate's bindings, and the
// completion path (static inlines) from the shim, as bindgen declares them.
use super::c as helpers;
use helpers::io_uring_cmd as RawCmd;

/// Where an SQE's command area starts (`offsetof(struct io_uring_sqe, cmd)`,
/// fixed by the io_uring ABI).
const SQE_CMD_OFFSET: usize = 48;

/// Bytes of an SQE's command area with 128-byte SQEs (to the end of the
/// SQE's second half).
pub(crate) const SQE128_CMD_BYTES: usize = 2 * SQE_BYTES - SQE_CMD_OFFSET;

/// Bytes of an SQE (`struct io_uring_sqe`, fixed by the io_uring ABI).
const SQE_BYTES: usize = 64;
const _: () = assert!(core::mem::size_of::<helpers::io_uring_sqe>() == SQE_BYTES);

/// The fields of a command's SQE that io_uring neither reads for
/// `IORING_OP_URING_CMD` nor checks, left to the driver: `addr`, `len`,
/// `buf_index` (read by io_uring only with `IORING_URING_CMD_FIXED`) and the
/// word at `file_index` (`splice_fd_in`, `addr_len`). (`ioprio` io_uring
/// refuses itself for these commands.) Offsets fixed by the io_uring ABI
/// (checked in the shim).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct SqeFields {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) buf_index: u16,
    pub(crate) file_index: u32,
}

/// The command area of a 128-byte SQE, copied. On an inline issue the
/// bytes are in the ring, which userspace may write meanwhile, so they are
/// copied once, with volatile reads (`READ_ONCE`: the compiler may neither
/// drop the copy nor read a field from the ring again later), and only the
/// copy is used.
///
/// # Safety
///
/// `sqe` is a 128-byte SQE, readable for the call.
unsafe fn payload(sqe: *const helpers::io_uring_sqe) -> [u8; SQE128_CMD_BYTES] {
    // SAFETY: the command area of a 128-byte SQE (from `cmd`, to the end of
    // its second half) has `SQE128_CMD_BYTES` readable bytes (caller).
    let src = unsafe { sqe.cast::<u8>().add(SQE_CMD_OFFSET) };
    let mut out = [0u8; SQE128_CMD_BYTES];
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: `i` is below `SQE128_CMD_BYTES`, inside the area.
        *b = unsafe { src.add(i).read_volatile() };
    }
    out
}

/// The SQE fields io_uring leaves to the driver, each read once (as
/// `READ_ONCE` does: userspace may write an inline-issued SQE meanwhile).
///
/// # Safety
///
/// `sqe` is an SQE, readable for the call.
unsafe fn sqe_fields(sqe: *const helpers::io_uring_sqe) -> SqeFields {
    let sqe = sqe.cast::<u8>();
    // SAFETY: the first 64 bytes of the SQE are readable (caller); each
    // field lies inside them at its ABI offset (checked against the header
    // in the shim), aligned for its type (an SQE, in the ring or in
    // io_uring's copy, is at least 8-byte aligned: a struct of `u64`
    // fields).
    unsafe {
        SqeFields {
            addr: sqe.add(16).cast::<u64>().read_volatile(),
            len: sqe.add(24).cast::<u32>().read_volatile(),
            buf_index: sqe.add(40).cast::<u16>().read_volatile(),
            file_index: sqe.add(44).cast::<u32>().read_volatile(),
        }
    }
}

/// A command being issued to the driver.
///
/// # Invariants
///
/// `raw` is a command io_uring issues to the driver for the duration of the
/// `uring_cmd` call that created this value; `queued` tells whether a
/// [`PendingCmd`] took over its completion.
pub(crate) struct UringCmd {
    raw: NonNull<RawCmd>,
    issue_flags: u32,
    queued: bool,
    /// What the accessors return, read when the issue began: once a
    /// [`PendingCmd`] completed the command (from another thread's task
    /// work, while this issue still runs in io_uring's worker), io_uring
    /// may recycle the request and its copy of the SQE, so nothing of them
    /// is read after [`UringCmd::queue`].
    file: *mut bindings::file,
    op: u32,
    flags: u32,
    sqe: SqeFields,
    payload: Option<[u8; SQE128_CMD_BYTES]>,
}

impl UringCmd {
    /// # Safety
    ///
    /// `raw` is the command of a `uring_cmd` call, which must return
    /// `-EIOCBQUEUED` if [`UringCmd::queued`] says so afterwards.
    pub(crate) unsafe fn from_raw(raw: NonNull<bindings::io_uring_cmd>, issue_flags: u32) -> Self {
        let raw = raw.cast::<RawCmd>();
        // SAFETY: the command is valid during the issue (the caller's
        // promise), and nothing has completed it yet; io_uring does not
        // write these fields meanwhile. Read field by field: no reference
        // covers the `pdu`, which a queued completion may write.
        let (file, sqe, op, flags) = unsafe {
            let r = raw.as_ptr();
            ((*r).file, (*r).sqe, (*r).cmd_op, (*r).flags)
        };
        let sqe128 = issue_flags & (helpers::io_uring_cmd_flags_IO_URING_F_SQE128 as u32) != 0;
        // SAFETY: as above, the SQE is valid during the issue, and has 128
        // bytes when io_uring says so.
        let (fields, payload) = unsafe { (sqe_fields(sqe), sqe128.then(|| payload(sqe))) };
        // INVARIANT: the caller's promise. The kernel crate declares the
        // struct opaque; `RawCmd` is its layout, generated from the same
        // header.
        Self {
            raw,
            issue_flags,
            queued: false,
            file,
            op,
            flags,
            sqe: fields,
            payload,
        }
    }

    /// The `struct file` the command was issued on.
    pub(crate) fn file_raw(&self) -> *mut bindings::file {
        self.file
    }

    /// `sqe->cmd_op`.
    pub(crate) fn op(&self) -> u32 {
        self.op
    }

    /// `sqe->uring_cmd_flags`: the `IORING_URING_CMD_*` flags the submitter
    /// set (io_uring's own, such as its reissue mark, left out).
    pub(crate) fn cmd_flags(&self) -> u32 {
        self.flags & helpers::IORING_URING_CMD_MASK
    }

    fn issue_flag(&self, flag: helpers::io_uring_cmd_flags) -> bool {
        self.issue_flags & (flag as u32) != 0
    }

    /// Whether the issue must not block (io_uring retries a command that
    /// returns `EAGAIN` then from a worker that may).
    pub(crate) fn nonblock(&self) -> bool {
        self.issue_flag(helpers::io_uring_cmd_flags_IO_URING_F_NONBLOCK)
    }

    /// A copy of the SQE's command area, read once when the issue began;
    /// `None` if the ring does not use 128-byte SQEs.
    pub(crate) fn payload(&self) -> Option<[u8; SQE128_CMD_BYTES]> {
        self.payload
    }

    /// The SQE fields io_uring leaves to the driver ([`SqeFields`]), each
    /// read once when the issue began.
    pub(crate) fn sqe_fields(&self) -> SqeFields {
        self.sqe
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
            cqe32: self.issue_flag(helpers::io_uring_cmd_flags_IO_URING_F_CQE32),
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

/// Work that completes a command, in process context (it may sleep);
/// returns the CQE's `res` and, with 32-byte CQEs, `big_cqe[0]`.
pub(crate) trait TaskWork: Send + 'static {
    /// Runs once. Normally in the submitter's task; with `cancel` (the task
    /// is exiting, or io_uring is tearing the ring down) from io_uring's
    /// fallback worker instead, where the work must only let go and report,
    /// not start new blocking work on the task's behalf.
    fn run(self: KBox<Self>, cancel: bool) -> (i32, u64);
}

/// A queued command, completed by its handle.
///
/// # Invariants
///
/// `raw` is a command whose issue returned `-EIOCBQUEUED` and that nothing
/// else completes: it stays valid until this handle completes it, which it
/// does exactly once (`complete*` or `Drop`).
pub(crate) struct PendingCmd {
    raw: NonNull<RawCmd>,
    cqe32: bool,
}

// SAFETY: a queued command may be completed from any context and thread.
unsafe impl Send for PendingCmd {}

/// What a command in flight keeps in its `pdu` (io_uring's 32 bytes for the
/// driver) between the completion and the task work that posts it.
#[repr(C)]
struct Pdu {
    /// A `KBox<W>` of [`PendingCmd::complete`], or null.
    work: *mut c_void,
    res2: u64,
    res: i32,
    cqe32: bool,
}

// The `Pdu` fits the command's `pdu` field and is aligned there.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Pdu>() <= offset_of!(RawCmd, unused) - offset_of!(RawCmd, pdu));
    assert!(offset_of!(RawCmd, pdu) % align_of::<Pdu>() == 0);
    assert!(align_of::<RawCmd>() >= align_of::<Pdu>());
};

impl PendingCmd {
    /// Stores `pdu` in the command and queues `tw` to run in the
    /// submitter's task; the handle is used up.
    fn finish(
        self,
        pdu: Pdu,
        tw: unsafe extern "C" fn(helpers::io_tw_req, helpers::io_tw_token_t),
    ) {
        let me = core::mem::ManuallyDrop::new(self);
        let raw = me.raw.as_ptr();
        // SAFETY: the command is pending (type invariant), so its `pdu` is
        // the driver's; it is aligned for and large enough to hold a `Pdu`
        // (asserted above against the generated layout). The command is completed once,
        // here: `tw` posts it. `__io_uring_cmd_do_in_task` with the lazy
        // flag is `io_uring_cmd_do_in_task_lazy`, callable from any context.
        // Lazy: on a DEFER_TASKRUN ring the submitter waiting for N CQEs is
        // woken once N such task works are queued, not for each, as for
        // io_uring's own reads and NVMe passthrough; that is right because
        // each of them posts exactly one CQE (`task_work` below).
        unsafe {
            (&raw mut (*raw).pdu).cast::<Pdu>().write(pdu);
            helpers::__io_uring_cmd_do_in_task(
                raw,
                Some(tw),
                helpers::P2PDIRECT_IOU_F_TWQ_LAZY_WAKE,
            );
        }
    }

    /// Runs `work` in the submitter's task and posts its result. Any
    /// context (interrupts included).
    pub(crate) fn complete<W: TaskWork>(self, work: KBox<W>) {
        let pdu = Pdu {
            work: KBox::into_raw(work).cast(),
            res2: 0,
            res: 0,
            cqe32: self.cqe32,
        };
        self.finish(pdu, task_work::<W>);
    }

    /// Posts `res` and `res2` from the submitter's task. Any context.
    pub(crate) fn complete_with(self, res: i32, res2: u64) {
        let pdu = Pdu {
            work: core::ptr::null_mut(),
            res2,
            res,
            cqe32: self.cqe32,
        };
        self.finish(pdu, task_work::<Posted>);
    }
}

impl Drop for PendingCmd {
    fn drop(&mut self) {
        let pending = PendingCmd {
            raw: self.raw,
            cqe32: self.cqe32,
        };
        // INVARIANT: `self` is being dropped and never completes the
        // command: `pending` is its only handle now.
        pending.complete_with(-(bindings::ECANCELED as c_int), 0);
    }
}

/// The [`TaskWork`] of [`PendingCmd::complete_with`]: the result is in the
/// `pdu` already.
enum Posted {}

impl TaskWork for Posted {
    fn run(self: KBox<Self>, _cancel: bool) -> (i32, u64) {
        match *self {}
    }
}

/// The task-work callback of [`PendingCmd::finish`]: runs the work, if
/// any, and posts the CQE.
///
/// # Safety
///
/// io_uring calls it once, in the submitter's task, for a command that
/// [`PendingCmd::finish`] queued with `W` (its `pdu` holds a [`Pdu`] whose
/// `work` is null or from `KBox::<W>::into_raw`).
unsafe extern "C" fn task_work<W: TaskWork>(req: helpers::io_tw_req, tw: helpers::io_tw_token_t) {
    // `io_uring_cmd_from_tw()`: the command is the start of its request
    // (`cmd_to_io_kiocb()` is the same cast the other way).
    let raw = req.req.cast::<RawCmd>();
    // SAFETY: the caller's promise: `finish` wrote a `Pdu` there.
    let pdu = unsafe { (&raw const (*raw).pdu).cast::<Pdu>().read() };
    let (res, res2) = if pdu.work.is_null() {
        (pdu.res, pdu.res2)
    } else {
        // SAFETY: the caller's promise; the box is taken back once, here.
        unsafe { KBox::<W>::from_raw(pdu.work.cast()) }.run(tw.cancel)
    };
    // SAFETY: the command is pending and completed once, here, from task
    // work (`IO_URING_CMD_TASK_WORK_ISSUE_FLAGS`).
    unsafe {
        helpers::__io_uring_cmd_done(
            raw,
            res,
            res2,
            helpers::io_uring_cmd_flags_IO_URING_F_COMPLETE_DEFER as u32,
            pdu.cqe32,
        )
    };
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
