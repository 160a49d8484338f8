// SPDX-License-Identifier: GPL-2.0

//! The ffi room: the domain-facing wrappers over `crate::sys` (PCI
//! functions, user pins, I/O targets). The UAPI mirror is `crate::sys::uapi`
//! and user copies are made in ioctl.rs. Nothing here calls C: every call
//! into the kernel or the shim is made by `crate::sys`.

pub(crate) use crate::sys::blkdev::{DmaLeg, Limits};
pub(crate) use crate::sys::file::FileMapping;
pub(crate) use crate::sys::gup::{user_addr_is_p2pdma, Pages};
pub(crate) use crate::sys::pci_p2pdma::{
    add_bar as p2pdma_add_bar, bar_is_mem, HeldPages, MemEnabled, P2pMem,
};
use crate::sys::{blkdev::BlockDevice, dma::DmaMapping, file as sys_file, pci_p2pdma};

use kernel::{fs::File, pci, prelude::*, sync::aref::ARef};

/// A counted reference to a PCI function.
pub(crate) struct PciFunction(ARef<pci::Device>);

impl PciFunction {
    /// Takes a reference on a PCI device.
    pub(crate) fn from_pci(dev: &pci::Device) -> Self {
        Self(dev.into())
    }

    /// The function as the kernel crate's PCI device.
    pub(crate) fn as_pci(&self) -> &pci::Device {
        &self.0
    }

    /// Another counted reference, as the kernel crate's type.
    pub(crate) fn aref(&self) -> ARef<pci::Device> {
        self.0.clone()
    }

    /// Identifies the function while it is referenced (its `struct pci_dev`),
    /// as `sys::pci_notify` names devices.
    pub(crate) fn id(&self) -> usize {
        core::ptr::from_ref(self.as_pci()) as usize
    }

    /// The function's address, as `P2PDIRECT_PCI_ADDR()` encodes it.
    pub(crate) fn addr(&self) -> u32 {
        Self::addr_of(&self.0)
    }

    /// [`Self::addr`] of the kernel crate's PCI device, without taking a
    /// reference.
    pub(crate) fn addr_of(dev: &pci::Device) -> u32 {
        pci_p2pdma::pci_addr(dev)
    }

    /// The kernel's P2PDMA distance from this provider to `client`, or
    /// `None` when they cannot reach each other.
    pub(crate) fn p2p_distance(&self, client: &PciFunction) -> Option<u32> {
        pci_p2pdma::distance(&self.0, &client.0)
    }

    /// Every NVMe controller present now.
    pub(crate) fn nvme_controllers() -> Result<KVec<PciFunction>> {
        Self::wrap(pci_p2pdma::nvme_controllers()?)
    }

    /// Every function whose driver published P2PDMA memory (an NVMe CMB...).
    pub(crate) fn with_published_p2pmem() -> Result<KVec<PciFunction>> {
        Self::wrap(pci_p2pdma::with_published_p2pmem()?)
    }

    fn wrap(devs: KVec<ARef<pci::Device>>) -> Result<KVec<PciFunction>> {
        let mut out = KVec::with_capacity(devs.len(), GFP_KERNEL)?;
        for d in devs {
            out.push(Self(d), GFP_KERNEL)?;
        }
        Ok(out)
    }

    /// Whether the function's driver still publishes P2PDMA memory.
    pub(crate) fn has_published_p2pmem(&self) -> bool {
        pci_p2pdma::has_published_p2pmem(&self.0)
    }

    /// The memory BAR holding bus address `bus`: (index, bus start, size).
    pub(crate) fn bar_of_bus_addr(&self, bus: u64) -> Option<(u32, u64, u64)> {
        pci_p2pdma::bar_of_bus_addr(&self.0, bus)
    }
}

/// The device that does DMA for a consumer (an NVMe controller, for a block
/// device), which peer-memory contexts map pages for.
pub(crate) struct DmaDevice(Option<PciFunction>);

impl DmaDevice {
    /// A stand-in for unit tests of code that only passes the device along.
    #[cfg(CONFIG_KUNIT)]
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// DMA by the PCI function `dev`.
    pub(crate) fn of_pci(dev: &pci::Device) -> Self {
        Self(Some(PciFunction::from_pci(dev)))
    }

    /// The PCI function doing the DMA, if any.
    pub(crate) fn pci(&self) -> Option<&PciFunction> {
        self.0.as_ref()
    }

    /// The DMA devices of the block device open as file descriptor `fd` of
    /// the calling process, one per leg (one unless it is stacked: md, NVMe
    /// multipath), never empty: `EBADF`, `ENOTBLK`, or `ENODEV` (no PCI
    /// device under it).
    pub(crate) fn of_block_fd(fd: i32) -> Result<KVec<Self>> {
        let fd = u32::try_from(fd).map_err(|_| EBADF)?;
        let file = kernel::fs::file::LocalFile::fget(fd).map_err(|_| EBADF)?;
        let bdev = sys_file::block_device(&file)?;
        let legs = bdev.dma_legs()?;
        let mut out = KVec::with_capacity(legs.len(), GFP_KERNEL)?;
        for leg in &legs {
            out.push(Self(Some(PciFunction::from_pci(&leg.pci))), GFP_KERNEL)?;
        }
        if out.is_empty() {
            return Err(ENODEV);
        }
        Ok(out)
    }
}

/// One contiguous piece of a DMA mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DmaSeg {
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

/// Pinned pages of a user range of the calling process, optionally mapped
/// for one DMA device (a peer-memory client's range).
pub(crate) struct UserPin {
    pages: Pages,
    dma: Option<DmaMapping>,
}

impl UserPin {
    /// Pins `[addr, addr + len)` (P2PDMA pages allowed).
    pub(crate) fn new(addr: u64, len: u64, write: bool) -> Result<Self> {
        Ok(Self {
            pages: Pages::pin_user(addr, len, write)?,
            dma: None,
        })
    }

    /// Whether every pinned page is P2PDMA memory.
    pub(crate) fn is_p2pdma(&self) -> bool {
        self.pages.is_p2pdma()
    }

    /// The most pins any of the pages holds, this one's and every other
    /// holder's ([`Pages::most_pins`]).
    pub(crate) fn most_pins(&self) -> u32 {
        self.pages.most_pins()
    }

    /// Maps the pages for DMA by `dev`; `EBUSY` if they are mapped already,
    /// `EREMOTEIO` if it cannot reach them.
    pub(crate) fn dma_map(&mut self, dev: &PciFunction) -> Result {
        if self.dma.is_some() {
            return Err(EBUSY);
        }
        self.dma = Some(DmaMapping::new(&self.pages, dev.as_pci().as_ref())?);
        Ok(())
    }

    /// The DMA segments of the current mapping (none if unmapped).
    pub(crate) fn dma_segs(&self) -> Result<KVVec<DmaSeg>> {
        let mut out = KVVec::new();
        for (addr, len) in self.dma.iter().flat_map(DmaMapping::segments) {
            out.push(DmaSeg { addr, len }, GFP_KERNEL)?;
        }
        Ok(out)
    }

    /// Undoes `dma_map`.
    pub(crate) fn dma_unmap(&mut self) {
        self.dma = None;
    }

    /// Whether every pinned page lies in `len` bytes of `mem` from `off`.
    pub(crate) fn within(&self, mem: &P2pMem, off: usize, len: usize) -> bool {
        mem.range(off, len).is_ok()
            && mem
                .phys(off)
                .is_some_and(|phys| self.pages.all_within(phys, len as u64))
    }

    /// See [`Pages::single_provider_id`].
    pub(crate) fn single_provider_id(&self) -> Option<usize> {
        self.pages.single_provider_id()
    }

    /// Another reference to the pinned pages, for I/O: the pages stay
    /// pinned until every reference is gone.
    pub(crate) fn share(&self) -> Pages {
        self.pages.clone()
    }
}

/// The target of a READ or WRITE: a block device or a regular file with a
/// block device below, open in the calling process with O_DIRECT.
///
/// Only the file's I/O operations are used, never its position (`f_pos`).
pub(crate) struct IoFile(sys_file::IoTarget);

impl IoFile {
    /// Looks `fd` up in the calling process and checks it as read(2) or
    /// write(2) would (see the UAPI header for the errno of each case).
    pub(crate) fn from_fd(fd: i32, write: bool) -> Result<Self> {
        sys_file::open_for_io(fd, write).map(Self)
    }

    /// A raw block device (else a regular file).
    pub(crate) fn is_bdev(&self) -> bool {
        self.0.is_bdev()
    }

    /// The limits of the block device the I/O goes to.
    pub(crate) fn limits(&self) -> Limits {
        self.bdev().limits()
    }

    /// The block device the I/O goes to (a file's: its file system's).
    pub(crate) fn bdev(&self) -> &BlockDevice {
        self.0.bdev()
    }

    /// Raw block devices: whether the cache work before a direct I/O of the
    /// range may wait (dirty pages to write back; for a WRITE, cached pages
    /// to drop).
    pub(crate) fn bdev_cache_busy(&self, pos: u64, len: u64, write: bool) -> bool {
        sys_file::bdev_cache_busy(self.0.file(), pos, len, write)
    }

    /// Raw block devices: writes back cached dirty data of the range.
    pub(crate) fn bdev_sync(&self, pos: u64, len: u64) -> Result {
        sys_file::bdev_sync(self.0.file(), pos, len)
    }

    /// Raw block devices: the checks read(2)/write(2) make of a range
    /// (`rw_verify_area`: offsets, LSM, fanotify permission events).
    pub(crate) fn rw_verify(&self, pos: u64, len: u64, write: bool) -> Result {
        sys_file::rw_verify(self.0.file(), pos, len, write)
    }

    /// The access or modify event read(2)/write(2) send after moving data.
    pub(crate) fn notify(&self, write: bool) {
        sys_file::notify_rw(self.0.file(), write);
    }

    /// Files: whether the file system serves an O_DIRECT read (or write) of
    /// `len` bytes at `pos` through the page cache (CPU copies): ext4 with
    /// journalled data, or an xfs reflinked file written off its
    /// allocation unit.
    pub(crate) fn dio_falls_back(&self, pos: u64, len: u64, write: bool) -> bool {
        sys_file::dio_falls_back(self.0.file(), pos, len, write)
    }

    /// The bio operation of a READ or WRITE of the file: a write of a file
    /// opened `O_DSYNC` (or `O_SYNC`) is durable when it completes.
    pub(crate) fn bio_op(&self, write: bool) -> crate::sys::bio::Op {
        crate::sys::bio::Op::new(write, write && self.0.dsync())
    }

    /// Raw block devices: a cache flush of the device (after a WRITE of a
    /// file opened `O_DSYNC`, as `generic_write_sync()` does).
    pub(crate) fn bdev_flush(&self) -> Result {
        self.0.bdev_flush()
    }

    /// Raw block devices: drops cached data of the range (after a write).
    pub(crate) fn bdev_invalidate(&self, pos: u64, len: u64) {
        sys_file::bdev_invalidate(self.0.file(), pos, len);
    }

    /// Files: an O_DIRECT read or write of `len` bytes at `pos` from or into
    /// `pin` at `off`, through the file system. Returns bytes moved.
    pub(crate) fn rw(&self, pin: &Pages, off: u64, len: u64, pos: u64, write: bool) -> Result<u64> {
        crate::sys::fs::rw_sync(self.0.file(), pin, off, len, pos, write)
    }

    /// The file.
    pub(crate) fn file(&self) -> &File {
        self.0.file()
    }

    /// Files: bytes of `[pos, pos + len)` in holes or unwritten extents.
    pub(crate) fn hole_bytes(&self, pos: u64, len: u64) -> Result<u64> {
        sys_file::hole_bytes(self.0.file(), pos, len)
    }

    /// Whether an open of the file would find leases to break.
    pub(crate) fn has_leases(&self) -> bool {
        sys_file::has_leases(self.0.file())
    }
}
