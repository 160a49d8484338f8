// SPDX-License-Identifier: GPL-2.0

//! The file operations of `/dev/p2pdirect` (open, release, mmap, ioctl,
//! uring_cmd) and the ioctl dispatch: the entry points from userspace, and
//! the only place that reads or writes the UAPI structs.
//!
//! A command number encodes direction and argument size, so matching the whole
//! number refuses a caller built against another layout with `ENOTTY` before
//! any byte of its argument is read.
//!
//! Every argument is read and written back unchanged before the command
//! acts ([`arg`]), so that an argument the result cannot be copied into
//! (read-only memory) fails with `EFAULT` before anything happened.
//!
//! Open mode: a file opened read-only may only look (GET_VERSION,
//! LIST_PROVIDERS, STATS without RESET); everything that takes resources,
//! moves data or resets counters needs a writable open (`EBADF`, as write(2)
//! on a read-only descriptor).

use crate::{
    chardev::OpenFile,
    devmem::Kind,
    error::{eremoteio, refuse, stack_limit},
    ffi,
    peer_mem::{self, UserRange},
    stats::{Counters, Key},
    sys::{
        miscdev::MiscUringCmd,
        uapi,
        uring_cmd::{SqeFields, UringCmd},
    },
};
use kernel::{
    fs::{
        file::{flags, FileDescriptorReservation},
        File,
    },
    ioctl,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

#[vtable]
impl MiscDevice for OpenFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        OpenFile::new()
    }

    fn release(me: Pin<KBox<Self>>, _file: &File) {
        me.release();
    }

    fn mmap(me: Pin<&OpenFile>, _file: &File, vma: &VmaNew) -> Result {
        me.mmap(vma)
    }

    fn ioctl(me: Pin<&OpenFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        dispatch(&me, file, cmd, arg)
    }
}

impl MiscUringCmd for OpenFile {
    fn uring_cmd(me: Pin<&OpenFile>, file: &File, cmd: &mut UringCmd) -> Result<i32> {
        uring_cmd(&me, file, cmd)
    }
}

/// Reads the argument of a command and writes its first and last bytes back
/// as they were: `EFAULT` unless it is readable and writable (every page it
/// spans, at most two, holds one of them), before the command does
/// anything. Two bytes, not the whole struct: user copies are not free (an
/// emulated CPU moves them a byte at a time), and this runs on every I/O.
fn arg<T: FromBytes + AsBytes>(arg: usize) -> Result<T> {
    let v: T = copy_from_user(arg)?;
    let n = core::mem::size_of::<T>();
    copy_part_to_user(arg, &v, 0..1)?;
    copy_part_to_user(arg, &v, n - 1..n)?;
    Ok(v)
}

/// Writes bytes `part` of `value` to the same bytes of the struct at the
/// user address `arg`; `EFAULT` if they are not writable user memory.
fn copy_part_to_user<T: AsBytes>(arg: usize, value: &T, part: core::ops::Range<usize>) -> Result {
    let bytes = value.as_bytes().get(part.clone()).ok_or(EINVAL)?;
    let at = arg.checked_add(part.start).ok_or(EFAULT)?;
    UserSlice::new(UserPtr::from_addr(at), bytes.len())
        .writer()
        .write_slice(bytes)
}

/// Every command of the ABI.
const KNOWN: [u32; 12] = [
    uapi::P2PDIRECT_IOC_GET_VERSION,
    uapi::P2PDIRECT_IOC_LIST_PROVIDERS,
    uapi::P2PDIRECT_IOC_ALLOC,
    uapi::P2PDIRECT_IOC_FREE,
    uapi::P2PDIRECT_IOC_EXPORT_DMABUF,
    uapi::P2PDIRECT_IOC_DMA_PROBE,
    uapi::P2PDIRECT_IOC_REGISTER,
    uapi::P2PDIRECT_IOC_DEREGISTER,
    uapi::P2PDIRECT_IOC_REG_QUERY,
    uapi::P2PDIRECT_IOC_READ,
    uapi::P2PDIRECT_IOC_WRITE,
    uapi::P2PDIRECT_IOC_STATS,
];

/// Whether `cmd` may run on a file opened read-only.
fn read_only_ok(cmd: u32) -> bool {
    // STATS with RESET is refused by `stats` itself, on the one copy of the
    // argument it acts on.
    matches!(
        cmd,
        uapi::P2PDIRECT_IOC_GET_VERSION
            | uapi::P2PDIRECT_IOC_LIST_PROVIDERS
            | uapi::P2PDIRECT_IOC_STATS
    )
}

/// The command number `_IOWR(magic, base + nr, T)`.
const fn iowr<T>(nr: u32) -> u32 {
    ioctl::_IOWR::<T>(
        uapi::P2PDIRECT_IOCTL_MAGIC as u32,
        uapi::P2PDIRECT_IOCTL_BASE + nr,
    )
}

// The command numbers the header defines must be exactly what `_IOWR` with the
// (bindgen-checked) argument struct gives: direction and size agree with C.
const _: () = assert!(uapi::P2PDIRECT_IOC_GET_VERSION == iowr::<uapi::p2pdirect_version>(0));
const _: () =
    assert!(uapi::P2PDIRECT_IOC_LIST_PROVIDERS == iowr::<uapi::p2pdirect_list_providers>(1));
const _: () = assert!(uapi::P2PDIRECT_IOC_ALLOC == iowr::<uapi::p2pdirect_alloc>(2));
const _: () = assert!(uapi::P2PDIRECT_IOC_FREE == iowr::<uapi::p2pdirect_free>(3));
const _: () = assert!(uapi::P2PDIRECT_IOC_DMA_PROBE == iowr::<uapi::p2pdirect_dma_probe>(4));
const _: () = assert!(uapi::P2PDIRECT_IOC_REGISTER == iowr::<uapi::p2pdirect_register>(5));
const _: () = assert!(uapi::P2PDIRECT_IOC_DEREGISTER == iowr::<uapi::p2pdirect_reg_id>(6));
const _: () = assert!(uapi::P2PDIRECT_IOC_REG_QUERY == iowr::<uapi::p2pdirect_reg_id>(7));
const _: () = assert!(uapi::P2PDIRECT_IOC_READ == iowr::<uapi::p2pdirect_io>(8));
const _: () = assert!(uapi::P2PDIRECT_IOC_WRITE == iowr::<uapi::p2pdirect_io>(9));
const _: () = assert!(uapi::P2PDIRECT_IOC_STATS == iowr::<uapi::p2pdirect_stats>(10));
const _: () =
    assert!(uapi::P2PDIRECT_IOC_EXPORT_DMABUF == iowr::<uapi::p2pdirect_export_dmabuf>(11));

/// Whether `file` is open for writing: O_WRONLY or O_RDWR. Access mode 3
/// (ioctl only: neither read nor write) may only look, as O_RDONLY.
fn writable(file: &File) -> bool {
    let acc = file.flags() & flags::O_ACCMODE;
    acc == flags::O_WRONLY || acc == flags::O_RDWR
}

/// Handles one ioctl on `/dev/p2pdirect`; `arg` is the caller's argument pointer.
fn dispatch(me: &OpenFile, file: &File, cmd: u32, arg: usize) -> Result<isize> {
    let writable = writable(file);
    if !writable && !read_only_ok(cmd) {
        if !KNOWN.contains(&cmd) {
            return Err(unknown(cmd));
        }
        refuse!(
            EBADF,
            "ioctl 0x{:08x} needs /dev/p2pdirect opened for writing (O_RDWR)\n",
            cmd
        );
    }
    // The dma-buf gives read and write access to the memory, so does the
    // file it comes from: refused, as the rule above, before the argument
    // is read.
    if cmd == uapi::P2PDIRECT_IOC_EXPORT_DMABUF && file.flags() & flags::O_ACCMODE != flags::O_RDWR
    {
        refuse!(
            EBADF,
            "EXPORT_DMABUF refused: /dev/p2pdirect must be open O_RDWR (the dma-buf is read-write)\n"
        );
    }
    match cmd {
        uapi::P2PDIRECT_IOC_GET_VERSION => get_version(arg),
        uapi::P2PDIRECT_IOC_LIST_PROVIDERS => list_providers(arg),
        uapi::P2PDIRECT_IOC_ALLOC => alloc(me, file, arg),
        uapi::P2PDIRECT_IOC_FREE => free(me, arg),
        uapi::P2PDIRECT_IOC_DMA_PROBE => dma_probe(arg),
        uapi::P2PDIRECT_IOC_REGISTER => register(me, arg),
        uapi::P2PDIRECT_IOC_DEREGISTER => reg_id(arg, |id| me.deregister(id)),
        uapi::P2PDIRECT_IOC_REG_QUERY => reg_id(arg, |id| me.reg_state(id)),
        uapi::P2PDIRECT_IOC_READ => io(me, arg, false),
        uapi::P2PDIRECT_IOC_WRITE => io(me, arg, true),
        uapi::P2PDIRECT_IOC_EXPORT_DMABUF => export_dmabuf(me, arg),
        uapi::P2PDIRECT_IOC_STATS => stats(arg, !writable),
        _ => Err(unknown(cmd)),
    }
}

fn list_providers(arg: usize) -> Result<isize> {
    let mut req: uapi::p2pdirect_list_providers = self::arg(arg)?;
    // Freed memory that a pin of another driver's held (an O_DIRECT read
    // into the mapping) is given back first: that pin's end told nobody.
    crate::devmem::reap();
    let providers = crate::devmem::providers()?;
    let nvmes = ffi::PciFunction::nvme_controllers()?;
    let room = (req.capacity as usize).min(providers.len());
    let mut out = KVec::with_capacity(room, GFP_KERNEL)?;
    for p in providers.iter().take(room) {
        let usage = p.usage();
        let mut info = uapi::p2pdirect_provider_info {
            index: p.index,
            kind: match p.kind {
                Kind::Bar => uapi::P2PDIRECT_PROVIDER_BAR,
                Kind::Published => uapi::P2PDIRECT_PROVIDER_PUBLISHED,
            },
            pci_addr: p.pdev.addr(),
            bar: p.bar,
            bar_size: p.bar_size,
            bus_addr: p.bus_addr,
            bytes_total: usage.total,
            bytes_free: usage.total.saturating_sub(usage.used),
            bytes_used: usage.used,
            num_clients: 0,
            pad: 0,
            clients: [uapi::p2pdirect_client_info {
                pci_addr: 0,
                distance: 0,
            }; uapi::P2PDIRECT_MAX_CLIENTS as usize],
        };
        for (slot, nvme) in info.clients.iter_mut().zip(nvmes.iter()) {
            slot.pci_addr = nvme.addr();
            slot.distance = p
                .pdev
                .p2p_distance(nvme)
                .and_then(|d| i32::try_from(d).ok())
                .unwrap_or(-1);
            info.num_clients += 1;
        }
        out.push(info, GFP_KERNEL)?;
    }
    copy_slice_to_user(req.entries as usize, &out)?;
    req.count = u32::try_from(providers.len()).map_err(|_| EOVERFLOW)?;
    copy_to_user(arg, &req)?;
    Ok(0)
}

fn alloc(me: &OpenFile, file: &File, arg: usize) -> Result<isize> {
    let mut req: uapi::p2pdirect_alloc = self::arg(arg)?;
    if req.flags != 0 {
        return Err(EINVAL);
    }
    let (info, state) = me.alloc(file, req.provider, req.size, req.alignment)?;
    req.size = info.size;
    req.handle = info.handle;
    req.mmap_offset = info.mmap_offset;
    req.bus_addr = info.bus_addr;
    req.provider_offset = info.provider_offset;
    if let Err(e) = copy_to_user(arg, &req) {
        // The caller cannot learn the handle: undo rather than leak until close.
        me.unalloc(&state);
        return Err(e);
    }
    Ok(0)
}

/// The fd is reserved before and installed after the copy-out, so a caller
/// that cannot learn it gets no descriptor either. `dispatch` refused a file
/// not open O_RDWR already.
fn export_dmabuf(me: &OpenFile, arg: usize) -> Result<isize> {
    let mut req: uapi::p2pdirect_export_dmabuf = self::arg(arg)?;
    if req.flags & !uapi::P2PDIRECT_EXPORT_CLOEXEC != 0 {
        return Err(EINVAL);
    }
    let fd_flags = if req.flags & uapi::P2PDIRECT_EXPORT_CLOEXEC != 0 {
        flags::O_CLOEXEC
    } else {
        0
    };
    // The allocation and the range first: `EMFILE` only for an export that
    // would otherwise succeed (the buffer is released again then).
    let buf = me.export_dmabuf(req.handle, req.offset, req.size)?;
    let fd = FileDescriptorReservation::get_unused_fd_flags(fd_flags)?;
    req.fd = i32::try_from(fd.reserved_fd()).map_err(|_| EMFILE)?;
    copy_to_user(arg, &req)?;
    fd.fd_install(buf.into_file());
    Ok(0)
}

/// Runs acquire -> get_pages -> dma_map once and reports the DMA addresses;
/// dropping the claim unmaps, unpins and releases.
fn dma_probe(arg: usize) -> Result<isize> {
    let mut req: uapi::p2pdirect_dma_probe = self::arg(arg)?;
    if req.flags & !uapi::P2PDIRECT_PROBE_WRITE != 0 || req.pad != 0 {
        return Err(EINVAL);
    }
    let range = UserRange::new(req.addr, req.size)?;
    let legs = ffi::DmaDevice::of_block_fd(req.fd).inspect_err(|e| {
        let says = stack_limit(*e).is_some() || *e == ENODEV || *e == ENOTBLK;
        if !says || !crate::sys::ratelimit::allow() {
            return;
        }
        if let Some((max, what)) = stack_limit(*e) {
            pr_info!(
                "DMA_PROBE: the block device of fd {} is stacked past p2pdirect's limit: \
                 more than {max} {what}\n",
                req.fd
            );
        } else if *e == ENODEV {
            pr_info!(
                "DMA_PROBE: fd {} is a block device with no PCI device under it that \
                 p2pdirect can find (loop, RAM disk, or a stack over them; or its disk \
                 was removed)\n",
                req.fd
            );
        } else if *e == ENOTBLK {
            pr_info!("DMA_PROBE: fd {} is not a block device\n", req.fd);
        }
    })?;
    // Mapped for the first leg; the others (of a stacked device) must reach
    // the memory too.
    let (dev, others) = legs.split_first().ok_or(ENODEV)?;
    let mut claim = peer_mem::acquire(range).inspect_err(|e| {
        if *e == ENXIO && crate::sys::ratelimit::allow() {
            pr_info!(
                "{:#x}+{:#x} is not device memory: no peer-memory client claims it\n",
                req.addr,
                req.size
            );
        }
    })?;
    // Every client's memory, another module's too: no user call pins more.
    range.check_pin_cap()?;
    claim.get_pages(req.flags & uapi::P2PDIRECT_PROBE_WRITE != 0)?;
    // The legs of a stacked device: checked on the pages (a client of
    // another module gives none, and serves single devices only).
    let pages = if others.is_empty() {
        None
    } else {
        Some(claim.pages()?)
    };
    for leg in others.iter().filter_map(|d| d.pci()) {
        let Some(pages) = pages.as_ref() else {
            break;
        };
        if pages.reachable_by(leg.as_pci()).is_err() {
            refuse!(
                eremoteio(),
                "{} memory at {:#x} is not reachable by PCI device {:#x}, a leg of fd {} \
                 (P2P distance)\n",
                claim.client_name(),
                req.addr,
                leg.addr(),
                req.fd
            );
        }
    }
    drop(pages);
    let segs = claim.dma_map(dev).inspect_err(|e| {
        if *e == eremoteio() && crate::sys::ratelimit::allow() {
            pr_info!(
                "{} memory at {:#x} is not reachable by PCI device {:#x} (P2P distance)\n",
                claim.client_name(),
                req.addr,
                dev.pci().map_or(0, |p| p.addr())
            );
        }
    })?;
    let room = (req.capacity as usize).min(segs.len());
    let mut out = KVVec::with_capacity(room, GFP_KERNEL)?;
    for s in segs.iter().take(room) {
        out.push(
            uapi::p2pdirect_dma_seg {
                addr: s.addr,
                len: s.len,
            },
            GFP_KERNEL,
        )?;
    }
    req.count = u32::try_from(segs.len()).map_err(|_| EOVERFLOW)?;
    req.page_size = u32::try_from(claim.page_size()).map_err(|_| EOVERFLOW)?;
    req.client = claim.client_id;
    req.dma_pci_addr = dev.pci().map_or(0, |p| p.addr());
    // Released before the copies out, which may fault for long: a client's
    // invalidation or unregistering waits for the claim to go.
    drop(claim);
    // The probe's pin may have been the last on memory freed meanwhile.
    crate::devmem::reap();
    copy_slice_to_user(req.segs as usize, &out)?;
    copy_to_user(arg, &req)?;
    Ok(0)
}

fn register(me: &OpenFile, arg: usize) -> Result<isize> {
    let mut req: uapi::p2pdirect_register = self::arg(arg)?;
    if req.flags & !uapi::P2PDIRECT_REG_WRITE != 0 {
        return Err(EINVAL);
    }
    let write = req.flags & uapi::P2PDIRECT_REG_WRITE != 0;
    let (id, client) = me.register(req.addr, req.size, write)?;
    req.id = id;
    req.client = client;
    if let Err(e) = copy_to_user(arg, &req) {
        // The caller cannot learn the id: undo rather than pin until close.
        let _ = me.deregister(id);
        return Err(e);
    }
    Ok(0)
}

/// DEREGISTER and REG_QUERY: `op` maps an id to a state.
fn reg_id(arg: usize, op: impl FnOnce(u64) -> Result<u32>) -> Result<isize> {
    let mut req: uapi::p2pdirect_reg_id = self::arg(arg)?;
    if req.pad != 0 {
        return Err(EINVAL);
    }
    req.state = op(req.id)?;
    copy_to_user(arg, &req)?;
    Ok(0)
}

/// READ and WRITE: the outputs are written back only on success.
fn io(me: &OpenFile, arg: usize, write: bool) -> Result<isize> {
    let mut req: uapi::p2pdirect_io = self::arg(arg)?;
    if req.pad != 0 {
        return Err(EINVAL);
    }
    let done = crate::storage::run(
        me,
        &crate::storage::Request {
            fd: req.fd,
            flags: req.flags,
            addr: req.addr,
            size: req.size,
            file_offset: req.file_offset,
            buf_offset: req.buf_offset,
            write,
        },
    )?;
    req.bytes = done.bytes;
    req.p2p_bytes = done.p2p;
    req.bounce_bytes = done.bounced;
    req.zeroed_bytes = done.zeroed;
    req.dma_pci_addr = done.dma_pci;
    // The results only: `bytes` up to `pad` (the arguments are as read).
    let results = core::mem::offset_of!(uapi::p2pdirect_io, bytes)
        ..core::mem::offset_of!(uapi::p2pdirect_io, pad);
    copy_part_to_user(arg, &req, results)?;
    Ok(0)
}

/// io_uring READ and WRITE (`IORING_OP_URING_CMD`): the argument is read
/// from the 128-byte SQE; the bytes go to the CQE (see the UAPI header).
fn uring_cmd(me: &OpenFile, file: &File, cmd: &mut UringCmd) -> Result<i32> {
    let write = match cmd.op() {
        uapi::P2PDIRECT_URING_CMD_READ => false,
        uapi::P2PDIRECT_URING_CMD_WRITE => true,
        op => refuse!(ENOTTY, "io_uring command 0x{:08x} is unknown\n", op),
    };
    if !writable(file) {
        refuse!(
            EBADF,
            "io_uring READ/WRITE needs /dev/p2pdirect opened for writing (O_RDWR)\n"
        );
    }
    if cmd.cmd_flags() != 0 {
        refuse!(
            EINVAL,
            "io_uring command flags 0x{:x} are not supported (memory is named by addr)\n",
            cmd.cmd_flags()
        );
    }
    let sqe = cmd.sqe_fields();
    if sqe != SqeFields::default() {
        refuse!(
            EINVAL,
            "io_uring READ/WRITE: sqe->addr, len, buf_index and file_index are not used and \
             must be 0 (they are {:#x}, {}, {}, {})\n",
            sqe.addr,
            sqe.len,
            sqe.buf_index,
            sqe.file_index
        );
    }
    let Some(area) = cmd.payload() else {
        refuse!(
            EINVAL,
            "io_uring READ/WRITE needs a 128-byte SQE (IORING_SETUP_SQE128, or \
             IORING_OP_URING_CMD128 on an IORING_SETUP_SQE_MIXED ring)\n"
        );
    };
    let n = core::mem::size_of::<uapi::p2pdirect_uring_io>();
    let arg = uapi::p2pdirect_uring_io::from_bytes_copy(&area[..n]).ok_or(EINVAL)?;
    if !all_zero(&area[n..]) {
        refuse!(
            EINVAL,
            "io_uring READ/WRITE: the reserved bytes after struct p2pdirect_uring_io must be 0\n"
        );
    }
    crate::storage::submit_uring(
        me,
        &crate::storage::Request {
            fd: arg.fd,
            flags: arg.flags,
            addr: arg.addr,
            size: arg.size,
            file_offset: arg.file_offset,
            buf_offset: arg.buf_offset,
            write,
        },
        cmd,
    )
}

/// Whether every byte of `b` is 0. Read eight bytes at a time and or-ed
/// together rather than searched: on the path of every io_uring command, a
/// few loads and no branch per byte.
fn all_zero(b: &[u8]) -> bool {
    let (words, rest) = b.as_chunks::<8>();
    let acc = words
        .iter()
        .fold(0u64, |acc, w| acc | u64::from_ne_bytes(*w));
    acc == 0 && rest.iter().all(|&x| x == 0)
}

/// STATS: copies out what fits, counts all, resets on request.
fn stats(arg: usize, read_only: bool) -> Result<isize> {
    let mut req: uapi::p2pdirect_stats = self::arg(arg)?;
    // The open mode first, as for every command; RESET's is known only
    // once the argument is read.
    let reset = req.flags & uapi::P2PDIRECT_STATS_RESET != 0;
    if reset && read_only {
        refuse!(
            EBADF,
            "STATS with RESET needs /dev/p2pdirect opened for writing (O_RDWR)\n"
        );
    }
    if req.flags & !uapi::P2PDIRECT_STATS_RESET != 0 || req.pad != 0 {
        return Err(EINVAL);
    }
    // A reset takes out the counters of the rows it copies (the first
    // `capacity`) and reports what it took; if STATS fails they are put
    // back, so a reset loses no count nobody saw.
    let table = crate::stats::table();
    let capacity = req.capacity as usize;
    let taken = if reset {
        Some(table.take(capacity)?)
    } else {
        None
    };
    let copied = match &taken {
        Some(t) => stat_rows(t.iter().copied()),
        None => stat_rows(table.rows().take(capacity)),
    }
    .and_then(|rows| {
        // Counted after the rows were read: a row added meanwhile (rows are
        // only ever added) is in the count, so a caller that reads `count`
        // rows sees every row copied, and every count a RESET took.
        req.count = u32::try_from(table.len().max(rows.len())).map_err(|_| EOVERFLOW)?;
        copy_slice_to_user(req.entries as usize, &rows).and_then(|()| copy_to_user(arg, &req))
    });
    if let (Err(_), Some(taken)) = (&copied, taken) {
        table.put_back(&taken);
    }
    copied?;
    Ok(0)
}

/// The UAPI form of the statistics rows.
fn stat_rows(rows: impl Iterator<Item = (Key, Counters)>) -> Result<KVec<uapi::p2pdirect_stat>> {
    let mut out = KVec::new();
    for (k, c) in rows {
        let (kind, id) = match k {
            Key::Provider(a) => (uapi::P2PDIRECT_STAT_PROVIDER, a),
            Key::Block(d) => (uapi::P2PDIRECT_STAT_BLOCK, d),
        };
        out.push(
            uapi::p2pdirect_stat {
                kind,
                id,
                reads: c.reads,
                writes: c.writes,
                errors: c.errors,
                bytes_read: c.bytes_read,
                bytes_written: c.bytes_written,
                p2p_bytes: c.p2p,
                bounce_bytes: c.bounced,
                zeroed_bytes: c.zeroed,
                pinned_bytes: c.pinned,
                lat_min_ns: c.lat_min_ns(),
                lat_avg_ns: c.lat_avg_ns(),
                lat_max_ns: c.lat_max_ns(),
            },
            GFP_KERNEL,
        )?;
    }
    Ok(out)
}

/// Reads a UAPI struct from the user address `arg`; `EFAULT` if unreadable.
pub(crate) fn copy_from_user<T: FromBytes>(arg: usize) -> Result<T> {
    UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<T>())
        .reader()
        .read()
}

/// Copies a UAPI struct to the user address `arg`; `EFAULT` if it is not
/// writable user memory. The struct is written whole, padding included, so
/// callers build it from zeroed fields.
pub(crate) fn copy_to_user<T: AsBytes>(arg: usize, value: &T) -> Result {
    UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<T>())
        .writer()
        .write(value)
}

/// Copies a slice of UAPI structs to user memory at `arg`.
pub(crate) fn copy_slice_to_user<T: AsBytes>(arg: usize, values: &[T]) -> Result {
    let mut w = UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of_val(values)).writer();
    for v in values {
        w.write(v)?;
    }
    Ok(())
}

fn free(me: &OpenFile, arg: usize) -> Result<isize> {
    let req: uapi::p2pdirect_free = self::arg(arg)?;
    me.free(req.handle)?;
    Ok(0)
}

/// Says, rate-limited, why a command was refused, so a caller built against
/// another header learns what to fix.
fn unknown(cmd: u32) -> Error {
    let (ty, nr, size) = (
        ioctl::_IOC_TYPE(cmd),
        ioctl::_IOC_NR(cmd),
        ioctl::_IOC_SIZE(cmd),
    );
    if ty == u32::from(uapi::P2PDIRECT_IOCTL_MAGIC) && crate::sys::ratelimit::allow() {
        pr_warn!(
            "ioctl 0x{:08x} (nr 0x{:02x}, size {}) is not a command of ABI {}.{}; \
             was the caller built against another p2pdirect.h?\n",
            cmd,
            nr,
            size,
            uapi::P2PDIRECT_ABI_MAJOR,
            uapi::P2PDIRECT_ABI_MINOR
        );
    }
    ENOTTY
}

fn get_version(arg: usize) -> Result<isize> {
    let mut out = uapi::p2pdirect_version {
        abi_major: uapi::P2PDIRECT_ABI_MAJOR,
        abi_minor: uapi::P2PDIRECT_ABI_MINOR,
        module_version: [0; uapi::P2PDIRECT_MODULE_VERSION_LEN as usize],
    };
    // Keep the last byte as the terminating NUL.
    let len = crate::MODULE_VERSION
        .len()
        .min(out.module_version.len() - 1);
    for (dst, src) in out
        .module_version
        .iter_mut()
        .zip(&crate::MODULE_VERSION.as_bytes()[..len])
    {
        *dst = *src as kernel::ffi::c_char;
    }
    // Output only: nothing happens, so no need to probe before.
    copy_to_user(arg, &out)?;
    Ok(0)
}
