// SPDX-License-Identifier: GPL-2.0

//! Open files as the targets of direct I/O, and the address space of a
//! file's mappings.
//!
//! C header: [`include/linux/fs.h`](srctree/include/linux/fs.h)
//!
//! - [`open_for_io`]: a file descriptor of the calling process, checked as
//!   `read(2)`/`write(2)` check it, with the same errnos.
//! - [`IoTarget::bdev`], [`rw_verify`], [`bdev_sync`], [`bdev_invalidate`]: what
//!   the block layer's direct I/O does around the bios of a raw block device.
//! - [`FileMapping`]: a file's address space, to zap user mappings.

use core::ptr::NonNull;
use kernel::{
    bindings,
    error::to_result,
    fs::{file::LocalFile, File},
    prelude::*,
    sync::aref::ARef,
};

use super::{blkdev::BlockDevice, c};

/// The file's C object (`LocalFile::as_ptr` without its out-of-line
/// `Opaque::get`: a `LocalFile` is `#[repr(transparent)]` over
/// `Opaque<bindings::file>`).
#[inline(always)]
fn raw(file: &LocalFile) -> *mut bindings::file {
    core::ptr::from_ref(file)
        .cast_mut()
        .cast::<bindings::file>()
}

/// The file type bits (`S_IFMT`) of the file's inode.
fn file_type(file: &LocalFile) -> u32 {
    // SAFETY: an open file has an inode for as long as it is open; the
    // type bits of `i_mode` never change.
    u32::from(unsafe { (*(*raw(file)).f_inode).i_mode }) & bindings::S_IFMT
}

/// An open file [`open_for_io`] accepted; a raw block device's with its
/// block device, found once.
///
/// # Invariants
///
/// `bdev` is `Some` only for a block device file, and then holds
/// `file_bdev(file)`, which the file, held here, keeps open. A regular
/// file's block device is its super block's `s_bdev`, which a file system
/// may change while mounted (btrfs, when a device leaves), so it is read at
/// each use.
pub(crate) struct IoTarget {
    file: ARef<File>,
    bdev: Option<NonNull<bindings::block_device>>,
}

// SAFETY: `IoTarget` is `Send` and `Sync` as the `ARef<File>` it adds to
// is: the pointer is never written, and it only becomes the `&BlockDevice`
// that `io_bdev` gives out for the same file from any thread; what it
// points to lives as long as the file (type invariant).
unsafe impl Send for IoTarget {}
// SAFETY: as above; `&IoTarget` gives out only shared references.
unsafe impl Sync for IoTarget {}

impl IoTarget {
    /// The file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// A raw block device (else a regular file).
    pub(crate) fn is_bdev(&self) -> bool {
        self.bdev.is_some()
    }

    /// Whether writes must be durable when they return (`O_DSYNC`, which
    /// `O_SYNC` includes; fcntl cannot change it).
    pub(crate) fn dsync(&self) -> bool {
        // SAFETY: the file, held by `self`, is open; `O_DSYNC` is set at open.
        unsafe {
            core::ptr::read_volatile(&raw const (*self.file.as_ptr()).f_flags) & bindings::O_DSYNC
                != 0
        }
    }

    /// A raw block device: makes what it completed durable (a cache flush),
    /// as `fsync` of the device does; `ENOTBLK` for a regular file.
    pub(crate) fn bdev_flush(&self) -> Result {
        let Some(b) = self.bdev else {
            return Err(ENOTBLK);
        };
        // SAFETY: the file, held by `self`, keeps its block device open
        // (type invariant); the flush only waits for the device.
        to_result(unsafe { bindings::blkdev_issue_flush(b.as_ptr()) })
    }

    /// The block device the I/O goes to (a file's: its file system's).
    pub(crate) fn bdev(&self) -> &BlockDevice {
        match self.bdev {
            // SAFETY: the file, held by `self`, keeps its block device open
            // for as long as `self` is borrowed (type invariant).
            Some(b) => unsafe { BlockDevice::from_raw(b.as_ptr()) },
            None => io_bdev(&self.file),
        }
    }
}

/// Looks `fd` up in the calling process and checks it as `read(2)` or
/// `write(2)` would: `EBADF` (not open, or not for this access), `EISDIR`,
/// `ESPIPE` (pipe, socket), `EINVAL` (not a block device or regular file,
/// or no `O_DIRECT`), `EOPNOTSUPP` (a file system with no block device),
/// and for a WRITE to a block device what `blkdev_write_iter()` refuses, in
/// its order: `EPERM` (read-only), `ETXTBSY` (an active swap device).
///
/// Returns the file with its block device.
pub(crate) fn open_for_io(fd: i32, write: bool) -> Result<IoTarget> {
    let fd = u32::try_from(fd).map_err(|_| EBADF)?;
    let file = LocalFile::fget(fd).map_err(|_| EBADF)?;
    let mode = if write {
        c::P2PDIRECT_FMODE_WRITE
    } else {
        c::P2PDIRECT_FMODE_READ
    };
    // SAFETY: the file is valid while `file` holds it; `f_mode` is set
    // before the file is installed and not changed afterwards.
    if unsafe { (*raw(&file)).f_mode } & mode == 0 {
        return Err(EBADF);
    }
    let kind = file_type(&file);
    let is_bdev = kind == bindings::S_IFBLK;
    match kind {
        bindings::S_IFDIR => return Err(EISDIR),
        bindings::S_IFIFO | bindings::S_IFSOCK => return Err(ESPIPE),
        bindings::S_IFBLK | bindings::S_IFREG => {}
        _ => return Err(EINVAL),
    }
    // SAFETY: as above; `f_flags` changes only under fcntl(F_SETFL), read
    // once here as `LocalFile::flags` reads it.
    let flags = unsafe { core::ptr::read_volatile(&raw const (*raw(&file)).f_flags) };
    if flags & bindings::O_DIRECT == 0 {
        return Err(EINVAL);
    }
    if !is_bdev && fs_bdev(&file).is_null() {
        // The kernel crate has no constant for it.
        return Err(Error::from_errno(-(bindings::EOPNOTSUPP as i32)));
    }
    if is_bdev && write {
        // SAFETY: a block device file has its block device while open.
        if unsafe { c::p2pdirect_bdev_read_only(bindings::file_bdev(raw(&file))) } {
            return Err(EPERM);
        }
        // SAFETY: an open file's mapping and its host inode live while it is open.
        let flags = unsafe { (*(*(*raw(&file)).f_mapping).host).i_flags };
        if flags & bindings::S_SWAPFILE != 0 {
            return Err(ETXTBSY);
        }
    }
    // INVARIANT: a block device file's own block device, which it keeps
    // open; none for a regular file.
    let bdev = is_bdev.then(|| NonNull::from(io_bdev(&file)).cast());
    Ok(IoTarget {
        // SAFETY: only the file's I/O operations are used, never its
        // position (`f_pos`), so no `fdget_pos` of another thread matters.
        file: unsafe { LocalFile::assume_no_fdget_pos(file) },
        bdev,
    })
}

/// The block device of the file system the file is on (null if none).
fn fs_bdev(file: &LocalFile) -> *mut bindings::block_device {
    // SAFETY: an open file's inode and super block live while it is open.
    unsafe { (*(*(*raw(file)).f_inode).i_sb).s_bdev }
}

/// The block device open as `file`; `ENOTBLK` if it is not one.
pub(crate) fn block_device(file: &LocalFile) -> Result<&BlockDevice> {
    if file_type(file) != bindings::S_IFBLK {
        return Err(ENOTBLK);
    }
    // SAFETY: an open block device file keeps its block device open for as
    // long as it is borrowed.
    Ok(unsafe { BlockDevice::from_raw(bindings::file_bdev(raw(file))) })
}

/// The block device an I/O target does its I/O on: its own, or its file
/// system's. The target is a file [`open_for_io`] accepted (private: only
/// `open_for_io` and [`IoTarget`], which it made, call it).
fn io_bdev(file: &LocalFile) -> &BlockDevice {
    let bdev = if file_type(file) == bindings::S_IFBLK {
        // SAFETY: a block device file has its block device while open.
        unsafe { bindings::file_bdev(raw(file)) }
    } else {
        fs_bdev(file)
    };
    // SAFETY: the open file keeps the block device open while borrowed
    // (`open_for_io` refused files with no block device).
    unsafe { BlockDevice::from_raw(bdev) }
}

/// `read(2)`/`write(2)`'s checks of a raw block device range
/// (`rw_verify_area()`: offsets, LSM hooks, fanotify permission events).
pub(crate) fn rw_verify(file: &File, pos: u64, len: u64, write: bool) -> Result {
    // The count as read(2) passes it, before cutting it to MAX_RW_COUNT
    // (`rw_verify_area()` refuses one that is negative as an `ssize_t`).
    let len = usize::try_from(len).map_err(|_| EINVAL)?;
    let pos = i64::try_from(pos).map_err(|_| EINVAL)?;
    let dir = if write {
        bindings::WRITE
    } else {
        bindings::READ
    };
    // SAFETY: the file is valid; `pos` is our local.
    to_result(unsafe { bindings::rw_verify_area(dir as i32, raw(file), &pos, len) })
}

/// Whether the file's page cache holds any page (`mapping->nrpages`), read
/// without a lock as `mapping_needs_writeback()` and
/// `kiocb_invalidate_post_direct_write()` read it: with none, a direct I/O
/// has no cached data to write back or drop, and the calls that would find
/// that out are skipped.
fn has_cached_pages(file: &File) -> bool {
    // SAFETY: an open file's mapping lives while it is open; `nrpages` is
    // read once, racing updates as the block layer's own readers do.
    unsafe { core::ptr::read_volatile(&raw const (*(*raw(file)).f_mapping).nrpages) != 0 }
}

/// Whether a write-back error waits to be reported (`AS_EIO` or
/// `AS_ENOSPC`, which `filemap_write_and_wait_range()` reports and clears
/// even with no page cached).
fn has_write_error(file: &File) -> bool {
    let bits = (1 << bindings::mapping_flags_AS_EIO) | (1 << bindings::mapping_flags_AS_ENOSPC);
    // SAFETY: as in `has_cached_pages`; the flags word is read once.
    unsafe { core::ptr::read_volatile(&raw const (*(*raw(file)).f_mapping).flags) & bits != 0 }
}

/// Raw block devices: writes back cached dirty data of the range, so the
/// bios do not race it.
pub(crate) fn bdev_sync(file: &File, pos: u64, len: u64) -> Result {
    let (start, end) = byte_range(pos, len)?;
    if !has_cached_pages(file) && !has_write_error(file) {
        return Ok(());
    }
    // SAFETY: an open file's mapping lives while it is open.
    to_result(unsafe { bindings::filemap_write_and_wait_range((*raw(file)).f_mapping, start, end) })
}

/// Raw block devices: drops cached data of the range (after a write).
pub(crate) fn bdev_invalidate(file: &File, pos: u64, len: u64) {
    let Ok((start, end)) = byte_range(pos, len) else {
        return;
    };
    if !has_cached_pages(file) {
        return;
    }
    let shift = kernel::page::PAGE_SHIFT;
    // SAFETY: an open file's mapping lives while it is open. Pages that
    // cannot be dropped (busy) stay; the I/O's data is on the device.
    let _ = unsafe {
        bindings::invalidate_inode_pages2_range(
            (*raw(file)).f_mapping,
            (start >> shift) as usize,
            (end >> shift) as usize,
        )
    };
}

/// Raw block devices: whether the cache work before a direct I/O of the
/// range may wait (dirty pages to write back; for a WRITE, cached pages to
/// drop), as `kiocb_write_and_wait()` and `kiocb_invalidate_pages()` judge
/// it for `IOCB_NOWAIT`.
pub(crate) fn bdev_cache_busy(file: &File, pos: u64, len: u64, write: bool) -> bool {
    let Ok((start, end)) = byte_range(pos, len) else {
        // An empty range, or one past the largest offset: no page to wait for.
        return false;
    };
    if !has_cached_pages(file) {
        return false;
    }
    // SAFETY: the file is open while borrowed, so is its address space.
    unsafe {
        let m = (*raw(file)).f_mapping;
        c::p2pdirect_range_needs_writeback(m, start, end)
            || (write && bindings::filemap_range_has_page(m, start, end))
    }
}

/// The access or modify event read(2)/write(2) send after moving data.
pub(crate) fn notify_rw(file: &File, write: bool) {
    // SAFETY: the file is open while borrowed.
    unsafe { c::p2pdirect_fsnotify(raw(file), write) };
}

/// The first and last byte of a non-empty range, as `loff_t`.
fn byte_range(pos: u64, len: u64) -> Result<(i64, i64)> {
    let last = pos
        .checked_add(len)
        .and_then(|e| e.checked_sub(1))
        .ok_or(EINVAL)?;
    Ok((
        i64::try_from(pos).map_err(|_| EINVAL)?,
        i64::try_from(last).map_err(|_| EINVAL)?,
    ))
}

/// The address space that a file's user mappings live in.
///
/// # Invariants
///
/// `0` is the `f_mapping` of an open file, on whose host inode (the
/// mapping's owner) this value holds a reference, dropped by `Drop`.
pub(crate) struct FileMapping(NonNull<bindings::address_space>);

// SAFETY: an address space may be used from any thread.
unsafe impl Send for FileMapping {}
// SAFETY: `zap` only calls `unmap_mapping_range`, which locks the mapping itself.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// The address space of `file`'s mappings.
    pub(crate) fn of(file: &File) -> Result<Self> {
        // SAFETY: an open file's mapping and its host live while it is open;
        // this takes a reference on the host inode, which owns the mapping.
        let m = unsafe {
            let m = (*raw(file)).f_mapping;
            bindings::ihold((*m).host);
            m
        };
        // INVARIANT: the mapping and the inode reference taken above.
        NonNull::new(m).map(Self).ok_or(EINVAL)
    }

    /// Removes every user mapping of bytes `off..off + len`; a later access
    /// faults again.
    pub(crate) fn zap(&self, off: u64, len: u64) {
        let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the mapping is valid by the type invariant.
        unsafe { bindings::unmap_mapping_range(self.0.as_ptr(), off, len, 1) };
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: by the type invariant we hold one reference on the host.
        unsafe { bindings::iput((*self.0.as_ptr()).host) };
    }
}

/// Regular files: whether an O_DIRECT read (or with `write`, write) of
/// `len` bytes at `pos` goes through the page cache, as the file system's
/// `STATX_DIOALIGN` tells: always, for a memory alignment of 0 (ext4
/// journalled data, inline data, verity...); for a range off its offset
/// alignment (`STATX_DIO_READ_ALIGN` for reads, where given: xfs writes a
/// copy-on-write file, a reflinked one, in whole allocation units and
/// serves a write off them through the page cache).
pub(crate) fn dio_falls_back(file: &File, pos: u64, len: u64, write: bool) -> bool {
    if file_type(file) != bindings::S_IFREG {
        return false;
    }
    let mut st = bindings::kstat::default();
    // SAFETY: an open file's path lives while it is open; `st` is ours.
    let r = unsafe {
        bindings::vfs_getattr(
            c::p2pdirect_file_path(raw(file)),
            &mut st,
            bindings::STATX_DIOALIGN | bindings::STATX_DIO_READ_ALIGN,
            bindings::AT_STATX_SYNC_AS_STAT,
        )
    };
    if r != 0 || st.result_mask & bindings::STATX_DIOALIGN == 0 {
        return false;
    }
    if st.dio_mem_align == 0 {
        return true;
    }
    let read_align = st.result_mask & bindings::STATX_DIO_READ_ALIGN != 0;
    let align = if !write && read_align && st.dio_read_offset_align != 0 {
        st.dio_read_offset_align
    } else {
        st.dio_offset_align
    };
    align > 1 && (pos | len) % u64::from(align) != 0
}

/// A file the kernel opened, dropped with `fput`.
struct KernelFile(NonNull<bindings::file>);

impl Drop for KernelFile {
    fn drop(&mut self) {
        // SAFETY: the reference `dentry_open` gave, dropped once.
        unsafe { bindings::fput(self.0.as_ptr()) };
    }
}

/// Whether the file has leases (`break_lease()`'s quick test, without a
/// lock): any kind, also ones a read-only open would not break.
pub(crate) fn has_leases(file: &File) -> bool {
    // SAFETY: the file is open, so its inode and lock context live.
    unsafe { c::p2pdirect_has_leases(raw(file)) }
}

/// Regular files: bytes of `[pos, pos + len)` in holes or unwritten extents
/// (what a direct read fills with zeros by the CPU), found with
/// `SEEK_DATA`/`SEEK_HOLE` on a private open of the same path, so that the
/// caller's file position stays.
pub(crate) fn hole_bytes(file: &File, pos: u64, len: u64) -> Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let end = i64::try_from(pos.checked_add(len).ok_or(EINVAL)?).map_err(|_| EINVAL)?;
    let mut p = i64::try_from(pos).map_err(|_| EINVAL)?;
    let flags = (bindings::O_RDONLY | bindings::O_LARGEFILE) as i32;
    // SAFETY: an open file's path lives while it is open; the credentials
    // are the calling task's own (`current_cred()`: only the task itself
    // changes them, so it reads them without RCU).
    let c = unsafe {
        let cred = (*kernel::task::Task::current_raw()).cred;
        bindings::dentry_open(c::p2pdirect_file_path(raw(file)), flags, cred)
    };
    let err = c as isize;
    if (-4095..0).contains(&err) {
        return Err(Error::from_errno(err as i32));
    }
    let c = KernelFile(NonNull::new(c).ok_or(ENOMEM)?);
    let seek = |at: i64, whence: u32| -> Result<Option<i64>> {
        // SAFETY: `c` is a file this function opened and holds.
        let r = unsafe { bindings::vfs_llseek(c.0.as_ptr(), at, whence as i32) };
        match r {
            r if r >= 0 => Ok(Some(r)),
            r if r == -i64::from(bindings::ENXIO) => Ok(None),
            r => Err(Error::from_errno(r as i32)),
        }
    };
    let mut holes = 0i64;
    while p < end {
        // No data at or after `p` (ENXIO), or only past the end: all hole.
        let data = match seek(p, bindings::SEEK_DATA)? {
            Some(d) if d < end => d,
            _ => {
                holes += end - p;
                break;
            }
        };
        // A file system's answers only move forward; one that does not (a
        // FUSE daemon's, say) ends the count, the rest counted as data.
        if data < p {
            break;
        }
        holes += data - p;
        match seek(data, bindings::SEEK_HOLE)?.ok_or(ENXIO)? {
            hole if hole > data => p = hole,
            _ => break,
        }
    }
    Ok(holes as u64)
}
