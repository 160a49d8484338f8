// SPDX-License-Identifier: GPL-2.0

//! Direct storage I/O (nvidia-fs's part): READ and WRITE between a raw NVMe
//! namespace or an O_DIRECT file on it and device memory, with no CPU copy.
//!
//! - Raw block devices: the engine builds the bios itself: allocated on the
//!   namespace's block device, the device memory's P2PDMA pages added page
//!   by page, each bio sized by the queue limits (max bytes, max segments,
//!   logical block size), all submitted, then waited for together. An I/O
//!   that fits one bio uses one on-stack bio instead (no allocation).
//! - Regular files: an O_DIRECT kiocb over the pages' kernel addresses runs
//!   through the file's `read_iter`/`write_iter`, so the file system maps the
//!   blocks and builds the bios. Holes and unwritten extents read as zeros
//!   that the file system writes with the CPU: counted as `zeroed`.
//! - Reachability: before any I/O, the block device's DMA device must reach
//!   every provider of the memory (P2P distance). If not, `EREMOTEIO`, or
//!   with `P2PDIRECT_IO_COMPAT` a bounce through host memory, counted as
//!   `bounced`.
//!
//! Memory is resolved through the peer-memory registry (a device pointer) or
//! a registration of the calling file. Either way the I/O holds its own
//! reference on the pinned pages until its bios completed, so a FREE racing
//! with it revokes the mapping at once but the memory is reused only after
//! the I/O let go (devmem's graveyard, reaped when the I/O ends).
//!
//! No lock is held across the I/O.
//!
//! io_uring (`submit_uring`): the same checks and accounting, and the
//! transfer runs asynchronously: on a raw block device an `AsyncBatch` owns
//! what the bios use, and the last bio's completion hands it to task work
//! that finishes the I/O and posts the CQE; on a file an asynchronous
//! kiocb (`AsyncRw`) does the same from `ki_complete`. The COMPAT bounce
//! runs as above, in io_uring's worker.

use crate::{
    error::{ecanceled, eopnotsupp, eremoteio, estale, refuse, stack_limit},
    ffi::{self, DmaLeg, IoFile, Limits, Pages, PciFunction},
    peer_mem::{self, UserRange},
    registration::RegEntry,
    stats::{Bdf, IoRecord, Key, Pinned},
    sys::{
        bio::{self, AsyncBatch, AsyncOwner, Batch, BioPages, BuildBios},
        blkdev::{BlockDevice, DmaDevices},
        box_cache::{self, BoxCache},
        fs::{AsyncRw, AsyncRwOwner, Issued},
        pci_p2pdma::LocatedPci,
        uapi,
        uring_cmd::{PendingCmd, TaskWork, UringCmd},
        work,
    },
};
use core::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use kernel::{
    fs::File,
    page::PAGE_SIZE,
    pci,
    prelude::*,
    sync::{aref::ARef, new_spinlock, Arc, SetOnce, SpinLock},
    time::{Instant, Monotonic},
};

/// Vectors per bio of the general path (the bio set's inline vectors, so
/// that the per-CPU bio cache serves it).
const BIO_VECS: u64 = 4;

/// `MAX_RW_COUNT`: the most one read(2) or write(2) moves (`INT_MAX`
/// rounded down to a page).
const MAX_RW_COUNT: u64 = (i32::MAX as u64) & !(PAGE_SIZE as u64 - 1);

/// Size of the COMPAT bounce buffer (host memory), per I/O.
const BOUNCE_CHUNK: u64 = 1 << 20;

/// One READ or WRITE as the caller asked for it.
pub(crate) struct Request {
    pub(crate) fd: i32,
    pub(crate) flags: u32,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) file_offset: u64,
    pub(crate) buf_offset: u64,
    /// WRITE (memory -> storage); else READ (storage -> memory).
    pub(crate) write: bool,
}

/// What an I/O did.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Done {
    pub(crate) bytes: u64,
    pub(crate) p2p: u64,
    pub(crate) bounced: u64,
    pub(crate) zeroed: u64,
    pub(crate) dma_pci: u32,
}

fn op_name(write: bool) -> &'static str {
    if write {
        "WRITE"
    } else {
        "READ"
    }
}

/// The memory side of an I/O: pinned pages and where the I/O starts in them.
struct Memory {
    pages: Pages,
    offset: u64,
}

/// What an I/O needs of the `/dev/p2pdirect` file it comes through: its
/// registrations, its hint of the target's DMA device and its io_uring
/// slots. The file implements it; storage knows nothing else of it.
pub(crate) trait IoOwner {
    /// The pinned pages of the file's registration `id` (`ENOENT` if there
    /// is none), if `check` accepts it. `check` runs in an RCU read section
    /// (atomic context): it must not sleep.
    fn registration_pages(&self, id: u64, check: &dyn Fn(&RegEntry) -> Result) -> Result<Pages>;
    /// The file's hints of the DMA devices of its I/O targets.
    fn dma_hints(&self) -> &DmaHints;
    /// What the file shares with its io_uring commands in flight.
    fn uring(&self) -> &Arc<UringShared>;
}

/// Spare batches a file keeps for its io_uring commands (see
/// [`UringShared`]).
const URING_SPARE_BATCHES: usize = 64;

/// What a `/dev/p2pdirect` file shares with its io_uring commands in
/// flight: their count, and the memory of the state of up to
/// `URING_SPARE_BATCHES` finished raw-namespace commands, which the next
/// ones reuse instead of allocating (a command's state is a few hundred
/// bytes; the memory goes when the file does).
#[pin_data]
pub(crate) struct UringShared {
    inflight: AtomicU32,
    #[pin]
    batches: BoxCache<AsyncBatch<UringIo>>,
}

impl UringShared {
    /// No command in flight, no spare memory.
    pub(crate) fn new() -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            inflight: AtomicU32::new(0),
            batches <- BoxCache::new(URING_SPARE_BATCHES, GFP_KERNEL_ACCOUNT),
        }? Error)
    }
}

/// A place among the io_uring commands a file may have in flight
/// (`P2PDIRECT_URING_MAX_INFLIGHT`), held until the command completes. The
/// count is a core atomic: it is taken and given back once per command, and
/// the kernel crate's `Atomic` is an out-of-line call per operation in these
/// kernels.
pub(crate) struct UringSlot(Arc<UringShared>);

impl UringSlot {
    /// Takes a place; `EBUSY` if all are taken.
    fn take(shared: &Arc<UringShared>) -> Result<Self> {
        let max = uapi::P2PDIRECT_URING_MAX_INFLIGHT;
        let count = &shared.inflight;
        let mut n = count.load(Relaxed);
        loop {
            if n >= max {
                return Err(EBUSY);
            }
            match count.compare_exchange(n, n + 1, Acquire, Relaxed) {
                Ok(_) => return Ok(Self(shared.clone())),
                Err(now) => n = now,
            }
        }
    }
}

impl Drop for UringSlot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Release);
    }
}

/// The statistics rows an I/O counts in, as far as it got to learn them.
#[derive(Default, Clone)]
struct Keys {
    provider: Option<u32>,
    block: Option<u32>,
}

/// Runs one READ or WRITE for the file `me`, and counts it.
pub(crate) fn run(me: &dyn IoOwner, req: &Request) -> Result<Done> {
    let start = Instant::<Monotonic>::now();
    let mut keys = Keys::default();
    let r = plan(me, req, &mut keys).and_then(|p| match p {
        Planned::Done(d) => Ok(d),
        Planned::Direct(d) => d.run(),
    });
    record(req.write, &keys, &r, start);
    r
}

/// `res` and `big_cqe[0]` of an io_uring READ or WRITE (see the UAPI
/// header). One I/O moves less than `MAX_RW_COUNT` bytes, so every count
/// fits 32 bits.
fn cqe(r: &Result<Done>) -> (i32, u64) {
    match r {
        Ok(d) => (
            i32::try_from(d.bytes).unwrap_or(i32::MAX),
            (d.p2p & 0xffff_ffff) | (d.bounced & 0xffff_ffff) << 32,
        ),
        Err(e) => (e.to_errno(), 0),
    }
}

/// An io_uring READ or WRITE (`P2PDIRECT_URING_CMD_*`), with the checks and
/// the accounting of the ioctls. A device-to-device transfer runs
/// asynchronously: its bios (raw block device) or its kiocb (file) are
/// submitted here and their completion posts the CQE (through task work,
/// in the submitter's task). The COMPAT bounce runs synchronously in
/// io_uring's worker; what the checks finish at once is posted at once.
pub(crate) fn submit_uring(me: &dyn IoOwner, req: &Request, cmd: &mut UringCmd) -> Result<i32> {
    // The argument's flags come before the command's own checks, the
    // in-flight limit among them.
    if let Err(e) = check_args(req) {
        let start = Instant::<Monotonic>::now();
        return post_now(cmd, req.write, &Keys::default(), Err(e), start);
    }
    // io_uring's worker issues (COMPAT, file WRITEs, IOSQE_ASYNC) of a
    // process being killed: its exit lets the workers run what they queued
    // while the ring lives (only unbound work is cancelled), for a process
    // that waits for nothing. Nothing is started for them; the one a worker
    // is running goes on (a COMPAT bounce stops at its next chunk).
    if !cmd.nonblock() && crate::sys::resched() {
        let start = Instant::<Monotonic>::now();
        return post_now(cmd, req.write, &Keys::default(), Err(ecanceled()), start);
    }
    let slot = UringSlot::take(me.uring()).inspect_err(|_| {
        if crate::sys::ratelimit::allow() {
            pr_info!(
                "{}: {} io_uring commands of this /dev/p2pdirect file are in flight already\n",
                op_name(req.write),
                uapi::P2PDIRECT_URING_MAX_INFLIGHT
            );
        }
    })?;
    // COMPAT and file WRITEs are issued by io_uring's worker (see
    // `submit_file`): sent there before any work is done.
    let to_worker = req.flags & uapi::P2PDIRECT_IO_COMPAT != 0
        || (req.write && IoFile::from_fd(req.fd, true).is_ok_and(|f| !f.is_bdev()));
    if cmd.nonblock() && to_worker {
        return Err(EAGAIN);
    }
    if req.flags & uapi::P2PDIRECT_IO_COMPAT != 0 {
        let pending = cmd.queue().ok_or(EINVAL)?;
        let (res, res2) = cqe(&run(me, req));
        pending.complete_with(res, res2);
        return Ok(0);
    }
    let start = Instant::<Monotonic>::now();
    let mut keys = Keys::default();
    let d = match plan(me, req, &mut keys) {
        Ok(Planned::Direct(d)) => d,
        Ok(Planned::Done(done)) => return post_now(cmd, req.write, &keys, Ok(done), start),
        Err(e) => return post_now(cmd, req.write, &keys, Err(e), start),
    };
    if !d.file.is_bdev() {
        return submit_file(d, keys, start, slot, cmd);
    }
    // The cache work of `bdev_io` (write back dirty pages; a WRITE drops
    // cached ones): where that may wait, the command goes to io_uring's
    // worker.
    if cmd.nonblock() && d.file.bdev_cache_busy(d.pos, d.len, d.write) {
        return Err(EAGAIN);
    }
    if let Err(e) = d.file.bdev_sync(d.pos, d.len) {
        drop(d);
        // Never EAGAIN from the worker: io_uring would issue it again.
        let e = if e == EAGAIN { EIO } else { e };
        record(req.write, &keys, &Err(e), start);
        return Err(e);
    }
    if d.write {
        d.file.bdev_invalidate(d.pos, d.len);
    }
    let write = d.write;
    let op = d.file.bio_op(write);
    let (io, pages) = UringIo::new(d, &keys, start, slot);
    let mut batch = match AsyncBatch::new(io, pages, op, &me.uring().batches) {
        Ok(b) => b,
        Err(e) => {
            record(write, &keys, &Err(e), start);
            return Err(e);
        }
    };
    let Some(pending) = cmd.queue() else {
        return Err(EINVAL);
    };
    batch.owner_mut().cmd = Some(pending);
    AsyncBatch::launch(batch, |s| {
        let (io, Some(pages)) = (s.owner(), s.pages()) else {
            return (0, Some(EINVAL));
        };
        let span = Span {
            pages,
            off: io.off,
            pos: io.pos,
            len: io.len,
            write: io.write,
        };
        build_bios(s, &io.lim, io.first, &span)
    });
    Ok(0)
}

/// An io_uring transfer while the device or the file system has it (the
/// batch or the kiocb holds the pages): what finishes it, the command, and
/// what it counts.
struct UringIo {
    file: IoFile,
    lim: Limits,
    /// The I/O's start in the pages, and the pages' in their first page.
    off: u64,
    first: u64,
    pos: u64,
    len: u64,
    write: bool,
    done: Done,
    _pinned: Option<Pinned>,
    keys: Keys,
    start: Instant<Monotonic>,
    slot: UringSlot,
    /// Set before the I/O goes; taken by its completion, which always
    /// finds it (the I/O completes once).
    cmd: Option<PendingCmd>,
    /// A file READ run again by a kernel worker: what that did.
    retried: Option<Result<u64>>,
}

impl UringIo {
    /// The state of the checked transfer `d`, and its pages.
    fn new(d: Direct, keys: &Keys, start: Instant<Monotonic>, slot: UringSlot) -> (Self, Pages) {
        let Direct {
            file,
            lim,
            mem,
            pos,
            len,
            write,
            done,
            _pinned: pinned,
        } = d;
        let io = Self {
            file,
            lim,
            off: mem.offset,
            first: mem.pages.page_offset(),
            pos,
            len,
            write,
            done,
            _pinned: pinned,
            keys: keys.clone(),
            start,
            slot,
            cmd: None,
            retried: None,
        };
        (io, mem.pages)
    }

    /// The transfer ended with `r`: lets go of what it held, counts it and
    /// returns the CQE.
    fn finish(self, r: Result<Done>) -> (i32, u64) {
        let (write, keys, start) = (self.write, self.keys.clone(), self.start);
        drop(self);
        record(write, &keys, &r, start);
        cqe(&r)
    }

    /// Files: the kiocb ended with `r`; `notify`: the file's event is still
    /// to be sent (an asynchronous kiocb's completion does not send it);
    /// `count_holes`: the zero-filled bytes are counted (reopening the file
    /// as the caller, so only in the submitter's task).
    fn finish_file(self, r: Result<u64>, notify: bool, count_holes: bool) -> (i32, u64) {
        let r = r.map(|bytes| {
            if notify && bytes > 0 {
                self.file.notify(self.write);
            }
            let zeroed = if count_holes {
                file_zeroed(&self.file, self.pos, bytes, self.write)
            } else {
                0
            };
            moved(&self.file, self.write, self.done, bytes, zeroed)
        });
        self.finish(r)
    }
}

/// Hands a finished asynchronous I/O to task work in its submitter's task
/// (any context, interrupts included).
fn to_task<W: TaskWork>(cmd: Option<PendingCmd>, io: KBox<W>) {
    match cmd {
        Some(cmd) => cmd.complete(io),
        // Cannot happen (the command is set before the I/O goes). Nothing
        // of the I/O may be dropped here (in any context: letting go of its
        // file and memory may sleep): keep it.
        None => {
            pr_err!("io_uring I/O completed without its command; leaking its state\n");
            KBox::leak(io);
        }
    }
}

impl AsyncOwner for UringIo {
    type Pages = Pages;
    type Built = (u64, Option<Error>);

    fn bdev(&self) -> &BlockDevice {
        self.file.bdev()
    }

    fn completed(mut batch: KBox<AsyncBatch<Self>>) {
        let cmd = batch.owner_mut().cmd.take();
        to_task(cmd, batch);
    }
}

impl TaskWork for AsyncBatch<UringIo> {
    // The bios are done: finishing only counts and drops the cache range,
    // which is right whoever runs it.
    fn run(self: KBox<Self>, _cancel: bool) -> (i32, u64) {
        let (batch, spare) = box_cache::split(self);
        let bios = batch.result();
        let (io, built) = batch.into_parts();
        io.slot.0.batches.keep(spare);
        let (queued, build_err) = built.unwrap_or((0, Some(EINVAL)));
        // As `bdev_io`: a WRITE drops the range from the cache after its
        // bios too, whatever became of them.
        if io.write {
            io.file.bdev_invalidate(io.pos, io.len);
        }
        let r = good_prefix(queued, build_err, bios)
            .map(|bytes| moved(&io.file, io.write, io.done, bytes, 0));
        io.finish(r)
    }
}

/// Counts an io_uring command the checks finished at once and posts it.
fn post_now(
    cmd: &mut UringCmd,
    write: bool,
    keys: &Keys,
    r: Result<Done>,
    start: Instant<Monotonic>,
) -> Result<i32> {
    record(write, keys, &r, start);
    let (res, res2) = cqe(&r);
    cmd.queue().ok_or(EINVAL)?.complete_with(res, res2);
    Ok(0)
}

/// An io_uring transfer of a file: an asynchronous kiocb, whose
/// completion posts the CQE through task work. A READ is issued inline with
/// `IOCB_NOWAIT` (what would block goes to io_uring's worker); a WRITE is
/// issued from the worker (taking the superblock's write access may wait
/// for a freeze, and file systems often allocate), still asynchronously.
fn submit_file(
    d: Direct,
    keys: Keys,
    start: Instant<Monotonic>,
    slot: UringSlot,
    cmd: &mut UringCmd,
) -> Result<i32> {
    let nowait = cmd.nonblock();
    if nowait && d.write {
        // Checked by `submit_uring` already, unless the fd changed since.
        return Err(EAGAIN);
    }
    let (off, len, pos, write) = (d.mem.offset, d.len, d.pos, d.write);
    let (io, pages) = UringIo::new(d, &keys, start, slot);
    let mut rw = AsyncRw::new(io, pages, off, len, pos, write).inspect_err(|e| {
        record(write, &keys, &Err(*e), start);
    })?;
    rw.owner_mut().cmd = Some(cmd.queue().ok_or(EINVAL)?);
    let Issued::Done(mut rw) = AsyncRw::submit(rw, nowait) else {
        return Ok(0);
    };
    // Nothing is in flight: the command is still ours.
    let Some(pending) = rw.owner_mut().cmd.take() else {
        return Err(EINVAL);
    };
    // What a NOWAIT issue may answer instead of blocking (as io_uring's own
    // reads take it).
    if nowait && matches!(rw.result(), Err(e) if e == EAGAIN || e == eopnotsupp()) {
        // Issued again by io_uring's worker (the checks too).
        drop(rw);
        return match cmd.unqueue(pending) {
            Ok(()) => Err(EAGAIN),
            Err(p) => {
                p.complete_with(EIO.to_errno(), 0);
                Ok(0)
            }
        };
    }
    let r = rw.result();
    let (res, res2) = KBox::into_inner(rw)
        .into_owner()
        .finish_file(r, false, true);
    pending.complete_with(res, res2);
    Ok(0)
}

/// io_uring file READs the file system gave up (`EAGAIN`) after part of
/// them went, each to be run again (by a kernel worker; by the task work if
/// the worker's item could not be allocated): debugfs
/// `p2pdirect/file_read_retries`.
static FILE_READ_RETRIES: AtomicU64 = AtomicU64::new(0);

/// The debugfs file `p2pdirect/file_read_retries`: [`FILE_READ_RETRIES`].
pub(crate) struct FileReadRetries;

impl FileReadRetries {
    pub(crate) fn show(_: &Self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        writeln!(f, "{}", FILE_READ_RETRIES.load(Relaxed))
    }
}

impl AsyncRwOwner for UringIo {
    type Pages = Pages;

    fn file(&self) -> &File {
        self.file.file()
    }

    fn completed(mut io: KBox<AsyncRw<Self>>) {
        if io.retryable() {
            // The file system gave a NOWAIT read up after part of it went
            // (rare): it runs again in a kernel worker, where it may block,
            // and lets go of its pages there. Never in the submitter's task
            // work, which may not run for as long as the submitter pleases
            // (a DEFER_TASKRUN ring that is not waited on), while a GPU
            // unbind waits for the pages.
            FILE_READ_RETRIES.fetch_add(1, Relaxed);
            match work::defer(io, rerun_read) {
                Ok(()) => return,
                // No memory for the work item: the task work runs it.
                Err(back) => io = back,
            }
        }
        let cmd = io.owner_mut().cmd.take();
        to_task(cmd, io);
    }
}

/// A kernel worker runs a file READ again whose NOWAIT issue the file
/// system gave up after part of it went (see `completed` above), then hands
/// it to the submitter's task work.
fn rerun_read(mut io: KBox<AsyncRw<UringIo>>) {
    let r = io.rerun_read();
    crate::devmem::reap();
    io.owner_mut().retried = r;
    let cmd = io.owner_mut().cmd.take();
    to_task(cmd, io);
}

impl TaskWork for AsyncRw<UringIo> {
    fn run(mut self: KBox<Self>, cancel: bool) -> (i32, u64) {
        let (r, notify) = match self.owner_mut().retried.take() {
            // Run again by a kernel worker (which sent no access event).
            Some(r) => (r, true),
            // The worker's item could not be allocated, and the task is
            // going away: no blocking retry on its behalf.
            None if cancel && self.retryable() => (Err(ecanceled()), false),
            // The worker's item could not be allocated: it runs here.
            None => (self.rerun_read().unwrap_or_else(|| self.result()), true),
        };
        KBox::into_inner(self)
            .into_owner()
            .finish_file(r, notify, !cancel)
    }
}

/// Counts a finished I/O (whose pins are gone: memory freed during it may
/// be given back now).
fn record(write: bool, keys: &Keys, r: &Result<Done>, start: Instant<Monotonic>) {
    crate::devmem::reap();
    // The UAPI's `reads` and `writes` count the I/Os that moved data or
    // failed: one that moved nothing (at or past the end) is not counted.
    if matches!(r, Ok(d) if d.bytes == 0) {
        return;
    }
    let d = r.as_ref().copied().unwrap_or_default();
    crate::stats::table().add(
        &[keys.provider.map(Key::Provider), keys.block.map(Key::Block)],
        &IoRecord {
            write,
            ok: r.is_ok(),
            bytes: d.bytes,
            p2p: d.p2p,
            bounced: d.bounced,
            zeroed: d.zeroed,
            ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(0),
        },
    );
}

/// What the checks made of an I/O: done already (nothing to move, or
/// bounced), or a transfer device to device still to run.
enum Planned {
    Done(Done),
    Direct(Direct),
}

/// A checked transfer between the file and device memory, with everything
/// it holds until it ends: the file, the pinned pages, their pin count.
struct Direct {
    file: IoFile,
    lim: Limits,
    mem: Memory,
    pos: u64,
    len: u64,
    write: bool,
    /// What is known before the transfer (the DMA device).
    done: Done,
    _pinned: Option<Pinned>,
}

impl Direct {
    fn span(&self) -> Span<'_> {
        Span {
            pages: &self.mem.pages,
            off: self.mem.offset,
            pos: self.pos,
            len: self.len,
            write: self.write,
        }
    }

    /// Moves the data and waits for it.
    fn run(self) -> Result<Done> {
        let (bytes, zeroed) = direct(&self.file, &self.lim, &self.span())?;
        Ok(self.finish(bytes, zeroed))
    }

    /// The transfer moved `bytes`, `zeroed` of them by the CPU: sends the
    /// file's event and lets go of the file and the memory.
    fn finish(self, bytes: u64, zeroed: u64) -> Done {
        moved(&self.file, self.write, self.done, bytes, zeroed)
    }
}

/// What a transfer device to device that moved `bytes` (`zeroed` of them
/// by the CPU) did, `done` saying the rest; sends the file's event.
fn moved(file: &IoFile, write: bool, done: Done, bytes: u64, zeroed: u64) -> Done {
    notify(file, bytes, write);
    // No more than moved, whatever the file system's SEEK_HOLE said.
    let zeroed = zeroed.min(bytes);
    Done {
        bytes,
        zeroed,
        p2p: bytes.saturating_sub(zeroed),
        ..done
    }
}

/// The argument's flags and size, checked before anything else.
fn check_args(req: &Request) -> Result {
    let known = uapi::P2PDIRECT_IO_REGISTERED | uapi::P2PDIRECT_IO_COMPAT;
    if req.flags & !known != 0 {
        refuse!(
            EINVAL,
            "{}: unknown flags {:#x} (known: {:#x})\n",
            op_name(req.write),
            req.flags & !known,
            known
        );
    }
    if req.size == 0 {
        refuse!(EINVAL, "{}: size 0: nothing to move\n", op_name(req.write));
    }
    Ok(())
}

/// Why fd `fd` cannot be READ or written, as [`IoFile::from_fd`] refused it.
fn log_fd_refusal(req: &Request, e: Error) {
    let why = match e {
        EBADF if req.write => "is not an open file descriptor opened for writing",
        EBADF => "is not an open file descriptor opened for reading",
        EISDIR => "is a directory",
        ESPIPE => "is a pipe or socket",
        EINVAL => "must be a block device or regular file opened with O_DIRECT",
        EPERM => "is a read-only block device",
        ETXTBSY => "is a block device in use as swap",
        e if e == eopnotsupp() => {
            "is a file on a file system without a block device (tmpfs, NFS, FUSE): \
             there is no storage device to do the DMA"
        }
        _ => return,
    };
    if crate::sys::ratelimit::allow() {
        pr_info!("{}: fd {} {why}\n", op_name(req.write), req.fd);
    }
}

fn plan(me: &dyn IoOwner, req: &Request, keys: &mut Keys) -> Result<Planned> {
    check_args(req)?;
    let file = IoFile::from_fd(req.fd, req.write).inspect_err(|e| log_fd_refusal(req, *e))?;
    let lim = file.limits();
    keys.block = Some(lim.devt);
    if req.write && lim.read_only {
        refuse!(
            EROFS,
            "WRITE: the block device under fd {}'s file system was made read-only\n",
            req.fd
        );
    }
    check_alignment(req, &lim)?;
    // pread/pwrite: a negative offset (as loff_t) is EINVAL, and one call
    // moves at most MAX_RW_COUNT bytes (a short transfer, not an error).
    if i64::try_from(req.file_offset).is_err() {
        refuse!(
            EINVAL,
            "{}: file offset {:#x} is negative as a loff_t (pread's EINVAL)\n",
            op_name(req.write),
            req.file_offset
        );
    }
    // O_DIRECT that the file system serves through the page cache would be
    // CPU copies counted as P2P: bounce honestly (COMPAT) or refuse. Also
    // for a file opened O_APPEND, at the offset given: ext4 and xfs decide
    // there (and check its alignment) before they move the write to the end.
    let cpu_path = !file.is_bdev() && file.dio_falls_back(req.file_offset, req.size, req.write);
    if cpu_path && req.flags & uapi::P2PDIRECT_IO_COMPAT == 0 {
        refuse!(
            eopnotsupp(),
            "{}: the file system of fd {} serves O_DIRECT of this range through the page \
             cache (ext4 data journalling; an xfs reflinked file written off its allocation \
             unit); set P2PDIRECT_IO_COMPAT to bounce\n",
            op_name(req.write),
            req.fd
        );
    }
    let mut len = req.size.min(MAX_RW_COUNT);
    // pread/pwrite on a block device: reads stop at its end, writes past it
    // fail, once the memory is found good. A file's end is its file
    // system's to find, in the read itself (with its locks and hooks): a
    // file READ at or past it is checked like any other first.
    let past_end = file.is_bdev() && req.file_offset >= lim.size;
    if file.is_bdev() {
        if !past_end {
            len = len.min(lim.size - req.file_offset);
        }
        // read(2)/write(2)'s own checks and hooks (LSM, fanotify), which
        // they run on the whole count before the device's end is tested
        // and the count cut: also at or past the end.
        file.rw_verify(req.file_offset, req.size, req.write)?;
    }
    let mem = resolve_memory(me, req, &lim)?;
    let provider = mem.pages.provider();
    // Found: a failure from here on counts in the provider's row too.
    keys.provider = Some(provider);
    if past_end {
        return if req.write {
            Err(ENOSPC)
        } else {
            Ok(Planned::Done(Done::default()))
        };
    }
    // A registration counts its pinned bytes itself.
    let pinned =
        (req.flags & uapi::P2PDIRECT_IO_REGISTERED == 0).then(|| Pinned::new(provider, len));
    // Every device that may DMA to the memory: the controller, or each leg
    // of a stacked device (an md array, an NVMe multipath head's paths).
    // A device with no PCI function under it that the walk can name (a
    // loop device, a stack too deep or too wide) has no leg to check: it is
    // refused or bounced below. Running out of memory is an error of its own.
    // Only a queue that takes P2PDMA pages needs them (the walk of a stacked
    // device scans the block devices: not for dm, loop or the page cache).
    let legs = if cpu_path || !lim.p2pdma {
        Legs::Walked(KVec::new())
    } else {
        dma_legs(me, &file)?
    };
    let mut done = Done {
        dma_pci: legs.first_addr(),
        ..Done::default()
    };
    let reach = if cpu_path || !lim.p2pdma || legs.len() == 0 {
        Err(None)
    } else {
        legs.reach(&mem.pages).map_err(Some)
    };
    if let Err(tried) = reach {
        if req.flags & uapi::P2PDIRECT_IO_COMPAT == 0 {
            let (legs, missing) = match legs {
                Legs::Walked(l) => (l, None),
                Legs::Missing(e) => (KVec::new(), Some(e)),
                Legs::Hinted(_) | Legs::One(_) => (KVec::new(), None),
            };
            let (i, dma, provider) = tried.unwrap_or_default();
            let why = Unreachable {
                tried: tried.is_some(),
                missing,
                leg: legs.get(i),
                dma,
                provider,
            };
            return Err(refuse_unreachable(req, &lim, &why, legs.len()));
        }
        let (bytes, zeroed) = bounce(&file, &lim, &mem, req, len)?;
        done.bytes = bytes;
        // Holes are zeroed by the CPU: counted once, in `zeroed` (p2p +
        // bounced + zeroed = bytes, as on the direct path).
        done.bounced = bytes.saturating_sub(zeroed);
        done.zeroed = zeroed;
        notify(&file, bytes, req.write);
        return Ok(Planned::Done(done));
    }
    Ok(Planned::Direct(Direct {
        file,
        lim,
        mem,
        pos: req.file_offset,
        len,
        write: req.write,
        done,
        _pinned: pinned,
    }))
}

/// Raw block devices: the fsnotify event read(2)/write(2) send once data
/// moved (files get theirs from `vfs_iocb_iter_read/write`).
fn notify(file: &IoFile, bytes: u64, write: bool) {
    if file.is_bdev() && bytes > 0 {
        file.notify(write);
    }
}

/// Size and offsets in multiples of the logical block size, the memory
/// address too (the device DMAs whole blocks).
fn check_alignment(req: &Request, lim: &Limits) -> Result {
    let lbs = u64::from(lim.logical_block_size.max(1));
    let mem_addr = if req.flags & uapi::P2PDIRECT_IO_REGISTERED != 0 {
        0
    } else {
        req.addr
    };
    let bad = [req.size, req.file_offset, req.buf_offset, mem_addr]
        .iter()
        .any(|&v| block_rem(v, lbs) != 0);
    if bad {
        refuse!(
            EINVAL,
            "{}: size {:#x}, file offset {:#x}, buffer {:#x}+{:#x} must be multiples of \
             the logical block size {}\n",
            op_name(req.write),
            req.size,
            req.file_offset,
            req.addr,
            req.buf_offset,
            lbs
        );
    }
    Ok(())
}

/// The pinned pages the I/O moves data into or out of.
fn resolve_memory(me: &dyn IoOwner, req: &Request, lim: &Limits) -> Result<Memory> {
    // A READ writes the memory.
    let mem_written = !req.write;
    if req.flags & uapi::P2PDIRECT_IO_REGISTERED != 0 {
        let pages = me
            .registration_pages(req.addr, &|reg| {
                let end = req.buf_offset.checked_add(req.size);
                if end.is_none_or(|end| end > reg.range.size) {
                    refuse!(
                        ERANGE,
                        "{}: buffer offset {:#x} + size {:#x} runs past registration {}'s \
                         {:#x} bytes\n",
                        op_name(req.write),
                        req.buf_offset,
                        req.size,
                        req.addr,
                        reg.range.size
                    );
                }
                if mem_written && !reg.write {
                    refuse!(
                        EPERM,
                        "READ: registration {} was made without P2PDIRECT_REG_WRITE: a READ \
                         writes the memory\n",
                        req.addr
                    );
                }
                let lbs = u64::from(lim.logical_block_size.max(1));
                if block_rem(reg.range.addr + req.buf_offset, lbs) != 0 {
                    refuse!(
                        EINVAL,
                        "{}: registration {}'s start {:#x} + buffer offset {:#x} must be a \
                         multiple of the logical block size {lbs}\n",
                        op_name(req.write),
                        req.addr,
                        reg.range.addr,
                        req.buf_offset
                    );
                }
                Ok(())
            })
            .inspect_err(|e| {
                if *e == ENOENT && crate::sys::ratelimit::allow() {
                    pr_info!(
                        "{}: this file has no registration {}\n",
                        op_name(req.write),
                        req.addr
                    );
                } else if *e == estale() && crate::sys::ratelimit::allow() {
                    pr_info!(
                        "{}: the memory of registration {} went away (FREE, or its device \
                         was removed); DEREGISTER it\n",
                        op_name(req.write),
                        req.addr
                    );
                }
            })?;
        return Ok(Memory {
            pages,
            offset: req.buf_offset,
        });
    }
    let Some(start) = req.addr.checked_add(req.buf_offset) else {
        refuse!(
            EINVAL,
            "{}: address {:#x} + buffer offset {:#x} overflows\n",
            op_name(req.write),
            req.addr,
            req.buf_offset
        );
    };
    let range = UserRange::new(start, req.size)?;
    // A range that starts in a device-memory mapping and ends outside it is
    // refused by the registry's lookup (EFAULT).
    let mut claim = peer_mem::acquire(range).inspect_err(|e| {
        if *e == ENXIO && crate::sys::ratelimit::allow() {
            pr_info!(
                "{}: {:#x}+{:#x} is not device memory: no peer-memory client claims it\n",
                op_name(req.write),
                start,
                req.size
            );
        }
    })?;
    claim.check_io()?;
    claim.get_pages(mem_written)?;
    // The I/O's own reference keeps the pages pinned; the claim can go.
    Ok(Memory {
        pages: claim.pages()?,
        offset: 0,
    })
}

/// Why the data cannot go device to device: the DMA device `dma` that
/// cannot reach `provider`, if one was found and tried, and the leg of a
/// stacked device it belongs to; else why no DMA device was found.
struct Unreachable<'a> {
    tried: bool,
    missing: Option<Error>,
    leg: Option<&'a ffi::DmaLeg>,
    dma: u32,
    provider: u32,
}

/// The DMA devices of an I/O's block device.
enum Legs<'a> {
    /// It sits on this PCI function itself, as the file's hint says.
    Hinted(&'a LocatedPci),
    /// It sits on this PCI function itself.
    One(ARef<pci::Device>),
    /// The legs of a stacked device, down to their PCI functions (empty:
    /// none looked for).
    Walked(KVec<DmaLeg>),
    /// None found, and why: no PCI device under it (`ENODEV`), or a stack
    /// past p2pdirect's limits (`ELOOP`, `E2BIG`).
    Missing(Error),
}

impl Legs<'_> {
    fn pcis(&self) -> impl Iterator<Item = &pci::Device> {
        let (one, walked) = match self {
            Legs::Hinted(p) => (Some(p.pci()), &[][..]),
            Legs::One(p) => (Some(&**p), &[][..]),
            Legs::Walked(l) => (None, &l[..]),
            Legs::Missing(_) => (None, &[][..]),
        };
        Iterator::chain(one.into_iter(), walked.iter().map(|l| &*l.pci))
    }

    fn len(&self) -> usize {
        match self {
            Legs::Hinted(_) | Legs::One(_) => 1,
            Legs::Walked(l) => l.len(),
            Legs::Missing(_) => 0,
        }
    }

    /// The PCI address of the first leg (0: none). The file's hinted DMA
    /// device has it read already.
    fn first_addr(&self) -> u32 {
        match self {
            Legs::Hinted(p) => p.addr(),
            _ => self.pcis().next().map_or(0, PciFunction::addr_of),
        }
    }

    /// Whether every leg reaches `pages`; else the first that does not: its
    /// index, its PCI address and the provider it cannot reach.
    fn reach(&self, pages: &Pages) -> core::result::Result<(), (usize, u32, u32)> {
        if let Legs::Hinted(p) = self {
            return pages
                .reachable_by_located(p)
                .map_err(|provider| (0, p.addr(), provider));
        }
        self.pcis().enumerate().try_for_each(|(i, p)| {
            pages
                .reachable_by(p)
                .map_err(|provider| (i, PciFunction::addr_of(p), provider))
        })
    }
}

/// The DMA device of a block device that sits on a PCI function itself: a
/// disk's parents never change while it lives, so the next I/O to the same
/// disk (by [`BlockDevice::identity`]) skips the walk.
pub(crate) struct DmaHint {
    id: (u64, u32),
    pci: LocatedPci,
}

/// What a file knows of the DMA devices of the disks it did I/O to: the
/// first disk's, set once and then read with no lock (a file doing I/O to
/// one disk, the common case, shares nothing between its threads but a
/// read), and the last other disk's, under a spinlock.
#[pin_data]
pub(crate) struct DmaHints {
    first: SetOnce<DmaHint>,
    #[pin]
    other: SpinLock<Option<DmaHint>>,
}

impl DmaHints {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            first: SetOnce::new(),
            other <- new_spinlock!(None),
        })
    }
}

/// The DMA devices of `file`'s block device: the PCI function it sits on
/// (from `me`'s hints if it did I/O to the same live disk before), or the
/// legs of a stacked device, walked every time (they change).
fn dma_legs<'a>(me: &'a dyn IoOwner, file: &IoFile) -> Result<Legs<'a>> {
    let bdev = file.bdev();
    let id = bdev.identity();
    let hints = me.dma_hints();
    if !bdev.disk_dead() {
        if let Some(h) = hints.first.as_ref().filter(|h| h.id == id) {
            return Ok(Legs::Hinted(&h.pci));
        }
        if let Some(h) = hints.other.lock().as_ref().filter(|h| h.id == id) {
            return Ok(Legs::One(h.pci.pci().into()));
        }
    }
    match bdev.dma_devices() {
        Ok(DmaDevices::Own(pci)) => {
            let hint = DmaHint {
                id,
                pci: LocatedPci::new(pci.clone()),
            };
            if !hints.first.populate(hint) {
                let old = hints.other.lock().replace(DmaHint {
                    id,
                    pci: LocatedPci::new(pci.clone()),
                });
                // Outside the lock: the last reference of a removed device
                // frees it.
                drop(old);
            }
            Ok(Legs::One(pci))
        }
        Ok(DmaDevices::Legs(legs)) => Ok(Legs::Walked(legs)),
        Err(e) if e == ENOMEM => Err(e),
        Err(e) => Ok(Legs::Missing(e)),
    }
}

/// The error (and a rate-limited message naming both devices) for memory
/// the block device cannot reach.
fn refuse_unreachable(req: &Request, lim: &Limits, why: &Unreachable<'_>, legs: usize) -> Error {
    if !lim.p2pdma {
        if crate::sys::ratelimit::allow() {
            pr_info!(
                "{}: the block device of fd {} does not accept P2PDMA memory (its queue \
                 lacks BLK_FEAT_PCI_P2PDMA); set P2PDIRECT_IO_COMPAT to bounce through host \
                 memory\n",
                op_name(req.write),
                req.fd,
            );
        }
        return eopnotsupp();
    }
    if crate::sys::ratelimit::allow() {
        match why.leg {
            _ if !why.tried => match why.missing.and_then(stack_limit) {
                Some((max, what)) => pr_info!(
                    "{}: the block device of fd {} is stacked past p2pdirect's limit: more \
                     than {max} {what}; set P2PDIRECT_IO_COMPAT to bounce through host \
                     memory\n",
                    op_name(req.write),
                    req.fd
                ),
                None => pr_info!(
                    "{}: fd {} is a block device with no PCI device under it that p2pdirect \
                     can find; set P2PDIRECT_IO_COMPAT to bounce through host memory\n",
                    op_name(req.write),
                    req.fd
                ),
            },
            // A stacked device's leg, also its only one (a raid1 of one
            // member, a multipath head with one path left).
            Some(leg) => pr_info!(
                "{}: {} at {} ({} under fd {}) cannot reach the device memory of {} (P2P \
                 distance); set P2PDIRECT_IO_COMPAT to bounce through host memory\n",
                op_name(req.write),
                &*leg.name,
                Bdf(why.dma),
                LegOf(legs),
                req.fd,
                Bdf(why.provider)
            ),
            _ => pr_info!(
                "{}: {} (the DMA device of fd {}) cannot reach the device memory of {} \
                 (P2P distance); set P2PDIRECT_IO_COMPAT to bounce through host memory\n",
                op_name(req.write),
                Bdf(why.dma),
                req.fd,
                Bdf(why.provider)
            ),
        }
    }
    eremoteio()
}

/// Which of a stacked device's `n` legs a message names: "one of n paths
/// or legs", or "the only path or leg".
struct LegOf(usize);

impl kernel::fmt::Display for LegOf {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        match self.0 {
            1 => f.write_str("the only path or leg"),
            n => write!(f, "one of {n} paths or legs"),
        }
    }
}

/// `len` bytes at `pos` of the file and at `off` of `pages`, one way.
#[derive(Clone, Copy)]
struct Span<'a> {
    pages: &'a Pages,
    off: u64,
    pos: u64,
    len: u64,
    write: bool,
}

/// Moves a span between the file and the pages, the device DMAing into or
/// out of the pages. Returns (bytes, zeroed bytes).
fn direct(file: &IoFile, lim: &Limits, span: &Span<'_>) -> Result<(u64, u64)> {
    if file.is_bdev() {
        return Ok((bdev_io(file, lim, span)?, 0));
    }
    let bytes = file.rw(span.pages, span.off, span.len, span.pos, span.write)?;
    Ok((bytes, file_zeroed(file, span.pos, bytes, span.write)))
}

/// Files: bytes of a READ of `bytes` at `pos` that the file system zeroed
/// with the CPU (holes, unwritten extents).
fn file_zeroed(file: &IoFile, pos: u64, bytes: u64, write: bool) -> u64 {
    if write || bytes == 0 {
        return 0;
    }
    // The private open that finds the holes would break a write lease,
    // which only the caller can hold here (one needs the file open once:
    // the caller's fd), where read(2) breaks none: the caller would get
    // SIGIO and wait for itself. With any lease (`break_lease()`'s test)
    // the holes are not counted.
    if file.has_leases() {
        if crate::sys::ratelimit::allow() {
            pr_info!(
                "READ: holes of the file not counted: it has a lease, which the open that \
                 finds them would break\n"
            );
        }
        return 0;
    }
    file.hole_bytes(pos, bytes).unwrap_or_else(|e| {
        if crate::sys::ratelimit::allow() {
            pr_info!("READ: holes of the file not counted ({:?})\n", e);
        }
        0
    })
}

/// Bytes the next bio may carry when it starts `in_page` bytes into a page.
fn bio_bytes(lim: &Limits, in_page: u64, remaining: u64) -> u64 {
    let lbs = u64::from(lim.logical_block_size.max(1));
    let page = PAGE_SIZE as u64;
    let by_segments = u64::from(lim.max_segments.max(1)) * page - in_page;
    let n = remaining.min(u64::from(lim.max_bytes)).min(by_segments);
    // At least one block, whole blocks only.
    (n - block_rem(n, lbs)).max(lbs.min(remaining))
}

/// `v % lbs` for a logical block size `lbs` (not 0), with a mask where it
/// is a power of two, which every queue's is (`blk_validate_limits()`
/// refuses others): no division on the path of every I/O.
fn block_rem(v: u64, lbs: u64) -> u64 {
    if lbs.is_power_of_two() {
        v & (lbs - 1)
    } else {
        v % lbs
    }
}

/// Raw block device: builds, submits and waits for the bios. Returns the
/// bytes of the good prefix (see the UAPI header on partial transfers).
fn bdev_io(file: &IoFile, lim: &Limits, span: &Span<'_>) -> Result<u64> {
    let (pos, len, write) = (span.pos, span.len, span.write);
    // Cached data of the range must not hide or shadow the bios' data:
    // dirty pages are written back first; a WRITE drops the range from the
    // cache before and, whatever became of its bios, after (as the block
    // layer's own direct writes do), so no reader sees stale pages even of
    // blocks written after a failed one.
    file.bdev_sync(pos, len)?;
    if write {
        file.bdev_invalidate(pos, len);
    }
    let op = file.bio_op(write);
    let r = bdev_bios(file, lim, span, op);
    if write {
        file.bdev_invalidate(pos, len);
    }
    // write(2) of an O_DSYNC device: its bios were FUA writes, and then
    // `generic_write_sync()` flushes the device cache, failing the call if
    // the flush fails.
    if matches!(r, Ok(n) if n > 0) && op == bio::Op::WriteFua {
        file.bdev_flush()?;
    }
    r
}

/// The bios of [`bdev_io`]: returns the bytes of the good prefix.
fn bdev_bios(file: &IoFile, lim: &Limits, span: &Span<'_>, op: bio::Op) -> Result<u64> {
    let Span {
        pages,
        off,
        pos,
        len,
        ..
    } = *span;
    let page = PAGE_SIZE as u64;
    let first = pages.page_offset();
    // What fits one bio goes through one on-stack bio: no allocation.
    if bio_bytes(lim, (first + off) % page, len) == len {
        if let Ok(n) = u32::try_from(len) {
            if bio::rw_onstack(file.bdev(), pages, off, n, pos, op)? {
                return Ok(len);
            }
        }
    }
    let ((queued, build_err), bios) =
        Batch::run(file.bdev(), pages, op, |b| build_bios(b, lim, first, span));
    good_prefix(queued, build_err, bios)
}

/// The bytes of the good prefix of an I/O whose bios covered `queued`
/// bytes (building stopped with `build_err`, if it did) and ended with
/// `bios` (the error of the first failed bio and its offset). An I/O that
/// moved nothing fails with the first error.
fn good_prefix(
    queued: u64,
    build_err: Option<Error>,
    bios: core::result::Result<(), (Error, u64)>,
) -> Result<u64> {
    let good = match bios {
        Ok(()) => queued,
        Err((e, 0)) => return Err(e),
        Err((_, at)) => at,
    };
    match build_err {
        Some(e) if good == 0 => Err(e),
        _ => Ok(good),
    }
}

/// Builds and submits the bios of `span` through `batch` (whose pages are
/// `span.pages`, which start `first` bytes into their first page). Returns
/// the bytes queued and the error that stopped building early, if any.
///
/// An I/O of more than one bio submits them in a plug: the driver gets
/// their requests together (one NVMe doorbell write instead of one per
/// bio). One bio goes straight to the driver.
fn build_bios<B: BuildBios>(
    batch: &B,
    lim: &Limits,
    first: u64,
    span: &Span<'_>,
) -> (u64, Option<Error>) {
    let page = PAGE_SIZE as u64;
    let (off, len) = (span.off, span.len);
    let in_page = (first + off) % page;
    let one_bio = bio_bytes(lim, in_page, len) == len
        && (span.pages.contiguous(off, len) == len || (in_page + len).div_ceil(page) <= BIO_VECS);
    if one_bio {
        build_unplugged(batch, lim, first, span)
    } else {
        bio::plugged(|| build_unplugged(batch, lim, first, span))
    }
}

/// [`build_bios`] without the plug.
fn build_unplugged<B: BuildBios>(
    batch: &B,
    lim: &Limits,
    first: u64,
    span: &Span<'_>,
) -> (u64, Option<Error>) {
    let page = PAGE_SIZE as u64;
    let (off, pos, len) = (span.off, span.pos, span.len);
    let mut queued = 0u64;
    while queued < len {
        let in_page = (first + off + queued) % page;
        let want = bio_bytes(lim, in_page, len - queued);
        // Physically contiguous pages merge into one segment, so a few
        // inline vectors usually hold the whole bio; a full bio goes out as
        // it is and the next one takes the rest.
        let nr_vecs = (in_page + want).div_ceil(page).min(BIO_VECS);
        let mut bio = match batch.bio(pos + queued, nr_vecs as u16) {
            Ok(b) => b,
            Err(e) => return (queued, Some(e)),
        };
        let mut added = 0u64;
        while added < want {
            let at = off + queued + added;
            // A run of contiguous pages goes in as one vector.
            let piece = span.pages.contiguous(at, want - added);
            if piece == 0 || !batch.add(&mut bio, at, piece as u32) {
                break;
            }
            added += piece;
        }
        if added == 0 {
            // Not even one page fits an empty bio: cannot happen.
            return (queued, Some(EIO));
        }
        // Pieces end on page boundaries or at the I/O's end, all multiples
        // of the logical block size: a partial bio is still whole blocks.
        // (`want` fits a `u32`: `bio_bytes` bounds it by `max_bytes`.)
        if let Err(e) = batch.submit(bio, queued) {
            return (queued, Some(e));
        }
        queued += added;
    }
    (queued, None)
}

/// COMPAT: the device cannot reach the memory, so the data goes through a
/// host-memory buffer, chunk by chunk, and the CPU copies it.
fn bounce(
    file: &IoFile,
    lim: &Limits,
    mem: &Memory,
    req: &Request,
    len: u64,
) -> Result<(u64, u64)> {
    let buf = Pages::alloc_zeroed(len.min(BOUNCE_CHUNK))?;
    let (mut done, mut zeroed) = (0u64, 0u64);
    while done < len {
        let n = buf.len().min(len - done);
        let at = mem.offset + done;
        if req.write {
            buf.copy_from(0, &mem.pages, at, n)?;
        }
        let step = direct(
            file,
            lim,
            &Span {
                pages: &buf,
                off: 0,
                pos: req.file_offset + done,
                len: n,
                write: req.write,
            },
        );
        let (moved, z) = match step {
            Ok(r) => r,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        if !req.write {
            mem.pages.copy_from(at, &buf, 0, moved)?;
        }
        done += moved;
        zeroed += z;
        // A killed task (or the io_uring worker of a dying process, whose
        // exit waits for it) stops after the chunk: the result goes
        // nowhere, and the rest could take as long as the device likes.
        if moved < n || crate::sys::resched() {
            break;
        }
    }
    Ok((done, zeroed))
}

#[kernel::macros::kunit_tests(p2pdirect_storage)]
mod tests {
    use super::*;

    const PAGE: u64 = PAGE_SIZE as u64;

    fn limits(lbs: u32, max_bytes: u32, max_segments: u32) -> Limits {
        Limits {
            logical_block_size: lbs,
            max_bytes,
            max_segments,
            ..Limits::default()
        }
    }

    /// Splits an I/O of `len` bytes starting `first` bytes into a page the
    /// way `build_bios` does; checks every bio against the limits and
    /// returns how many there were.
    fn split(lim: &Limits, first: u64, len: u64) -> u64 {
        let lbs = u64::from(lim.logical_block_size);
        let (mut done, mut bios) = (0u64, 0u64);
        while done < len {
            let in_page = (first + done) % PAGE;
            let n = bio_bytes(lim, in_page, len - done);
            assert!(n > 0);
            assert_eq!(n % lbs, 0);
            assert!(n <= u64::from(lim.max_bytes));
            // The pages it touches fit its segments.
            assert!((in_page + n).div_ceil(PAGE) <= u64::from(lim.max_segments));
            done += n;
            bios += 1;
        }
        assert_eq!(done, len);
        bios
    }

    #[test]
    fn one_bio_when_it_fits() {
        let lim = limits(512, 128 << 10, 33);
        assert_eq!(bio_bytes(&lim, 0, 4096), 4096);
        assert_eq!(split(&lim, 0, 128 << 10), 1);
    }

    #[test]
    fn split_by_max_bytes_and_segments() {
        // 1 MiB at 128 KiB per bio: 8 bios.
        assert_eq!(split(&limits(512, 128 << 10, 256), 0, 1 << 20), 8);
        // Four segments of a page each: 16 KiB per bio.
        assert_eq!(split(&limits(512, 1 << 20, 4), 0, 64 << 10), 4);
        // Starting mid-page: the first bio's pages end earlier.
        let lim = limits(512, 1 << 20, 4);
        assert_eq!(bio_bytes(&lim, 512, 1 << 20), 4 * PAGE - 512);
        split(&lim, 512, (64 << 10) - 512);
    }

    #[test]
    fn whole_blocks_only() {
        // 4 KiB blocks, a queue limit that is not a multiple of them.
        let lim = limits(4096, 10 << 10, 256);
        assert_eq!(bio_bytes(&lim, 0, 64 << 10), 8 << 10);
        assert_eq!(split(&lim, 0, 64 << 10), 8);
        // A tail shorter than the limit goes whole.
        assert_eq!(bio_bytes(&lim, 0, 4096), 4096);
    }

    #[test]
    fn good_prefix_rules() {
        // Everything went.
        assert_eq!(good_prefix(8192, None, Ok(())), Ok(8192));
        // A bio failed at 4096: the prefix before it counts.
        assert_eq!(good_prefix(8192, None, Err((EIO, 4096))), Ok(4096));
        // The first bio failed: the I/O fails with its error.
        assert_eq!(good_prefix(8192, None, Err((EIO, 0))), Err(EIO));
        // Building stopped after 4096 bytes that all went: those count.
        assert_eq!(good_prefix(4096, Some(ENOMEM), Ok(())), Ok(4096));
        // Building stopped before anything was queued: its error.
        assert_eq!(good_prefix(0, Some(ENOMEM), Ok(())), Err(ENOMEM));
    }

    fn req(size: u64, file_offset: u64, addr: u64, buf_offset: u64, flags: u32) -> Request {
        Request {
            fd: 0,
            flags,
            addr,
            size,
            file_offset,
            buf_offset,
            write: false,
        }
    }

    #[test]
    fn alignment_to_the_logical_block() {
        let lim = limits(4096, 1 << 20, 256);
        assert!(check_alignment(&req(8192, 4096, 0x10000, 0, 0), &lim).is_ok());
        for bad in [
            req(512, 0, 0x10000, 0, 0),
            req(4096, 512, 0x10000, 0, 0),
            req(4096, 0, 0x10200, 0, 0),
            req(4096, 0, 0x10000, 512, 0),
        ] {
            assert_eq!(check_alignment(&bad, &lim), Err(EINVAL));
        }
        // A registration id is not an address: only its offset counts.
        let reg = uapi::P2PDIRECT_IO_REGISTERED;
        assert!(check_alignment(&req(4096, 0, 7, 0, reg), &lim).is_ok());
        assert_eq!(
            check_alignment(&req(4096, 0, 7, 512, reg), &lim),
            Err(EINVAL)
        );
    }

    #[test]
    fn block_remainder_with_and_without_a_mask() {
        for lbs in [512u64, 4096, 520, 1] {
            for v in [0u64, 1, 511, 512, 4095, 4096, 8192 + 7, u64::MAX] {
                assert_eq!(block_rem(v, lbs), v % lbs);
            }
        }
    }

    #[test]
    fn uring_slots_are_bounded() {
        let shared = Arc::pin_init(UringShared::new(), GFP_KERNEL).expect("allocation");
        let max = uapi::P2PDIRECT_URING_MAX_INFLIGHT;
        let mut held = KVec::new();
        for _ in 0..max {
            held.push(UringSlot::take(&shared).expect("a free slot"), GFP_KERNEL)
                .expect("allocation");
        }
        assert_eq!(UringSlot::take(&shared).err(), Some(EBUSY));
        held.pop();
        assert_eq!(shared.inflight.load(Relaxed), max - 1);
        assert!(UringSlot::take(&shared).is_ok());
        drop(held);
        assert_eq!(shared.inflight.load(Relaxed), 0);
    }
}
