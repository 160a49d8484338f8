// SPDX-License-Identifier: GPL-2.0

//! Direct I/O of a file into or out of pages a driver holds, through the
//! file system: a kiocb over a kernel-address (kvec) iterator, given to the file's
//! `read_iter`/`write_iter` (`vfs_iocb_iter_read/write`: the checks and
//! hooks of read(2)/write(2) included).
//!
//! C header: [`include/linux/fs.h`](srctree/include/linux/fs.h)
//!
//! - [`rw_sync`]: the caller waits (a synchronous kiocb).
//! - [`AsyncRw`]: nobody waits. The file system calls `ki_complete` when
//!   the I/O ended (any context); the pages go there, and the
//!   [`AsyncRwOwner`] learns of it.

use core::{
    mem::offset_of,
    sync::atomic::{AtomicU8, Ordering},
};
use kernel::{bindings, fs::File, page::PAGE_SIZE, prelude::*, types::Opaque};

use super::bio::{BioPages, DropInAnyContext, Op};

// What the kernel offers only as static inlines and macros: the shim's
// functions, as bindgen declares them (`super::c`).
use super::c as helpers;

/// `init_sync_kiocb()` at `pos`; with `complete` an asynchronous kiocb, with
/// `nowait` one that must not block (`IOCB_NOWAIT`). Returns false, the
/// kiocb untouched, if `nowait` is asked of a file that cannot do it.
///
/// # Safety
///
/// `k` is the caller's to initialise; `file` is a valid file.
unsafe fn kiocb_init(
    k: *mut bindings::kiocb,
    file: *mut bindings::file,
    pos: i64,
    complete: Option<unsafe extern "C" fn(*mut bindings::kiocb, kernel::ffi::c_long)>,
    nowait: bool,
) -> bool {
    // SAFETY: `file` is valid (caller's contract); `f_mode` does not change.
    if nowait && unsafe { (*file).f_mode } & helpers::P2PDIRECT_FMODE_NOWAIT == 0 {
        return false;
    }
    // SAFETY: `k` is the caller's to initialise and `file` is valid; the
    // fields set afterwards are plain ones of the initialised kiocb.
    unsafe {
        helpers::p2pdirect_init_sync_kiocb(k, file);
        // Direct whatever the file's flags say now: the caller checked
        // `O_DIRECT` before, and an fcntl(F_SETFL) since must not turn the
        // I/O into CPU copies through the page cache.
        (*k).ki_flags |= helpers::P2PDIRECT_IOCB_DIRECT;
        (*k).ki_pos = pos;
        (*k).ki_complete = complete;
        if nowait {
            (*k).ki_flags |= helpers::P2PDIRECT_IOCB_NOWAIT;
        }
    }
    true
}

/// The kernel addresses of bytes `[off, off + len)` of `pages`, one segment
/// per vector the block layer would take (a run of contiguous pages of one
/// `dev_pagemap`).
///
/// The file system gets the pages through the block layer's own extraction
/// (`bio_iov_iter_get_pages()`), which marks a bio of P2PDMA pages
/// unmergeable and never mixes `dev_pagemap`s in one bio. A bvec iterator's
/// pages would go into the bios as they are, with no such mark: another
/// bio (host memory, say) could then merge into the request, whose
/// segments the driver DMA-maps all by the kind of its first
/// (`blk_rq_dma_map_iter_start()`).
///
/// # Invariants
///
/// The segments cover exactly `len` bytes of pages the caller's `pages`
/// hold, in the kernel's linear map; they are only used while those are
/// held.
struct Kvecs {
    v: KVVec<bindings::kvec>,
    len: u64,
}

impl Kvecs {
    /// The segments of `len` bytes of `pages` at `off`, for a WRITE (out
    /// of the pages) or a READ (into them, so pages pinned for writing:
    /// [`Op::check`]). Charged to the caller's memory cgroup: an
    /// asynchronous I/O keeps them while it is in flight.
    fn new<P: BioPages>(pages: &P, off: u64, len: u64, write: bool) -> Result<Self> {
        Op::new(write, false).check(pages)?;
        let end = off.checked_add(len).ok_or(EINVAL)?;
        if len == 0 || end > pages.len() {
            return Err(EINVAL);
        }
        // At most one segment per page touched.
        let n = usize::try_from(len.div_ceil(PAGE_SIZE as u64) + 1).map_err(|_| EINVAL)?;
        let mut v = KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
        let mut done = 0u64;
        while done < len {
            let (p, in_page, n) = pages.vector(off + done, len - done).ok_or(EINVAL)?;
            // SAFETY: a page `pages` holds.
            let base = unsafe { helpers::p2pdirect_page_address(p.as_ptr()) };
            if base.is_null() {
                // Not in the linear map (highmem): no kernel address to give.
                return Err(EINVAL);
            }
            v.push(
                bindings::kvec {
                    // SAFETY: `in_page` lies in the page at `base`.
                    iov_base: unsafe { base.byte_add(in_page as usize) },
                    // A vector lies inside `pages`, whose length is a `usize`
                    // count of pages' bytes.
                    iov_len: n as usize,
                },
                GFP_KERNEL_ACCOUNT,
            )?;
            done += n;
        }
        Ok(Self { v, len })
    }

    /// Points `iter` at the segments, for a READ (`ITER_DEST`) or a WRITE.
    ///
    /// # Safety
    ///
    /// `iter` is valid for writes; it is used only while `self` lives.
    unsafe fn iter(&self, iter: *mut bindings::iov_iter, write: bool) {
        let dir = if write {
            bindings::ITER_SOURCE
        } else {
            bindings::ITER_DEST
        };
        // SAFETY: the segments are valid for `len` bytes (type invariant);
        // the caller's promise for `iter`. The length fits a `usize` (the
        // segments' lengths did).
        unsafe {
            bindings::iov_iter_kvec(iter, dir, self.v.as_ptr(), self.v.len(), self.len as usize)
        };
    }
}

/// Runs a prepared kiocb (`vfs_iocb_iter_read/write`).
///
/// # Safety
///
/// `file` is referenced, `kiocb` initialised for it, `iter` set up over held
/// pages; all stay valid for as long as the file system uses them.
unsafe fn iocb_rw(
    file: *mut bindings::file,
    kiocb: *mut bindings::kiocb,
    iter: *mut bindings::iov_iter,
    write: bool,
) -> isize {
    // SAFETY: the caller's promise.
    unsafe {
        if write {
            bindings::vfs_iocb_iter_write(file, kiocb, iter)
        } else {
            bindings::vfs_iocb_iter_read(file, kiocb, iter)
        }
    }
}

/// The file's `read_iter` itself, without `vfs_iocb_iter_read()`'s checks
/// and event: for a READ whose checks ran already.
///
/// # Safety
///
/// As [`iocb_rw`], for a file opened for reading.
unsafe fn read_iter(
    file: *mut bindings::file,
    kiocb: *mut bindings::kiocb,
    iter: *mut bindings::iov_iter,
) -> isize {
    // SAFETY: an open file has its operations (caller's promise).
    match unsafe { (*(*file).f_op).read_iter } {
        // SAFETY: the caller's promise.
        Some(read) => unsafe { read(kiocb, iter) },
        None => -(bindings::EINVAL as isize),
    }
}

fn bytes_or_err(r: isize) -> Result<u64> {
    if r < 0 {
        // A negative `ssize_t` from the file system is an errno.
        Err(Error::from_errno(r as i32))
    } else {
        Ok(r as u64)
    }
}

/// A direct read or write of `len` bytes at `pos` of `file`, into or out of
/// `pages` at `off`, that returns when it ended: bytes moved (short at the
/// end of a file), or the error.
pub(crate) fn rw_sync<P: BioPages>(
    file: &File,
    pages: &P,
    off: u64,
    len: u64,
    pos: u64,
    write: bool,
) -> Result<u64> {
    let pos = i64::try_from(pos).map_err(|_| EINVAL)?;
    let segs = Kvecs::new(pages, off, len, write)?;
    let kiocb = Opaque::<bindings::kiocb>::uninit();
    let iter = Opaque::<bindings::iov_iter>::uninit();
    // SAFETY: `kiocb` is ours to initialise; a synchronous kiocb (no
    // completion, not NOWAIT) cannot fail.
    unsafe { kiocb_init(kiocb.get(), file.as_ptr(), pos, None, false) };
    // SAFETY: `iter` is ours; the segments outlive the call below.
    unsafe { segs.iter(iter.get(), write) };
    // SAFETY: initialised above; a synchronous kiocb is done with both when
    // the call returns, and `pages` hold the pages until then.
    bytes_or_err(unsafe { iocb_rw(file.as_ptr(), kiocb.get(), iter.get(), write) })
}

/// The owner of an [`AsyncRw`]: holds the file, and learns of the I/O's end.
pub(crate) trait AsyncRwOwner: Send + Sized + 'static {
    /// The pages the I/O moves data into or out of.
    type Pages: BioPages + DropInAnyContext + Send;

    /// The file (referenced for as long as the owner lives).
    fn file(&self) -> &File;

    /// The I/O ended and its pages are gone (unless kept for a retry, see
    /// [`AsyncRw::rerun_read`]): called once, in any context (interrupts
    /// included, or the submitter's after the file system took the I/O), so
    /// it may not sleep.
    fn completed(io: KBox<AsyncRw<Self>>);
}

/// A direct read or write of a file that nobody waits for.
///
/// # Invariants
///
/// - `kiocb` and `iter` are initialised by [`AsyncRw::submit`] before the
///   file system sees them; from then until `ki_complete` (or the
///   synchronous return) the file system owns the box (it lives at a fixed
///   address: it is only ever handed over as a raw `KBox` pointer).
/// - A queued I/O has two references (`refs`): the submitter's, held until
///   `vfs_iocb_iter_read/write` returned (file systems still touch the
///   kiocb's file and inode after queueing it, and the completion may run
///   meanwhile, on another CPU), and the completion's. Whoever drops the
///   last one hands the box to [`AsyncRwOwner::completed`]. Until then only
///   `refs` is touched by the submitter, and `res` and `pages` by the
///   completion.
/// - `pages` is `Some` until the I/O ended; the segments point into it.
pub(crate) struct AsyncRw<O: AsyncRwOwner> {
    kiocb: Opaque<bindings::kiocb>,
    iter: Opaque<bindings::iov_iter>,
    segs: Kvecs,
    pages: Option<O::Pages>,
    owner: O,
    pos: u64,
    write: bool,
    nowait: bool,
    res: isize,
    refs: AtomicU8,
}

/// How [`AsyncRw::submit`] went.
pub(crate) enum Issued<O: AsyncRwOwner> {
    /// The file system took the I/O: [`AsyncRwOwner::completed`] follows
    /// (it may have run already).
    Queued,
    /// The file system finished (or refused) it at once; nothing is in
    /// flight. With `nowait`, `EAGAIN` means: retry where it may block.
    Done(KBox<AsyncRw<O>>),
}

// SAFETY: the kiocb and the iterator are only touched by whoever holds the
// box (the submitter, the file system, then the owner); everything else is
// `Send`.
unsafe impl<O: AsyncRwOwner> Send for AsyncRw<O> {}

impl<O: AsyncRwOwner> AsyncRw<O> {
    /// A read or write of `len` bytes at `pos` of `owner`'s file, into or
    /// out of `pages` at `off`.
    pub(crate) fn new(
        owner: O,
        pages: O::Pages,
        off: u64,
        len: u64,
        pos: u64,
        write: bool,
    ) -> Result<KBox<Self>> {
        i64::try_from(pos).map_err(|_| EINVAL)?;
        let segs = Kvecs::new(&pages, off, len, write)?;
        Ok(KBox::new(
            Self {
                kiocb: Opaque::uninit(),
                iter: Opaque::uninit(),
                segs,
                pages: Some(pages),
                owner,
                pos,
                write,
                nowait: false,
                res: 0,
                refs: AtomicU8::new(0),
            },
            GFP_KERNEL_ACCOUNT,
        )?)
    }

    /// Starts the I/O. With `nowait` the file system must not block
    /// (`IOCB_NOWAIT`): it answers `EAGAIN` instead, at once or (rarely,
    /// after part of the I/O went) at completion. A file that cannot do
    /// NOWAIT I/O gets `EAGAIN` at once.
    pub(crate) fn submit(io: KBox<Self>, nowait: bool) -> Issued<O> {
        let raw = KBox::into_raw(io);
        let (kiocb, iter, file, write) = {
            // SAFETY: `raw` came from `into_raw`: valid, and ours until the
            // file system takes it below; this borrow ends before that.
            let me = unsafe { &mut *raw };
            me.nowait = nowait;
            let file = me.owner.file().as_ptr();
            // SAFETY: the kiocb is ours to initialise; the owner keeps the
            // file referenced. `new` checked that `pos` fits.
            let ready = unsafe {
                kiocb_init(
                    me.kiocb.get(),
                    file,
                    me.pos as i64,
                    Some(Self::complete),
                    nowait,
                )
            };
            if !ready {
                // The file cannot promise not to block: io_uring's worker
                // issues the command again, where it may.
                me.res = EAGAIN.to_errno() as isize;
                // SAFETY: nothing else saw `raw`.
                return Issued::Done(unsafe { KBox::from_raw(raw) });
            }
            // SAFETY: the segments live in the box, as long as the iterator.
            unsafe { me.segs.iter(me.iter.get(), me.write) };
            // INVARIANT: the submitter's reference and the completion's.
            me.refs.store(2, Ordering::Relaxed);
            (me.kiocb.get(), me.iter.get(), file, me.write)
        };
        // SAFETY: kiocb and iterator are initialised, in the box, which stays
        // where it is until both references went. The owner in the box keeps
        // the file referenced: the submitter's reference keeps the box, so
        // the file and the kiocb outlive this call even if `complete` ran.
        let ret = unsafe { iocb_rw(file, kiocb, iter, write) };
        if ret == -(bindings::EIOCBQUEUED as isize) {
            // SAFETY: our reference keeps the box; only `refs` is touched.
            unsafe { Self::put(raw) };
            return Issued::Queued;
        }
        // SAFETY: not queued: the file system will not call `complete`, so
        // the box is ours again.
        let mut io = unsafe { KBox::from_raw(raw) };
        io.res = ret;
        Issued::Done(io)
    }

    /// `ki_complete` (any context).
    ///
    /// # Safety
    ///
    /// `kiocb` is the kiocb of an [`AsyncRw`] the file system queued.
    unsafe extern "C" fn complete(kiocb: *mut bindings::kiocb, ret: kernel::ffi::c_long) {
        // SAFETY: `kiocb` points at the `kiocb` field of a box `submit` gave
        // up (an `Opaque` has the layout of what it wraps).
        let raw = unsafe { kiocb.byte_sub(offset_of!(Self, kiocb)).cast::<Self>() };
        // SAFETY: the completion's reference keeps the box; of it, only
        // `res` and `pages` are written here (type invariant), and `write`
        // and `nowait` read, which nobody writes any more.
        unsafe {
            if (*raw).write {
                // `vfs_iocb_iter_write` took the superblock's write access
                // for the queued kiocb: it is dropped here, as aio does.
                helpers::p2pdirect_kiocb_end_write(kiocb);
            }
            (*raw).res = ret;
            if !((*raw).nowait && ret == -(bindings::EAGAIN as isize)) {
                drop((*raw).pages.take());
            }
            Self::put(raw);
        }
    }

    /// Drops a reference; the last one hands the I/O to its owner.
    ///
    /// # Safety
    ///
    /// `raw` is a queued I/O, and the caller holds one of its references.
    unsafe fn put(raw: *mut Self) {
        // SAFETY: the reference keeps the box; `refs` is atomic.
        let refs = unsafe { &(*raw).refs };
        if refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: the last reference: the box is ours again.
            O::completed(unsafe { KBox::from_raw(raw) });
        }
    }

    /// A NOWAIT I/O the file system gave up (`EAGAIN`), which
    /// [`AsyncRw::rerun_read`] may run again where it may block.
    pub(crate) fn retryable(&self) -> bool {
        self.nowait && self.res == -(bindings::EAGAIN as isize)
    }

    /// What the I/O did: bytes moved, or the error.
    pub(crate) fn result(&self) -> Result<u64> {
        bytes_or_err(self.res)
    }

    /// Runs a READ the file system gave up after part of it went (see
    /// [`AsyncRw::retryable`]) again over the same pages, whole and blocking,
    /// in the calling context (a kernel worker), as the same I/O: with the
    /// submitter's I/O priority (the first issue's), and without the
    /// permission hooks (`rw_verify_area()` ran at the first issue, for this
    /// range, as the submitter) or the access event (the owner sends it, as
    /// for an asynchronous completion). The pages are let go of when it
    /// returns. `None` if the I/O is no such READ.
    pub(crate) fn rerun_read(&mut self) -> Option<Result<u64>> {
        if self.write || !self.retryable() {
            return None;
        }
        let pages = self.pages.take()?;
        let file = self.owner.file().as_ptr();
        let kiocb = Opaque::<bindings::kiocb>::uninit();
        let iter = Opaque::<bindings::iov_iter>::uninit();
        // SAFETY: the first issue initialised `self.kiocb`, and the I/O
        // ended: nobody else touches it any more. The new kiocb is ours to
        // initialise; the owner keeps the file referenced; `new` checked
        // that `pos` fits.
        unsafe {
            let ioprio = (*self.kiocb.get()).ki_ioprio;
            kiocb_init(kiocb.get(), file, self.pos as i64, None, false);
            (*kiocb.get()).ki_ioprio = ioprio;
        }
        // SAFETY: the segments live in `self`, which outlives the call below;
        // they point into `pages`, held until after it.
        unsafe { self.segs.iter(iter.get(), false) };
        // SAFETY: a synchronous kiocb of the open file, an iterator over
        // held pages; the file system is done with both when it returns.
        let r = unsafe { read_iter(file, kiocb.get(), iter.get()) };
        drop(pages);
        Some(bytes_or_err(r))
    }

    /// The owner.
    pub(crate) fn owner_mut(&mut self) -> &mut O {
        &mut self.owner
    }

    /// The owner, once the I/O ended.
    pub(crate) fn into_owner(self) -> O {
        self.owner
    }
}
