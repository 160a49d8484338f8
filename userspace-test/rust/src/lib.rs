// SPDX-License-Identifier: GPL-2.0
//! Safe userspace API of p2pdirect's `/dev/p2pdirect`.

#![warn(missing_docs)]

use std::{
    ffi::CStr,
    fmt,
    fs::OpenOptions,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    ptr::NonNull,
    sync::{
        atomic::{AtomicU64, Ordering},
        Once,
    },
};

pub mod sys;
pub mod uring;

/// Where the module's misc device appears.
pub const DEVICE_PATH: &str = "/dev/p2pdirect";

/// ABI and module version reported by the running module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// `P2PDIRECT_ABI_MAJOR` of the module: another than ours is another ABI.
    pub abi_major: u32,
    /// `P2PDIRECT_ABI_MINOR` of the module: each minor adds to the last.
    pub abi_minor: u32,
    /// The module's own version string.
    pub module: String,
}

impl Version {
    /// Whether a library built against this header can talk to that module:
    /// same major, and the module's minor at least ours.
    pub fn is_compatible(&self) -> bool {
        self.abi_major == sys::P2PDIRECT_ABI_MAJOR && self.abi_minor >= sys::P2PDIRECT_ABI_MINOR
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p2pdirect {} (ABI {}.{})",
            self.module, self.abi_major, self.abi_minor
        )
    }
}

/// An open `/dev/p2pdirect`.
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
}

impl Device {
    /// Opens `/dev/p2pdirect`.
    pub fn open() -> io::Result<Self> {
        Self::open_path(DEVICE_PATH)
    }

    /// Opens `/dev/p2pdirect` read-only: enough to look (version, providers,
    /// statistics without reset); everything else fails with `EBADF`.
    pub fn open_read_only() -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(DEVICE_PATH)?;
        Ok(Self { fd: file.into() })
    }

    /// Opens the misc device at `path`.
    pub fn open_path(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(Self { fd: file.into() })
    }

    /// `P2PDIRECT_IOC_GET_VERSION`.
    pub fn version(&self) -> io::Result<Version> {
        let mut v = sys::p2pdirect_version::default();
        // SAFETY: GET_VERSION writes exactly one `p2pdirect_version`, which `v` is.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_GET_VERSION.into(),
                std::ptr::from_mut(&mut v).cast(),
            )
        }?;
        // The module NUL-terminates inside the field; refuse a reply that is not.
        let bytes: Vec<u8> = v.module_version.iter().map(|&c| c as u8).collect();
        let module = CStr::from_bytes_until_nul(&bytes)
            .map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "module version not terminated")
            })?
            .to_string_lossy()
            .into_owned();
        Ok(Version {
            abi_major: v.abi_major,
            abi_minor: v.abi_minor,
            module,
        })
    }

    /// Issues an arbitrary ioctl on the device; the errno comes back as the error.
    ///
    /// # Safety
    /// `arg` must be valid for whatever the command `cmd` reads and writes, as
    /// the kernel would for a well-formed call, or be deliberately invalid (the
    /// kernel then fails with `EFAULT` without touching process memory).
    pub unsafe fn ioctl_raw(&self, cmd: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<i32> {
        // SAFETY: the fd is open for the lifetime of `self`; the caller vouches for `arg`.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), cmd, arg) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }
}

/// A PCI function address (domain, bus, device, function).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciAddr(pub u32);

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.0;
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{}",
            a >> 16,
            (a >> 8) & 0xff,
            (a >> 3) & 0x1f,
            a & 7
        )
    }
}

/// P2P reachability of one NVMe controller from a provider.
#[derive(Clone, Debug)]
pub struct Client {
    /// The NVMe controller's PCI function.
    pub pci_addr: PciAddr,
    /// The kernel's P2PDMA distance; `None` when the two cannot reach each other.
    pub distance: Option<u32>,
}

/// A device-memory provider (an emulated GPU's BAR, in the test VM).
#[derive(Clone, Debug)]
pub struct Provider {
    /// What [`Device::alloc`]'s `provider` names.
    pub index: u32,
    /// `sys::P2PDIRECT_PROVIDER_*`: a BAR p2pdirect manages, or memory
    /// another driver published (an NVMe CMB).
    pub kind: u32,
    /// The PCI function that provides the memory.
    pub pci_addr: PciAddr,
    /// The BAR that holds the memory.
    pub bar: u32,
    /// That BAR's size in bytes.
    pub bar_size: u64,
    /// PCI bus address of the memory's first byte.
    pub bus_addr: u64,
    /// Bytes p2pdirect can allocate from this provider.
    pub bytes_total: u64,
    /// Of which free now (for a published provider, an upper bound).
    pub bytes_free: u64,
    /// Of which the open files of `/dev/p2pdirect` hold now.
    pub bytes_used: u64,
    /// Reachability of each NVMe controller present.
    pub clients: Vec<Client>,
}

/// A device-memory allocation, owned by the [`Device`] that made it.
///
/// This is a description, not an owner: the memory lives until
/// [`Device::free`] of its handle or the close of the `Device`, and
/// dropping an `Allocation` frees nothing. Its handle is a number, like a
/// file descriptor: once freed, the next ALLOC of the same open file may
/// get the same number, so a copy kept past [`Device::free`] names the new
/// allocation (free each handle once, as each fd is closed once).
#[derive(Clone, Debug)]
pub struct Allocation {
    /// Names the allocation for FREE and EXPORT_DMABUF, in its open file only.
    pub handle: u64,
    /// Bytes, whole pages (the request rounded up).
    pub size: u64,
    /// Where [`Device::map`] maps it (`handle << 40`).
    pub mmap_offset: u64,
    /// PCI bus address of its first byte.
    pub bus_addr: u64,
    /// Its offset in the provider's memory.
    pub provider_offset: u64,
}

/// What a DMA probe found.
#[derive(Clone, Debug)]
pub struct DmaProbe {
    /// `sys::P2PDIRECT_CLIENT_*` of the client that claimed the range.
    pub client: u32,
    /// The page size of the memory, as the client reports it.
    pub page_size: u32,
    /// The DMA device the range was mapped for (the block device's).
    pub dma_device: PciAddr,
    /// (DMA address, length) pairs, at most 256 of them.
    pub segments: Vec<(u64, u64)>,
    /// All the segments of the mapping, also those past the 256 kept.
    pub total_segments: u32,
}

/// A CPU mapping of an allocation: the "device pointer".
///
/// Access goes through [`Mapping::read`] and [`Mapping::write`], never a
/// slice: a device may DMA into the memory at any time.
///
/// The memory can go while the mapping lives: [`Device::free`] of its
/// allocation (from any thread sharing the [`Device`], or any process sharing
/// its open file), or the GPU going away, zaps the mapping, and a later
/// `read` or `write` raises `SIGBUS`, as access to a memory-mapped file
/// truncated under its mapping does. Do not free memory another thread still
/// reads or writes through its mapping.
///
/// A mapping belongs to the process that made it: `fork()` does not copy
/// device memory mappings (the header's VM_DONTCOPY), so in a child the
/// address range is a hole that a later allocation may fill. There `read`
/// and `write` fail (`ErrorKind::Other`, saying so, touching nothing) and
/// dropping the mapping unmaps nothing. The child is told by `fork()`'s handlers
/// (`pthread_atfork`), so a child made by a raw `clone` system call is not.
#[derive(Debug)]
pub struct Mapping<'d> {
    ptr: NonNull<u8>,
    len: usize,
    /// [`FORK_GENERATION`] when the mapping was made.
    generation: u64,
    _dev: &'d Device,
}

/// How many `fork()`s separate this process from the one that first mapped
/// device memory: each child adds one (its `pthread_atfork` handler), so a
/// [`Mapping`] made before the fork sees a newer generation than its own.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers [`forked_child`] once per process, before its first mapping.
fn watch_forks() {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| {
        // SAFETY: the handler only bumps an atomic, which is
        // async-signal-safe, as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
}

impl Mapping<'_> {
    /// The device pointer, for handing to I/O.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapping's length in bytes (the allocation's size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has no bytes (never, for an allocation's).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this process made the mapping (not a `fork()` child).
    fn is_ours(&self) -> bool {
        self.generation == FORK_GENERATION.load(Ordering::Relaxed)
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        if !self.is_ours() {
            return Err(io::Error::other(format!(
                "the mapping at {:p} was made before fork(), which does not copy \
                 device memory mappings: nothing is there in this process",
                self.ptr
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range of {len} bytes at offset {offset} is outside the mapping of {} bytes",
                    self.len
                ),
            )),
        }
    }

    /// Copies `data` into device memory at `offset`, as `memcpy` does (the
    /// bounce baselines of `p2pd bench` copy this way, as applications do).
    /// Device memory is shared: what another mapping, process or a DMA
    /// writes into the same range meanwhile leaves a mix of both, and a
    /// copy racing such a writer is not defined beyond that; keep writers
    /// of one range apart (one I/O or copy at a time).
    pub fn write(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: the range lies inside the live mapping (checked above), which
        // does not overlap `data` (device memory is never a Rust allocation).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copies device memory at `offset` into `out` (what a writer changes
    /// meanwhile may show in part: see [`Mapping::write`]).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as in `write`, reading instead.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        // In a fork() child the range was never copied: what is there now
        // is someone else's.
        if !self.is_ours() {
            return;
        }
        // SAFETY: `ptr`/`len` are exactly what mmap returned in this
        // process; nothing else unmaps them.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl Device {
    /// `P2PDIRECT_IOC_LIST_PROVIDERS`: every provider and its reachability.
    pub fn providers(&self) -> io::Result<Vec<Provider>> {
        let mut req = sys::p2pdirect_list_providers::default();
        // SAFETY: a count-only request (capacity 0) writes just `req`.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_LIST_PROVIDERS.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        // Providers can come and go between the calls: ask with room to
        // spare, and again with more while the list outgrows the room.
        let mut raw = Vec::new();
        loop {
            raw.resize(
                req.count as usize + 4,
                sys::p2pdirect_provider_info::default(),
            );
            req.entries = raw.as_mut_ptr() as u64;
            req.capacity = raw.len() as u32;
            // SAFETY: `entries` has room for `capacity` structs.
            unsafe {
                self.ioctl_raw(
                    sys::P2PDIRECT_IOC_LIST_PROVIDERS.into(),
                    std::ptr::from_mut(&mut req).cast(),
                )
            }?;
            if req.count <= req.capacity {
                break;
            }
        }
        raw.truncate(req.count as usize);
        Ok(raw
            .iter()
            .map(|p| Provider {
                index: p.index,
                kind: p.kind,
                pci_addr: PciAddr(p.pci_addr),
                bar: p.bar,
                bar_size: p.bar_size,
                bus_addr: p.bus_addr,
                bytes_total: p.bytes_total,
                bytes_free: p.bytes_free,
                bytes_used: p.bytes_used,
                clients: p.clients[..(p.num_clients as usize).min(p.clients.len())]
                    .iter()
                    .map(|c| Client {
                        pci_addr: PciAddr(c.pci_addr),
                        distance: u32::try_from(c.distance).ok(),
                    })
                    .collect(),
            })
            .collect())
    }

    /// `P2PDIRECT_IOC_ALLOC`: `size` bytes (rounded up to pages) on
    /// `provider`, aligned to `alignment` (0: a page).
    pub fn alloc(&self, provider: u32, size: u64, alignment: u64) -> io::Result<Allocation> {
        let mut req = sys::p2pdirect_alloc {
            provider,
            size,
            alignment,
            ..Default::default()
        };
        // SAFETY: ALLOC reads and writes one `p2pdirect_alloc`.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_ALLOC.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        Ok(Allocation {
            handle: req.handle,
            size: req.size,
            mmap_offset: req.mmap_offset,
            bus_addr: req.bus_addr,
            provider_offset: req.provider_offset,
        })
    }

    /// `P2PDIRECT_IOC_FREE`: revokes the memory from every user at once. It
    /// never waits for I/O (an I/O in flight keeps its pages until it ends),
    /// but it does wait for kernel consumers' invalidation callbacks and for
    /// the fences of a dma-buf exported from the memory, a wait with no time
    /// limit (see the README's "Lifetime" and the header's EXPORT_DMABUF).
    ///
    /// Every [`Mapping`] of the allocation loses its pages: a later
    /// [`Mapping::read`] or [`Mapping::write`] raises `SIGBUS`.
    pub fn free(&self, handle: u64) -> io::Result<()> {
        let mut req = sys::p2pdirect_free { handle };
        // SAFETY: FREE reads one `p2pdirect_free`.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_FREE.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        Ok(())
    }

    /// `P2PDIRECT_IOC_EXPORT_DMABUF` (ABI 1.9): `size` bytes (0: to the end)
    /// from `offset` of allocation `handle` as a dma-buf for other drivers
    /// (an RDMA NIC's `ibv_reg_dmabuf_mr`). The fd is close-on-exec.
    pub fn export_dmabuf(&self, handle: u64, offset: u64, size: u64) -> io::Result<OwnedFd> {
        let mut req = sys::p2pdirect_export_dmabuf {
            handle,
            offset,
            size,
            flags: sys::P2PDIRECT_EXPORT_CLOEXEC,
            fd: -1,
        };
        // SAFETY: EXPORT_DMABUF reads and writes one `p2pdirect_export_dmabuf`.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_EXPORT_DMABUF.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        if req.fd < 0 {
            // Not the module's answer (another driver's node given to
            // open_path answering this number): nothing to own.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "EXPORT_DMABUF succeeded without a file descriptor (fd {})",
                    req.fd
                ),
            ));
        }
        // SAFETY: on success the kernel installed a new descriptor for us
        // (non-negative, checked above), which nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(req.fd) })
    }

    /// Maps an allocation of this device for CPU access.
    pub fn map(&self, a: &Allocation) -> io::Result<Mapping<'_>> {
        let too_big = |what: &str, v: u64| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("allocation {}: its {what} {v:#x} does not fit this process's address space (EINVAL)", a.handle),
            )
        };
        let len = usize::try_from(a.size).map_err(|_| too_big("size", a.size))?;
        // mmap64: a 32-bit process's off_t is 32 bits, too few for the
        // offsets of handles (handle << 40).
        let off = libc::off64_t::try_from(a.mmap_offset)
            .map_err(|_| too_big("mmap offset", a.mmap_offset))?;
        watch_forks();
        let generation = FORK_GENERATION.load(Ordering::Relaxed);
        // SAFETY: a new shared mapping of our fd; the kernel checks offset and length.
        let p = unsafe {
            libc::mmap64(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
            generation,
            _dev: self,
        })
    }

    /// `P2PDIRECT_IOC_DMA_PROBE`: runs the peer-memory path once for
    /// `[addr, addr + size)` against the DMA device of the block device open
    /// as `block_fd`, and reports which client claimed it and the DMA segments.
    pub fn dma_probe(&self, addr: *const u8, size: u64, block_fd: i32) -> io::Result<DmaProbe> {
        let mut segs = vec![sys::p2pdirect_dma_seg::default(); 256];
        let mut req = sys::p2pdirect_dma_probe {
            addr: addr as u64,
            size,
            fd: block_fd,
            segs: segs.as_mut_ptr() as u64,
            capacity: segs.len() as u32,
            ..Default::default()
        };
        // SAFETY: DMA_PROBE reads `req` and writes it and up to `capacity` segments.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_DMA_PROBE.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        segs.truncate((req.count as usize).min(segs.len()));
        Ok(DmaProbe {
            client: req.client,
            page_size: req.page_size,
            dma_device: PciAddr(req.dma_pci_addr),
            segments: segs.iter().map(|s| (s.addr, s.len)).collect(),
            total_segments: req.count,
        })
    }

    /// `P2PDIRECT_IOC_REGISTER`: pins `[addr, addr + size)` of device memory
    /// for reuse by I/O. Returns (registration id, `P2PDIRECT_CLIENT_*`).
    pub fn register(&self, addr: *const u8, size: u64, write: bool) -> io::Result<(u64, u32)> {
        let mut req = sys::p2pdirect_register {
            addr: addr as u64,
            size,
            flags: if write { sys::P2PDIRECT_REG_WRITE } else { 0 },
            ..Default::default()
        };
        // SAFETY: REGISTER reads and writes one `p2pdirect_register`.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_REGISTER.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        Ok((req.id, req.client))
    }

    /// `P2PDIRECT_IOC_DEREGISTER`: whether the registration was still live.
    pub fn deregister(&self, id: u64) -> io::Result<bool> {
        self.reg_id(sys::P2PDIRECT_IOC_DEREGISTER, id)
    }

    /// `P2PDIRECT_IOC_REG_QUERY`: whether the registration is live (false:
    /// the memory went away and the registration was invalidated).
    pub fn registration_live(&self, id: u64) -> io::Result<bool> {
        self.reg_id(sys::P2PDIRECT_IOC_REG_QUERY, id)
    }

    fn reg_id(&self, cmd: u32, id: u64) -> io::Result<bool> {
        let mut req = sys::p2pdirect_reg_id {
            id,
            ..Default::default()
        };
        // SAFETY: both commands read and write one `p2pdirect_reg_id`.
        unsafe { self.ioctl_raw(cmd.into(), std::ptr::from_mut(&mut req).cast()) }?;
        Ok(req.state == sys::P2PDIRECT_REG_LIVE)
    }

    /// `P2PDIRECT_IOC_READ`: moves `io.size` bytes at `io.file_offset` of the
    /// file or namespace `io.fd` (opened with `O_DIRECT`) into device memory.
    pub fn read(&self, io: &Io) -> io::Result<IoDone> {
        self.io(sys::P2PDIRECT_IOC_READ, io)
    }

    /// `P2PDIRECT_IOC_WRITE`: the other way, device memory into the file.
    pub fn write(&self, io: &Io) -> io::Result<IoDone> {
        self.io(sys::P2PDIRECT_IOC_WRITE, io)
    }

    fn io(&self, cmd: u32, io: &Io) -> io::Result<IoDone> {
        let (addr, flags) = io.addr_flags();
        let mut req = sys::p2pdirect_io {
            fd: io.fd,
            flags,
            addr,
            size: io.size,
            file_offset: io.file_offset,
            buf_offset: io.buf_offset,
            ..Default::default()
        };
        // SAFETY: READ and WRITE read and write one `p2pdirect_io`; the
        // memory they move data into is device memory the kernel resolves
        // and checks, never dereferenced here.
        unsafe { self.ioctl_raw(cmd.into(), std::ptr::from_mut(&mut req).cast()) }?;
        Ok(IoDone {
            bytes: req.bytes,
            p2p_bytes: req.p2p_bytes,
            bounce_bytes: req.bounce_bytes,
            zeroed_bytes: req.zeroed_bytes,
            dma_device: PciAddr(req.dma_pci_addr),
        })
    }

    /// `P2PDIRECT_IOC_STATS`: every row of the statistics; with `reset`,
    /// zeroes the counters after reading them.
    pub fn stats(&self, reset: bool) -> io::Result<Vec<Stat>> {
        // Room for every row there can be: a reset then resets them all.
        let mut rows =
            vec![sys::p2pdirect_stat::default(); sys::P2PDIRECT_STATS_MAX_ENTRIES as usize];
        let mut req = sys::p2pdirect_stats {
            entries: rows.as_mut_ptr() as u64,
            capacity: rows.len() as u32,
            flags: if reset { sys::P2PDIRECT_STATS_RESET } else { 0 },
            ..Default::default()
        };
        // SAFETY: STATS reads one `p2pdirect_stats` and writes at most
        // `capacity` entries into `rows`, which holds that many.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_STATS.into(),
                std::ptr::from_mut(&mut req).cast(),
            )
        }?;
        rows.truncate((req.count as usize).min(rows.len()));
        Ok(rows
            .iter()
            .map(|r| Stat {
                device: match r.kind {
                    sys::P2PDIRECT_STAT_PROVIDER => StatDevice::Provider(PciAddr(r.id)),
                    _ => StatDevice::Block {
                        major: r.id >> 20,
                        minor: r.id & 0xfffff,
                    },
                },
                reads: r.reads,
                writes: r.writes,
                errors: r.errors,
                bytes_read: r.bytes_read,
                bytes_written: r.bytes_written,
                p2p_bytes: r.p2p_bytes,
                bounce_bytes: r.bounce_bytes,
                zeroed_bytes: r.zeroed_bytes,
                pinned_bytes: r.pinned_bytes,
                lat_min_ns: r.lat_min_ns,
                lat_avg_ns: r.lat_avg_ns,
                lat_max_ns: r.lat_max_ns,
            })
            .collect())
    }

    /// The raw file descriptor, for tests that call mmap themselves.
    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// The device memory side of a READ or WRITE.
#[derive(Clone, Copy, Debug)]
pub enum Memory {
    /// A device pointer: an address inside a mapping of device memory. The
    /// kernel looks the address up when the command is issued (an io_uring
    /// command that goes to a worker, as every file WRITE does, after it was
    /// pushed), so keep the [`Mapping`] until the command completes: unmapped
    /// by then, the command fails with `EFAULT`, or moves another
    /// allocation's bytes if one was mapped at the same address meanwhile.
    Pointer(*const u8),
    /// A registration of this open device, by id.
    Registered(u64),
}

/// One READ or WRITE.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    /// The namespace or file, opened with `O_DIRECT`.
    pub fd: i32,
    /// The device memory read into or written from.
    pub memory: Memory,
    /// Bytes to move.
    pub size: u64,
    /// Where in the namespace or file, in bytes.
    pub file_offset: u64,
    /// Offset from the device pointer or the registration's start.
    pub buf_offset: u64,
    /// Bounce through host memory when the device cannot reach the memory.
    pub compat: bool,
}

impl Io {
    /// The `addr` and `flags` fields of the command's argument.
    fn addr_flags(&self) -> (u64, u32) {
        let (addr, flags) = match self.memory {
            Memory::Pointer(p) => (p as u64, 0),
            Memory::Registered(id) => (id, sys::P2PDIRECT_IO_REGISTERED),
        };
        let compat = if self.compat {
            sys::P2PDIRECT_IO_COMPAT
        } else {
            0
        };
        (addr, flags | compat)
    }
}

/// What a READ or WRITE did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoDone {
    /// Bytes moved (fewer than asked at the end of a file or namespace).
    pub bytes: u64,
    /// Moved by DMA between the NVMe device and device memory.
    pub p2p_bytes: u64,
    /// Moved through host memory (COMPAT).
    pub bounce_bytes: u64,
    /// Read from holes or unwritten extents (zeroed by the CPU).
    pub zeroed_bytes: u64,
    /// The PCI function that did the DMA.
    pub dma_device: PciAddr,
}

/// What a statistics row counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatDevice {
    /// A device-memory provider, by its BAR owner's PCI address.
    Provider(PciAddr),
    /// A block device.
    Block {
        /// The block device's major number.
        major: u32,
        /// Its minor number.
        minor: u32,
    },
}

impl fmt::Display for StatDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatDevice::Provider(a) => write!(f, "{a}"),
            StatDevice::Block { major, minor } => write!(f, "{major}:{minor}"),
        }
    }
}

/// One row of the statistics (see `struct p2pdirect_stat`).
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    /// The provider or block device the row counts for.
    pub device: StatDevice,
    /// READs that moved data or failed.
    pub reads: u64,
    /// WRITEs that moved data or failed.
    pub writes: u64,
    /// Of those, the ones that failed.
    pub errors: u64,
    /// Bytes READ moved.
    pub bytes_read: u64,
    /// Bytes WRITE moved.
    pub bytes_written: u64,
    /// Of both, moved device to device.
    pub p2p_bytes: u64,
    /// Of both, moved through host memory (COMPAT).
    pub bounce_bytes: u64,
    /// Of `bytes_read`, zeroed by the CPU (holes, unwritten extents).
    pub zeroed_bytes: u64,
    /// Device memory pinned now, in a provider's row (see `struct p2pdirect_stat`).
    pub pinned_bytes: u64,
    /// The fastest I/O, in ns (0 before the first).
    pub lat_min_ns: u64,
    /// The mean over all I/Os, in ns.
    pub lat_avg_ns: u64,
    /// The slowest I/O, in ns.
    pub lat_max_ns: u64,
}

/// The fill pattern of the test disks (ci/fill.py, nvme_util.h): the
/// 64-bit word at byte offset `8 * w` for seed `seed`, little-endian.
pub fn fill_word(w: u64, seed: u64) -> u64 {
    let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(seed);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 32)
}

/// Fills `out` with the fill pattern of bytes `pos..pos + out.len()`.
pub fn fill(out: &mut [u8], pos: u64, seed: u64) {
    for (i, b) in out.iter_mut().enumerate() {
        let o = pos.wrapping_add(i as u64);
        *b = (fill_word(o >> 3, seed) >> (8 * (o & 7))) as u8;
    }
}

/// Builds an ioctl number the way `<asm-generic/ioctl.h>` does.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> libc::c_ulong {
    ((dir << 30) | (size << 16) | (ty << 8) | nr) as libc::c_ulong
}
/// `_IOC_READ | _IOC_WRITE`.
pub const IOC_READ_WRITE: u32 = 3;
/// `_IOC_READ`.
pub const IOC_READ: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioc_matches_header_numbers() {
        // The header's own number, evaluated by clang, equals what _IOWR builds.
        let size = std::mem::size_of::<sys::p2pdirect_version>() as u32;
        assert_eq!(
            ioc(
                IOC_READ_WRITE,
                sys::P2PDIRECT_IOCTL_MAGIC.into(),
                sys::P2PDIRECT_IOCTL_BASE,
                size
            ),
            sys::P2PDIRECT_IOC_GET_VERSION.into()
        );
    }

    #[test]
    fn compatibility_rule() {
        let mut v = Version {
            abi_major: sys::P2PDIRECT_ABI_MAJOR,
            abi_minor: sys::P2PDIRECT_ABI_MINOR,
            module: "x".into(),
        };
        assert!(v.is_compatible());
        v.abi_major += 1;
        assert!(!v.is_compatible());
    }
}
