// SPDX-License-Identifier: GPL-2.0

//! P2PDIRECT_IOC_EXPORT_DMABUF: a range of an allocation as a dma-buf that
//! other drivers (RDMA NICs, GPUs) import for peer-to-peer DMA.
//!
//! An export subscribes to its allocation like a registration does. The
//! revocation of the allocation (FREE, close, device removal) revokes the
//! dma-buf: under its reservation lock the export is marked dead, every
//! importer is told to unmap (`invalidate_mappings`), and CPU mappings of
//! the dma-buf are zapped. Each importer mapping holds the allocation's
//! memory ([`Hold`]): it returns to the provider only once every importer
//! unmapped, and device removal waits for that like for a pin.
//!
//! Importers may go on DMAing until the fences on the buffer retire, even
//! once they unmapped from their callback: revocation holds the memory
//! itself until its fence wait returned.
//!
//! Lock order: see `error.rs`.

use crate::{
    devmem::{self, AllocState, Consumer, Hold},
    error::{eopnotsupp, eremoteio, refuse},
    stats::Pinned,
    sys::{
        dma_buf::{self, Exported, Exporter, Importer, MapRange, NewBuf},
        vma::{self, DeviceMapping, Fault, FaultSlot},
    },
};
use kernel::{
    mm::virt::VmaNew,
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        atomic::{Acquire, Atomic, Relaxed, Release},
        Arc, Mutex,
    },
};

/// Subscription ids of exports: disjoint from registration ids (which count
/// up from 1).
static NEXT_ID: Atomic<u64> = Atomic::new(1 << 63);

/// One exported range.
#[pin_data]
pub(crate) struct Export {
    alloc: Arc<AllocState>,
    offset: u64,
    size: u64,
    id: u64,
    /// Set under the reservation lock by revocation: no map after it.
    revoked: Atomic<bool>,
    /// One per importer mapping alive, each counted in the provider's
    /// `pinned_bytes` (STATS).
    #[pin]
    holds: Mutex<KVec<(Hold, Pinned)>>,
}

/// The CPU view of an export (its `mmap`), faulting pages in from the
/// allocation while it lives.
struct CpuView {
    alloc: Arc<AllocState>,
    offset: u64,
    size: u64,
}

impl DeviceMapping for CpuView {
    fn fault(&self, offset: u64, slot: FaultSlot<'_>) -> Fault {
        if offset >= self.size {
            return Fault::Gone;
        }
        self.alloc.fault_at(self.offset + offset, slot)
    }
}

/// The allocation under `[addr, addr + len)` of the calling process when
/// that range lies in one CPU mapping of an exported dma-buf (the memory is
/// the allocation's: it is p2pdirect's own device memory, whose FREE and
/// removal must reach what pins it); `None` if it is in no such mapping;
/// `EFAULT` if it runs out of one.
pub(crate) fn user_range(addr: u64, len: u64) -> Result<Option<Arc<AllocState>>> {
    match vma::lookup::<CpuView>(addr, len) {
        vma::Lookup::Elsewhere => Ok(None),
        vma::Lookup::Inside(view, off) if off.checked_add(len).is_some_and(|e| e <= view.size) => {
            Ok(Some(view.alloc.clone()))
        }
        vma::Lookup::Inside(..) | vma::Lookup::Straddles => refuse!(
            EFAULT,
            "{:#x}+{:#x} runs out of a dma-buf mapping of device memory\n",
            addr,
            len
        ),
    }
}

impl Exporter for Export {
    fn attach(&self, imp: &Importer<'_>) -> Result {
        // First: a static importer (dma_buf_attach()) has neither, and what
        // it lacks first is the callback.
        if !imp.revocable() {
            refuse!(
                eopnotsupp(),
                "dma-buf attach refused: {} cannot be revoked (a static importer, or no \
                 invalidate_mappings callback)\n",
                imp.name()
            );
        }
        if !imp.allows_p2p() {
            refuse!(
                eopnotsupp(),
                "dma-buf attach refused: {} does not accept peer-to-peer memory (allow_peer2peer)\n",
                imp.name()
            );
        }
        if self.revoked.load(Acquire) {
            refuse!(ENODEV, "dma-buf attach refused: the memory was freed\n");
        }
        // A hold taken and dropped at once: the provider is only needed now.
        let r = self.alloc.hold_range(self.offset, self.size)?;
        if !imp.reaches(&r.provider) {
            refuse!(
                eremoteio(),
                "dma-buf attach refused: {} cannot reach the memory (no P2P path to {:#x})\n",
                imp.name(),
                r.phys
            );
        }
        Ok(())
    }

    fn map(&self, imp: &Importer<'_>) -> Result<MapRange> {
        if self.revoked.load(Acquire) {
            return Err(ENODEV);
        }
        // Attach checked this; the memory cannot have moved since, but a
        // later check costs little and keeps a bad map out.
        let r = self.alloc.hold_range(self.offset, self.size)?;
        if !imp.reaches(&r.provider) {
            return Err(eremoteio());
        }
        let pinned = Pinned::new(self.alloc.provider.pdev.addr(), self.size);
        // In whatever task the importer maps from (a kworker, another
        // process): charged to none.
        self.holds.lock().push((r.hold, pinned), GFP_KERNEL)?;
        Ok(MapRange {
            provider: r.provider,
            phys: r.phys,
            len: self.size,
        })
    }

    fn unmapped(&self) {
        let hold = self.holds.lock().pop();
        // Outside the lock: the last hold of revoked memory gives it back.
        drop(hold);
    }

    fn mmap(&self, vma: &VmaNew) -> Result {
        devmem::check_mapping(vma)?;
        if self.revoked.load(Acquire) {
            refuse!(ENODEV, "dma-buf mmap refused: the memory was freed\n");
        }
        let view = Arc::new(
            CpuView {
                alloc: self.alloc.clone(),
                offset: self.offset,
                size: self.size,
            },
            GFP_KERNEL_ACCOUNT,
        )?;
        devmem::seal_mapping(vma);
        vma.set_mixedmap();
        vma::install(vma, view);
        Ok(())
    }

    fn released(&self) {
        self.alloc.unsubscribe(self.id);
    }
}

impl Consumer for Exported<Export> {
    fn consumer_id(&self) -> u64 {
        self.data().id
    }

    fn waits(&self) -> bool {
        true
    }

    fn invalidate(&self) {
        // Importers may DMA until their fences retire, even after they
        // unmapped from their callback: hold the memory until the fence
        // wait in `revoke` returned.
        let hold = self.data().alloc.hold_dying();
        self.revoke(|| self.data().revoked.store(true, Release));
        drop(hold);
    }
}

/// Exports `size` bytes (0: to the end) from `offset` of `alloc`.
pub(crate) fn export(alloc: Arc<AllocState>, offset: u64, size: u64) -> Result<NewBuf> {
    let page = PAGE_SIZE as u64;
    let size = if size == 0 {
        alloc.size.checked_sub(offset).ok_or(EINVAL)?
    } else {
        size
    };
    if offset % page != 0 || size % page != 0 || size == 0 {
        refuse!(
            EINVAL,
            "EXPORT_DMABUF refused: offset {:#x} and size {:#x} must be whole pages\n",
            offset,
            size
        );
    }
    match offset.checked_add(size) {
        Some(end) if end <= alloc.size => {}
        _ => refuse!(
            EINVAL,
            "EXPORT_DMABUF refused: {:#x}+{:#x} runs past the allocation's {:#x} bytes\n",
            offset,
            size,
            alloc.size
        ),
    }
    let len = usize::try_from(size).map_err(|_| EINVAL)?;
    let id = NEXT_ID.fetch_add(1, Relaxed);
    let data = try_pin_init!(Export {
        alloc,
        offset,
        size,
        id,
        revoked: Atomic::new(false),
        holds <- new_mutex!(KVec::new()),
    });
    let (exported, file) = dma_buf::export(crate::this_module(), data, len)?;
    let alloc = exported.data().alloc.clone();
    // A revocation before this point found no subscriber: `subscribe`
    // fails then, and dropping the file releases the buffer.
    if let Err(e) = alloc.subscribe(exported) {
        if e == EFAULT {
            refuse!(
                ENODEV,
                "EXPORT_DMABUF refused: the allocation's memory was revoked (FREE, device \
                 removal or driver unbind)\n"
            );
        }
        return Err(e);
    }
    Ok(file)
}
