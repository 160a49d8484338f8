// SPDX-License-Identifier: GPL-2.0

//! Bios over pages a driver holds, submitted in batches that complete
//! together.
//!
//! C header: [`include/linux/bio.h`](srctree/include/linux/bio.h)
//!
//! - [`BioSet`]: the module's bio set (bios with a front pad that carries the
//!   bio's byte offset in its I/O; the per-CPU cache recycles small bios).
//! - [`Batch`]: the bios of one I/O into or out of one [`BioPages`] that the
//!   caller waits for: they exist only inside [`Batch::run`], which waits
//!   for all of them, so no bio outlives the batch or its pages.
//! - [`AsyncBatch`]: the bios of one I/O nobody waits for: the batch owns
//!   its pages, lets go of them in the last bio's completion and hands
//!   itself to its [`AsyncOwner`].
//! - [`rw_onstack`]: an I/O that fits one bio, on the stack, with no
//!   allocation at all.
//!
//! Completion runs in the bio's `bi_end_io` (any context) and touches only
//! atomics and a completion, until the last bio hands an [`AsyncBatch`] on.

use core::{
    cell::Cell,
    marker::{PhantomData, PhantomPinned},
    mem::offset_of,
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering},
};
use kernel::{
    bindings, error::to_result, ffi::c_void, page::BorrowedPage, prelude::*, types::Opaque,
};

use super::{blkdev::BlockDevice, box_cache::BoxCache};

/// Pages a bio may carry: a byte range held (pinned, or owned) for at least
/// as long as the value lives.
///
/// # Safety
///
/// Bios are built from what the methods return, unchecked: [`page_at`] and
/// [`vector`] give a page of the range and an offset below `PAGE_SIZE`,
/// and [`contiguous`] and [`vector`] a length of bytes that all lie in the
/// range's pages, held while the value lives, and that the block layer may
/// take as one vector.
///
/// [`page_at`]: BioPages::page_at
/// [`vector`]: BioPages::vector
/// [`contiguous`]: BioPages::contiguous
pub(crate) unsafe trait BioPages {
    /// Bytes of the range.
    fn len(&self) -> u64;

    /// Whether a device may write into the pages (pinned for writing, or
    /// the holder's own): a READ (device to memory) takes only such pages,
    /// whatever its caller checked (see [`Op::check`]).
    fn writable(&self) -> bool;

    /// The page holding byte `off` of the range and the offset of that byte
    /// in it; `None` if `off` is outside the range.
    fn page_at(&self, off: u64) -> Option<(BorrowedPage<'_>, u32)>;

    /// Bytes from `off`, at most `max`, that one bio vector may hold: pages
    /// the block layer takes as one multi-page vector (consecutive both as
    /// `struct page`s and physically, of one `dev_pagemap`). At least to
    /// the end of `off`'s page, never past the range's end; 0 if `off` is
    /// outside the range.
    fn contiguous(&self, off: u64, max: u64) -> u64 {
        self.page_at(off)
            .map_or(0, |(_, in_page)| to_page_end(self, off, in_page, max))
    }

    /// The bio vector at byte `off`, at most `max` bytes: its first page,
    /// the offset in it, and its length ([`BioPages::contiguous`]); `None`
    /// if `off` is outside the range or `max` is 0. One lookup of the page
    /// where [`BioPages::page_at`] and [`BioPages::contiguous`] take two.
    fn vector(&self, off: u64, max: u64) -> Option<(BorrowedPage<'_>, u32, u64)> {
        let n = self.contiguous(off, max);
        let (page, in_page) = self.page_at(off)?;
        (n > 0).then_some((page, in_page, n))
    }
}

/// Bytes from `off` (`in_page` bytes into its page) to the end of that
/// page or of `pages`, at most `max`: [`BioPages::contiguous`] of pages
/// that are not one run.
pub(crate) fn to_page_end<P: BioPages + ?Sized>(
    pages: &P,
    off: u64,
    in_page: u32,
    max: u64,
) -> u64 {
    (kernel::page::PAGE_SIZE as u64 - u64::from(in_page))
        .min(pages.len().saturating_sub(off))
        .min(max)
}

/// A bio of a [`Batch`] as the bio set allocates it: the front pad carries
/// the bio's byte offset in its I/O.
#[repr(C)]
struct PaddedBio {
    io_off: u64,
    bio: bindings::bio,
}

/// `BioSet` states.
const SET_UNUSED: u8 = 0;
const SET_BUSY: u8 = 1;
const SET_READY: u8 = 2;

/// The bio set the [`BioSet`] token owns.
struct SetSlot {
    set: Opaque<bindings::bio_set>,
    state: AtomicU8,
}

// SAFETY: the bio set is initialised and torn down by the one `BioSet`
// token (guarded by `state`); in between, `bio_alloc_bioset` may use it from
// any thread (it has its own locking).
unsafe impl Sync for SetSlot {}

static SET: SetSlot = SetSlot {
    set: Opaque::zeroed(),
    state: AtomicU8::new(SET_UNUSED),
};

/// Ownership of the module's bio set.
///
/// # Invariants
///
/// While the token lives, `SET.set` is an initialised bio set and
/// `SET.state` is `SET_READY`; at most one token exists.
pub(crate) struct BioSet(());

impl BioSet {
    /// Sets the bio set up (`EBUSY` if a token already exists).
    pub(crate) fn new() -> Result<Self> {
        SET.state
            .compare_exchange(SET_UNUSED, SET_BUSY, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| EBUSY)?;
        // SAFETY: `state` went from unused to busy here, so nothing else uses
        // the slot. A pool of 64 bios keeps I/O going under memory pressure.
        let r = to_result(unsafe {
            bindings::bioset_init(
                SET.set.get(),
                64,
                offset_of!(PaddedBio, bio) as u32,
                (bindings::BIOSET_NEED_BVECS | bindings::BIOSET_PERCPU_CACHE) as i32,
            )
        });
        if let Err(e) = r {
            SET.state.store(SET_UNUSED, Ordering::Release);
            return Err(e);
        }
        SET.state.store(SET_READY, Ordering::Release);
        // INVARIANT: initialised and ready; the only token.
        Ok(Self(()))
    }
}

impl Drop for BioSet {
    fn drop(&mut self) {
        SET.state.store(SET_BUSY, Ordering::Release);
        // SAFETY: the set is initialised (type invariant). No bio of it is in
        // flight: a `Batch` waits for its bios, and an `AsyncBatch`'s owner
        // holds what keeps the module loaded until its completion ran (the
        // io_uring request holds its /dev/p2pdirect file); the token is
        // dropped only after every user of the set is gone.
        unsafe { bindings::bioset_exit(SET.set.get()) };
        SET.state.store(SET_UNUSED, Ordering::Release);
    }
}

/// Which way a bio moves data, and how a write must land.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Op {
    /// Device to memory.
    Read,
    /// Memory to device.
    Write,
    /// Memory to device, complete only once on stable media (`REQ_FUA`),
    /// as the block layer's direct writes of an `O_DSYNC` file are.
    WriteFua,
}

impl Op {
    /// A READ or a WRITE, the latter durable when `dsync`.
    pub(crate) fn new(write: bool, dsync: bool) -> Self {
        match (write, dsync) {
            (false, _) => Op::Read,
            (true, false) => Op::Write,
            (true, true) => Op::WriteFua,
        }
    }

    /// `EFAULT` if the I/O would have the device write into `pages` that
    /// were not pinned for writing (a read-only or copy-on-write shared
    /// page, whose other users would see the data). Every way of building
    /// a bio or a file's I/O here checks it (DMA mappings for kernel
    /// consumers are bidirectional, as the RDMA core's own are: see
    /// `DmaMapping`).
    pub(crate) fn check<P: BioPages + ?Sized>(self, pages: &P) -> Result {
        if matches!(self, Op::Read) && !pages.writable() {
            return Err(EFAULT);
        }
        Ok(())
    }
}

/// `bi_opf` of a READ or WRITE the caller waits for (`dio_bio_write_op()`'s
/// flags for a write).
fn opf(op: Op) -> bindings::blk_opf_t {
    let sync = 1 << bindings::req_flag_bits___REQ_SYNC;
    let write = bindings::req_op_REQ_OP_WRITE | sync | 1 << bindings::req_flag_bits___REQ_IDLE;
    match op {
        Op::Read => bindings::req_op_REQ_OP_READ | sync,
        Op::Write => write,
        Op::WriteFua => write | 1 << bindings::req_flag_bits___REQ_FUA,
    }
}

/// Adds the vector at byte `off` of `pages` ([`BioPages::vector`], at most
/// `max` bytes) to `bio`; the bytes added, `None` if none could be (`off`
/// outside the range, `max` 0, or the bio full).
///
/// # Safety
///
/// `bio` is a valid bio the caller owns and has not submitted.
unsafe fn add_vector<P: BioPages>(
    bio: *mut bindings::bio,
    pages: &P,
    off: u64,
    max: u32,
) -> Option<u32> {
    let (page, in_page, n) = pages.vector(off, u64::from(max))?;
    // At most `max`, so it fits a `u32`.
    let n = n as u32;
    // SAFETY: `bio` is valid and unsubmitted (caller); the page is valid while
    // `pages` lives, which the caller's batch (or on-stack bio) outlives.
    let added = unsafe { bindings::bio_add_page(bio, page.as_ptr(), n, in_page) };
    (added == n as i32).then_some(n)
}

/// Adds bytes `[off, off + len)` of `pages` (one vector's worth) to `bio`;
/// `false` if they are not one vector's worth of the range
/// ([`BioPages::contiguous`]) or the bio is full.
///
/// # Safety
///
/// `bio` is a valid bio the caller owns and has not submitted.
unsafe fn add_range<P: BioPages>(bio: *mut bindings::bio, pages: &P, off: u64, len: u32) -> bool {
    let Some((page, in_page, n)) = pages.vector(off, u64::from(len)) else {
        return false;
    };
    // SAFETY: `bio` is valid and unsubmitted (caller); the page is valid while
    // `pages` lives, which the caller's batch (or on-stack bio) outlives.
    n == u64::from(len)
        && unsafe { bindings::bio_add_page(bio, page.as_ptr(), len, in_page) == len as i32 }
}

/// The bio's starting sector for byte `pos`.
fn sector(pos: u64) -> bindings::sector_t {
    pos >> bindings::SECTOR_SHIFT
}

/// Moves `len` bytes at byte `pos` of `bdev` from or into `pages` at `off`
/// with one bio on the stack (no allocation), if the pages fit its eight
/// segments. `Ok(false)` if they do not: nothing was done.
pub(crate) fn rw_onstack<P: BioPages>(
    bdev: &BlockDevice,
    pages: &P,
    off: u64,
    len: u32,
    pos: u64,
    op: Op,
) -> Result<bool> {
    const VECS: usize = 8;
    op.check(pages)?;
    if off
        .checked_add(u64::from(len))
        .is_none_or(|e| e > pages.len())
    {
        return Err(EINVAL);
    }
    let mut vecs = [const { core::mem::MaybeUninit::<bindings::bio_vec>::uninit() }; VECS];
    let mut bio = core::mem::MaybeUninit::<bindings::bio>::uninit();
    let bio = bio.as_mut_ptr();
    // SAFETY: `bio` and `vecs` are ours, on the stack, and live until
    // `bio_uninit` below; `bio_init` initialises the bio for `VECS` vectors.
    unsafe {
        bindings::bio_init(
            bio,
            bdev.as_raw(),
            vecs.as_mut_ptr().cast(),
            VECS as u16,
            opf(op),
        );
        (*bio).bi_iter.bi_sector = sector(pos);
    }
    let mut done = 0u32;
    while done < len {
        // SAFETY: the bio is initialised, ours and unsubmitted.
        let Some(n) = (unsafe { add_vector(bio, pages, off + u64::from(done), len - done) }) else {
            // SAFETY: initialised above, never submitted.
            unsafe { bindings::bio_uninit(bio) };
            return Ok(false);
        };
        done += n;
    }
    // SAFETY: the bio is complete; `submit_bio_wait` returns after its
    // completion, so the stack it lives on and the pages outlive it.
    let r = unsafe { bindings::submit_bio_wait(bio) };
    // SAFETY: completed; released once.
    unsafe { bindings::bio_uninit(bio) };
    to_result(r)?;
    Ok(true)
}

/// Runs `f` with the calling task's block I/O held in a plug, as the block
/// layer's own multi-bio direct I/O does: the requests of the bios `f`
/// submits reach the driver together when it returns (on NVMe, one doorbell
/// write for all of them instead of one each). Inside a plug the task holds
/// already (io_uring plugs a batch of submissions), that one holds them. A
/// task that sleeps in `f` sends what the plug holds first (the scheduler
/// flushes it), so waiting inside `f` cannot deadlock; `f` must not
/// busy-poll for its own bios, which the plug may still hold.
pub(crate) fn plugged<R>(f: impl FnOnce() -> R) -> R {
    let mut plug = core::mem::MaybeUninit::<bindings::blk_plug>::uninit();
    // SAFETY: `plug` stays at this address on this stack frame until
    // `blk_finish_plug` below, in the same task. `blk_start_plug` initialises
    // it unless the task has a plug already, in which case it is left alone
    // and `blk_finish_plug` only compares its address with the task's plug.
    unsafe { bindings::blk_start_plug(plug.as_mut_ptr()) };
    let r = f();
    // SAFETY: started above; finished once, by the task that started it.
    unsafe { bindings::blk_finish_plug(plug.as_mut_ptr()) };
    r
}

/// No bio of the batch failed.
const NO_ERROR: u64 = u64::MAX;

/// What the bios of a batch share: in-flight count and first error.
///
/// # Invariants
///
/// - `pending` counts the submitted bios that have not completed, plus one
///   for the submitter until it gives that up.
/// - `first_error` is `NO_ERROR` or the lowest failed bio's I/O offset
///   shifted left by 12, or-ed with its errno.
struct Core {
    pending: AtomicU32,
    first_error: AtomicU64,
}

impl Core {
    const fn new() -> Self {
        Self {
            pending: AtomicU32::new(1),
            first_error: AtomicU64::new(NO_ERROR),
        }
    }

    /// Records a bio's status; returns whether it was the last one pending.
    fn bio_done(&self, status: bindings::blk_status_t, io_off: u64) -> bool {
        if status != 0 {
            // SAFETY: converts a status code; no pointer involved.
            let errno = -unsafe { bindings::blk_status_to_errno(status) };
            let code = io_off << 12 | u64::from(errno.clamp(1, 4095) as u32);
            self.first_error.fetch_min(code, Ordering::Relaxed);
        }
        self.put()
    }

    /// Drops one pending count; true if it was the last.
    fn put(&self) -> bool {
        self.pending.fetch_sub(1, Ordering::AcqRel) == 1
    }

    fn result(&self) -> core::result::Result<(), (Error, u64)> {
        let code = self.first_error.load(Ordering::Acquire);
        if code == NO_ERROR {
            return Ok(());
        }
        Err((Error::from_errno(-((code & 0xfff) as i32)), code >> 12))
    }
}

/// An unsubmitted bio of the batch `'b`.
///
/// # Invariants
///
/// `bio` is a bio of [`SET`], owned here until submitted, whose `bi_private`
/// is the batch that allocated it.
pub(crate) struct Bio<'b> {
    bio: NonNull<bindings::bio>,
    _batch: PhantomData<&'b ()>,
}

impl Drop for Bio<'_> {
    fn drop(&mut self) {
        // SAFETY: an unsubmitted bio we own.
        unsafe { bindings::bio_put(self.bio.as_ptr()) };
    }
}

/// A bio of the set for the batch at `private`.
fn alloc_bio<'b>(
    bdev: &BlockDevice,
    op: Op,
    pos: u64,
    nr_vecs: u16,
    private: *const c_void,
) -> Result<Bio<'b>> {
    if SET.state.load(Ordering::Acquire) != SET_READY {
        return Err(ENODEV);
    }
    // More vectors than a bio can have is a `BUG()` in the block layer.
    if u32::from(nr_vecs) > bindings::BIO_MAX_VECS {
        return Err(EINVAL);
    }
    // SAFETY: the set is ready (checked; it stays so while the module's
    // files exist, see `BioSet`); the block device is open.
    let bio = unsafe {
        bindings::bio_alloc_bioset(
            bdev.as_raw(),
            nr_vecs,
            opf(op),
            bindings::GFP_KERNEL,
            SET.set.get(),
        )
    };
    let bio = NonNull::new(bio).ok_or(ENOMEM)?;
    // SAFETY: a fresh bio we own.
    unsafe {
        (*bio.as_ptr()).bi_iter.bi_sector = sector(pos);
        (*bio.as_ptr()).bi_private = private.cast_mut();
    }
    // INVARIANT: ours, of `SET`, pointing to its batch.
    Ok(Bio {
        bio,
        _batch: PhantomData,
    })
}

/// Whether `bio` belongs to the batch at `private`.
fn owned_by(bio: &Bio<'_>, private: *const c_void) -> bool {
    // SAFETY: the bio is valid (type invariant); reading a field.
    core::ptr::eq(unsafe { (*bio.bio.as_ptr()).bi_private }, private)
}

/// Submits `bio` of the batch with `core`, starting at `io_off` of the I/O.
///
/// # Safety
///
/// `bio` belongs to the batch whose [`Core`] is `core`, and `end_io` is that
/// batch's completion, which calls [`Core::bio_done`] on it. The batch and
/// the bio's pages stay valid until then.
unsafe fn submit_bio(
    core: &Core,
    bio: Bio<'_>,
    io_off: u64,
    end_io: unsafe extern "C" fn(*mut bindings::bio),
) {
    let raw = bio.bio.as_ptr();
    core::mem::forget(bio);
    // SAFETY: `raw` is a bio of `SET`, so the front pad precedes it.
    let padded = unsafe { raw.byte_sub(offset_of!(PaddedBio, bio)).cast::<PaddedBio>() };
    core.pending.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the bio is ours and complete; its pages and batch outlive it
    // (the caller's promise); `end_io` finds the batch through `bi_private`.
    unsafe {
        (*padded).io_off = io_off;
        (*raw).bi_end_io = Some(end_io);
        bindings::submit_bio(raw);
    }
}

/// The batch pointer, status and I/O offset of a completed bio, which it
/// gives back.
///
/// # Safety
///
/// `bio` is a completed bio of `SET` submitted through [`submit_bio`].
unsafe fn end_bio<T>(bio: *mut bindings::bio) -> (*const T, bindings::blk_status_t, u64) {
    // SAFETY: a bio of `SET`: the front pad precedes it; completed, so ours
    // to read and give back.
    unsafe {
        let padded = bio.byte_sub(offset_of!(PaddedBio, bio)).cast::<PaddedBio>();
        let r = (
            (*bio).bi_private.cast_const().cast::<T>(),
            (*bio).bi_status,
            (*padded).io_off,
        );
        bindings::bio_put(bio);
        r
    }
}

/// Building the bios of a batch: [`Batch`] or an [`AsyncBatch`]'s
/// [`Submitter`].
pub(crate) trait BuildBios {
    /// A bio for up to `nr_vecs` pages at byte `pos` of the block device.
    fn bio(&self, pos: u64, nr_vecs: u16) -> Result<Bio<'_>>;

    /// Adds bytes `[off, off + len)` of the batch's pages (one vector's
    /// worth, [`BioPages::contiguous`]) to `bio`; `false` if the bio is
    /// full, not the batch's, or the range is not one vector's worth.
    fn add(&self, bio: &mut Bio<'_>, off: u64, len: u32) -> bool;

    /// Submits `bio`, which starts at byte `io_off` of the I/O. A bio of
    /// another batch is put, not submitted (`EINVAL`).
    fn submit(&self, bio: Bio<'_>, io_off: u64) -> Result;
}

/// The bios of one I/O between a block device and one [`BioPages`] that
/// the caller waits for: see [`Batch::run`].
///
/// # Invariants
///
/// - Every bio submitted through the batch points (`bi_private`) to it and
///   carries only pages of `pages`; the batch waits for all of them before
///   it goes, so neither it nor the pages go while a bio uses them. It only
///   exists pinned on the stack of [`Batch::run`], which waits for it.
/// - No bio is allocated or submitted once `waited` is set.
/// - `done` is completed when `core.pending` reaches zero.
#[pin_data]
pub(crate) struct Batch<'a, P: BioPages> {
    bdev: &'a BlockDevice,
    pages: &'a P,
    op: Op,
    core: Core,
    waited: Cell<bool>,
    #[pin]
    done: Opaque<bindings::completion>,
    #[pin]
    _pin: PhantomPinned,
}

impl<'a, P: BioPages> Batch<'a, P> {
    /// Runs `build` with a batch of bios between `bdev` and `pages`, one
    /// way, then waits for every bio it submitted. Returns what `build`
    /// returned and `Ok` if all bios succeeded, else the error of the failed
    /// bio that starts first in the I/O, and that start.
    pub(crate) fn run<R>(
        bdev: &'a BlockDevice,
        pages: &'a P,
        op: Op,
        build: impl FnOnce(&Batch<'a, P>) -> R,
    ) -> (R, core::result::Result<(), (Error, u64)>) {
        let init = pin_init!(Self {
            bdev,
            pages,
            op,
            core: Core::new(),
            waited: Cell::new(false),
            done <- Opaque::ffi_init(|slot: *mut bindings::completion| {
                // SAFETY: `slot` is valid for a `struct completion`.
                unsafe { bindings::init_completion(slot) };
            }),
            _pin: PhantomPinned,
        });
        pin_init::stack_pin_init!(let batch = init);
        let r = build(&batch);
        batch.wait_all();
        (r, batch.core.result())
    }

    fn private(&self) -> *const c_void {
        core::ptr::from_ref(self).cast()
    }

    /// `bi_end_io` of the batch's bios (any context).
    ///
    /// # Safety
    ///
    /// `bio` is a bio submitted through [`Batch::submit`].
    unsafe extern "C" fn end_io(bio: *mut bindings::bio) {
        // SAFETY: submitted through `submit`.
        let (batch, status, io_off) = unsafe { end_bio::<Self>(bio) };
        // SAFETY: `run` waits for the batch's bios, so it is alive; only its
        // `core` and `done` are used, through the raw pointer.
        unsafe {
            if (*batch).core.bio_done(status, io_off) {
                // The last access of a bio's completion to the batch.
                bindings::complete((*batch).done.get());
            }
        }
    }

    /// Waits for every submitted bio (once); no bio is submitted after.
    fn wait_all(&self) {
        if self.waited.replace(true) {
            return;
        }
        if !self.core.put() {
            // SAFETY: the completion is initialised; the last bio completes
            // it once, after which none touches the batch.
            unsafe { bindings::wait_for_completion_io(self.done.get()) };
        }
    }
}

impl<P: BioPages> BuildBios for Batch<'_, P> {
    fn bio(&self, pos: u64, nr_vecs: u16) -> Result<Bio<'_>> {
        if self.waited.get() {
            return Err(EINVAL);
        }
        self.op.check(self.pages)?;
        alloc_bio(self.bdev, self.op, pos, nr_vecs, self.private())
    }

    fn add(&self, bio: &mut Bio<'_>, off: u64, len: u32) -> bool {
        // SAFETY: an unsubmitted bio we own (type invariant), of this batch.
        owned_by(bio, self.private())
            && unsafe { add_range(bio.bio.as_ptr(), self.pages, off, len) }
    }

    fn submit(&self, bio: Bio<'_>, io_off: u64) -> Result {
        if self.waited.get() || !owned_by(&bio, self.private()) {
            return Err(EINVAL);
        }
        // SAFETY: the bio is this batch's; `end_io` is its completion; `run`
        // waits for the batch's bios before it or its pages go.
        unsafe { submit_bio(&self.core, bio, io_off, Self::end_io) };
        Ok(())
    }
}

/// Values that may be dropped in any context, hard interrupts included.
///
/// # Safety
///
/// The type's `Drop` (and its fields') never sleeps and takes no lock that
/// is not interrupt-safe.
pub(crate) unsafe trait DropInAnyContext {}

/// The owner of an [`AsyncBatch`]: holds the block device open, and learns
/// of the batch's end. The batch lets go of its pages in its last bio's
/// completion, so that nothing waiting for them (a device's removal) waits
/// for the owner's own end.
pub(crate) trait AsyncOwner: Send + Sized + 'static {
    /// The pages the bios carry.
    type Pages: BioPages + DropInAnyContext + Send;
    /// What building the bios found (see [`AsyncBatch::launch`]).
    type Built: Send;

    /// The block device (open for as long as the owner lives).
    fn bdev(&self) -> &BlockDevice;

    /// The batch's last bio completed (or none was in flight when it
    /// started), and its pages are gone: called once, in any context
    /// (interrupts included), so it may not sleep. [`AsyncBatch::result`]
    /// tells how it went.
    fn completed(batch: KBox<AsyncBatch<Self>>);
}

/// The bios of one I/O that nobody waits for: the batch owns its pages and
/// hands itself to [`AsyncOwner::completed`] when the bios are done.
///
/// # Invariants
///
/// - Every bio submitted through the batch points (`bi_private`) to it and
///   carries only pages of `pages`, which is `Some` until the last bio
///   completed. Bios are submitted only inside [`AsyncBatch::launch`], which
///   holds the batch until it gives it to them: from then on the bios in
///   flight own it, and the last one to complete hands it on.
/// - `built` is written by `launch` only, before it gives its count up.
pub(crate) struct AsyncBatch<O: AsyncOwner> {
    owner: O,
    pages: Option<O::Pages>,
    built: Option<O::Built>,
    op: Op,
    core: Core,
}

impl<O: AsyncOwner> AsyncBatch<O> {
    /// A batch for `owner`'s block device and `pages`, one way, in a box
    /// from `cache` (see [`BoxCache::alloc`]); a new box is charged to the
    /// submitting task's memory cgroup.
    pub(crate) fn new(
        owner: O,
        pages: O::Pages,
        op: Op,
        cache: &BoxCache<Self>,
    ) -> Result<KBox<Self>> {
        op.check(&pages)?;
        Ok(cache.alloc(
            Self {
                owner,
                pages: Some(pages),
                built: None,
                op,
                core: Core::new(),
            },
            GFP_KERNEL_ACCOUNT,
        )?)
    }

    /// The owner.
    pub(crate) fn owner_mut(&mut self) -> &mut O {
        &mut self.owner
    }

    /// The owner and what building the bios found, once the batch
    /// completed.
    pub(crate) fn into_parts(self) -> (O, Option<O::Built>) {
        (self.owner, self.built)
    }

    /// Builds and submits the batch's bios with `build`, keeps what it
    /// returned for the completion ([`AsyncBatch::into_parts`]), then hands
    /// the batch to the bios: the last to complete (or this call, if none is
    /// in flight) drops the pages and calls [`AsyncOwner::completed`].
    pub(crate) fn launch(batch: KBox<Self>, build: impl FnOnce(&Submitter<'_, O>) -> O::Built) {
        let raw = KBox::into_raw(batch);
        // SAFETY: `raw` came from `into_raw` and holds the submitter's count,
        // so the batch lives until `put` below.
        let raw = unsafe { NonNull::new_unchecked(raw) };
        let built = build(&Submitter {
            batch: raw,
            _life: PhantomData,
        });
        // SAFETY: as above; bios in flight reach the batch only through
        // `core` (and `end_io` touches the rest only after the last count,
        // ours, went), so this write races with nothing.
        unsafe { (*raw.as_ptr()).built = Some(built) };
        // SAFETY: as above.
        if unsafe { (*raw.as_ptr()).core.put() } {
            // SAFETY: nothing is in flight: the batch is ours again.
            Self::finish(unsafe { KBox::from_raw(raw.as_ptr()) });
        }
    }

    /// The last count went: the pages go, the owner learns of it.
    fn finish(mut batch: KBox<Self>) {
        drop(batch.pages.take());
        O::completed(batch);
    }

    /// `Ok` if every bio succeeded, else the error of the failed bio that
    /// starts first in the I/O, and that start.
    pub(crate) fn result(&self) -> core::result::Result<(), (Error, u64)> {
        self.core.result()
    }

    /// `bi_end_io` of the batch's bios (any context).
    ///
    /// # Safety
    ///
    /// `bio` is a bio submitted through [`Submitter::submit`].
    unsafe extern "C" fn end_io(bio: *mut bindings::bio) {
        // SAFETY: submitted through `submit`.
        let (batch, status, io_off) = unsafe { end_bio::<Self>(bio) };
        // SAFETY: the batch lives while a bio of it is pending; `bi_private`
        // is the pointer `KBox::into_raw` gave `launch`.
        if unsafe { (*batch).core.bio_done(status, io_off) } {
            // SAFETY: the last pending count: `launch` gave the box up (its
            // own count went first), so the box is ours to hand on.
            Self::finish(unsafe { KBox::from_raw(batch.cast_mut()) });
        }
    }
}

/// Builds the bios of an [`AsyncBatch`] inside [`AsyncBatch::launch`].
///
/// # Invariants
///
/// `batch` is the batch `launch` holds (with its count) for `'b`.
pub(crate) struct Submitter<'b, O: AsyncOwner> {
    batch: NonNull<AsyncBatch<O>>,
    _life: PhantomData<&'b AsyncBatch<O>>,
}

impl<O: AsyncOwner> Submitter<'_, O> {
    fn private(&self) -> *const c_void {
        self.batch.as_ptr().cast_const().cast()
    }

    fn get(&self) -> &AsyncBatch<O> {
        // SAFETY: alive and not mutated for `'b` (type invariant).
        unsafe { self.batch.as_ref() }
    }

    /// The batch's owner.
    pub(crate) fn owner(&self) -> &O {
        &self.get().owner
    }

    /// The batch's pages.
    pub(crate) fn pages(&self) -> Option<&O::Pages> {
        self.get().pages.as_ref()
    }
}

impl<O: AsyncOwner> BuildBios for Submitter<'_, O> {
    fn bio(&self, pos: u64, nr_vecs: u16) -> Result<Bio<'_>> {
        let b = self.get();
        alloc_bio(b.owner.bdev(), b.op, pos, nr_vecs, self.private())
    }

    fn add(&self, bio: &mut Bio<'_>, off: u64, len: u32) -> bool {
        let Some(pages) = self.pages() else {
            return false;
        };
        // SAFETY: an unsubmitted bio we own (type invariant), of this batch.
        owned_by(bio, self.private()) && unsafe { add_range(bio.bio.as_ptr(), pages, off, len) }
    }

    fn submit(&self, bio: Bio<'_>, io_off: u64) -> Result {
        if !owned_by(&bio, self.private()) {
            return Err(EINVAL);
        }
        // SAFETY: the bio is this batch's and `end_io` its completion; the
        // batch (and its pages) live until its last bio completed: `launch`
        // holds the box until it gives it to the bios.
        unsafe { submit_bio(&self.get().core, bio, io_off, AsyncBatch::<O>::end_io) };
        Ok(())
    }
}
