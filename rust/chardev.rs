// SPDX-License-Identifier: GPL-2.0

//! `/dev/p2pdirect`: the misc device and its per-open-file state. Its file
//! operations (the entry points from userspace) are in `ioctl.rs`.
//!
//! The node is created by devtmpfs with mode 0600 (root only), the misc core's
//! default; administrators widen it with a udev rule, never the module.

use crate::{
    devmem::{AllocInfo, AllocState, Allocation},
    error::refuse,
    ffi::FileMapping,
    registration::{self, FileRegs, RegIndex},
    storage::{DmaHints, IoOwner, UringShared},
    sys::{dma_buf::NewBuf, miscdev::OwnedMiscDevice, vma},
};
use kernel::{
    fs::File,
    miscdevice::MiscDeviceOptions,
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

/// The registration the crate root holds: its open files (and so their
/// mappings) hold the module, so `rmmod` fails with EBUSY while one lives.
pub(crate) type Registration = OwnedMiscDevice<OpenFile>;

/// Registers `/dev/p2pdirect`.
pub(crate) fn register(module: &'static ThisModule) -> impl PinInit<Registration, Error> {
    OwnedMiscDevice::register(MiscDeviceOptions { name: c"p2pdirect" }, module)
}

/// State of one open file description of `/dev/p2pdirect`: what it owns is
/// released when it closes (or its process exits).
#[pin_data]
pub(crate) struct OpenFile {
    /// Device-memory allocations of this file (lock order: see devmem).
    #[pin]
    allocs: Mutex<KVVec<Allocation>>,
    /// Registrations of this file (lock order: see registration).
    #[pin]
    regs: Mutex<FileRegs>,
    /// The same by id, for I/O (changed under `regs`, read with no lock).
    #[pin]
    reg_index: RegIndex,
    /// This file's io_uring commands in flight.
    uring: Arc<UringShared>,
    /// The DMA devices of the block devices of its I/O (see storage).
    #[pin]
    dma_hints: DmaHints,
}

impl IoOwner for OpenFile {
    fn registration_pages(
        &self,
        id: u64,
        check: &dyn Fn(&registration::RegEntry) -> Result,
    ) -> Result<crate::ffi::Pages> {
        registration::io_pages(&self.reg_index, id, check)
    }

    fn dma_hints(&self) -> &DmaHints {
        &self.dma_hints
    }

    fn uring(&self) -> &Arc<UringShared> {
        &self.uring
    }
}

impl OpenFile {
    /// P2PDIRECT_IOC_ALLOC. The memory is carved and zeroed before the
    /// file's list is locked (zeroing a large allocation takes a while).
    pub(crate) fn alloc(
        &self,
        file: &File,
        provider: u32,
        size: u64,
        align: u64,
    ) -> Result<(AllocInfo, Arc<AllocState>)> {
        // What is wrong in the argument itself before what it names
        // (`Allocation::new` relies on it).
        crate::devmem::check_alloc_args(size, align)?;
        let Some(provider) = crate::devmem::provider(provider) else {
            refuse!(
                ENODEV,
                "ALLOC refused: no provider {provider} (P2PDIRECT_IOC_LIST_PROVIDERS lists them)\n"
            );
        };
        let (alloc, info) = Allocation::new(provider, size, align, FileMapping::of(file)?)?;
        let state = alloc.state.clone();
        let mut allocs = self.allocs.lock();
        if let Err(e) = allocs.reserve(1, GFP_KERNEL_ACCOUNT) {
            drop(allocs);
            alloc.free();
            return Err(e.into());
        }
        allocs.push_within_capacity(alloc).map_err(|_| ENOMEM)?;
        Ok((info, state))
    }

    /// Undoes an ALLOC whose result could not reach the caller: frees that
    /// very allocation (its handle may already name another one).
    pub(crate) fn unalloc(&self, state: &Arc<AllocState>) {
        let alloc = {
            let mut allocs = self.allocs.lock();
            let Some(i) = allocs.iter().position(|a| Arc::ptr_eq(&a.state, state)) else {
                return;
            };
            allocs.remove(i).ok()
        };
        if let Some(a) = alloc {
            a.free();
        }
    }

    /// P2PDIRECT_IOC_REGISTER: returns (id, client).
    pub(crate) fn register(&self, addr: u64, size: u64, write: bool) -> Result<(u64, u32)> {
        let cap = crate::max_pinned_bytes();
        registration::register(&self.regs, &self.reg_index, addr, size, write, cap)
    }

    /// P2PDIRECT_IOC_DEREGISTER: returns the state the registration had.
    pub(crate) fn deregister(&self, id: u64) -> Result<u32> {
        let (state, gone) = registration::deregister(&mut self.regs.lock(), &self.reg_index, id)?;
        // With the file's registration lock let go: waits for a grace period.
        drop(gone);
        Ok(state)
    }

    /// P2PDIRECT_IOC_REG_QUERY.
    pub(crate) fn reg_state(&self, id: u64) -> Result<u32> {
        registration::query(&self.regs.lock(), id)
    }

    /// P2PDIRECT_IOC_FREE: revokes the memory from every user at once and
    /// never waits for I/O (see devmem).
    pub(crate) fn free(&self, handle: u64) -> Result {
        let alloc = {
            let mut allocs = self.allocs.lock();
            let i = allocs
                .iter()
                .position(|a| a.handle() == handle)
                .ok_or(ENOENT)?;
            allocs.remove(i).map_err(|_| ENOENT)?
        };
        alloc.free();
        Ok(())
    }
}

impl OpenFile {
    /// P2PDIRECT_IOC_EXPORT_DMABUF: the new dma-buf's file.
    pub(crate) fn export_dmabuf(&self, handle: u64, offset: u64, size: u64) -> Result<NewBuf> {
        let state = {
            let allocs = self.allocs.lock();
            let a = allocs.iter().find(|a| a.handle() == handle).ok_or(ENOENT)?;
            a.state.clone()
        };
        crate::dmabuf::export(state, offset, size)
    }
}

impl OpenFile {
    /// A new open file's state (`open(2)`).
    pub(crate) fn new() -> Result<Pin<KBox<Self>>> {
        KBox::try_pin_init(
            try_pin_init!(OpenFile {
                allocs <- new_mutex!(KVVec::new()),
                regs <- new_mutex!(FileRegs::new()),
                reg_index <- RegIndex::new(),
                uring: Arc::pin_init(UringShared::new(), GFP_KERNEL_ACCOUNT)?,
                dma_hints <- DmaHints::new(),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// The last close (or the process's exit): gives back what the file
    /// owns.
    pub(crate) fn release(&self) {
        // Own registrations first: they may pin this file's own memory.
        registration::drop_all(&mut self.regs.lock(), &self.reg_index);
        let allocs = core::mem::take(&mut *self.allocs.lock());
        for a in allocs {
            a.free();
        }
    }

    /// Maps one allocation, named by the `mmap_offset` ALLOC returned, whole.
    pub(crate) fn mmap(&self, vma: &VmaNew) -> Result {
        crate::devmem::check_mapping(vma)?;
        let offset = vma::vma_offset(vma);
        let len = (vma.end() - vma.start()) as u64;
        let allocs = self.allocs.lock();
        let Some(a) = allocs.iter().find(|a| a.state.mmap_offset() == offset) else {
            refuse!(
                EINVAL,
                "mmap refused: offset {:#x} is no allocation of this file\n",
                offset
            );
        };
        if len != a.state.size {
            refuse!(
                EINVAL,
                "mmap refused: length {:#x}, allocation {} is {:#x} bytes\n",
                len,
                a.handle(),
                a.state.size
            );
        }
        crate::devmem::seal_mapping(vma);
        a.map(vma)
    }
}
