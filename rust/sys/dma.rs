// SPDX-License-Identifier: GPL-2.0

//! Pages mapped for DMA by a device that is not the caller's own: a
//! scatter-gather table mapped with `dma_map_sgtable` (which knows P2PDMA
//! pages), unmapped when dropped.
//!
//! C header: [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)
//!
//! The kernel crate's `SGTable<Owned>` is tied to a device bound to the
//! caller's driver (its mapping is device-managed); here the device is
//! another driver's (an NVMe controller), held by reference.

use kernel::{
    bindings, device::Device, dma::DataDirection, error::to_result, prelude::*,
    scatterlist::SGTable, sync::aref::ARef,
};

use super::{c, gup::Pages};

/// Every mapping here is read and written by the device.
fn bidirectional() -> bindings::dma_data_direction {
    DataDirection::Bidirectional.into()
}

fn raw(dev: &Device) -> *mut bindings::device {
    // `Device` is `#[repr(transparent)]` over `Opaque<bindings::device>`, so a
    // reference to it points at the `struct device` itself.
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// Builds a scatter-gather table over `pages` (`offset` into the first,
/// `len` bytes).
///
/// # Safety
///
/// Every page pointer is valid and stays so while the table is used.
unsafe fn sg_from_pages(
    pages: &[*mut bindings::page],
    offset: u32,
    len: u64,
) -> Result<bindings::sg_table> {
    let mut sgt = bindings::sg_table::default();
    let n = u32::try_from(pages.len()).map_err(|_| EINVAL)?;
    let len = usize::try_from(len).map_err(|_| EINVAL)?;
    // SAFETY: `sgt` is ours and zeroed; the pages are valid (caller).
    to_result(unsafe {
        bindings::sg_alloc_table_from_pages_segment(
            &mut sgt,
            pages.as_ptr().cast_mut(),
            n,
            offset,
            len,
            u32::MAX,
            bindings::GFP_KERNEL_ACCOUNT,
        )
    })?;
    Ok(sgt)
}

/// Pages mapped for DMA by one device, in both directions.
///
/// # Invariants
///
/// `sgt` was built over `pages` and is mapped for `dev`; both are undone
/// only by `Drop`.
pub(crate) struct DmaMapping {
    sgt: bindings::sg_table,
    dev: ARef<Device>,
    _pages: Pages,
}

// SAFETY: the table is plain kernel memory owned here; unmapping may run on
// any thread.
unsafe impl Send for DmaMapping {}
// SAFETY: shared access only reads the table.
unsafe impl Sync for DmaMapping {}

impl DmaMapping {
    /// Maps `pages` for DMA by `dev`; an error (`EREMOTEIO` for P2PDMA pages
    /// it cannot reach) if the DMA layer refuses.
    pub(crate) fn new(pages: &Pages, dev: &Device) -> Result<Self> {
        let (list, offset, len) = pages.raw_parts();
        // SAFETY: `pages` holds its pages, and the mapping keeps a reference.
        let mut sgt = unsafe { sg_from_pages(list, offset, len) }?;
        // SAFETY: `dev` is a valid device; `sgt` was just built.
        let r = unsafe { bindings::dma_map_sgtable(raw(dev), &mut sgt, bidirectional(), 0) };
        if let Err(e) = to_result(r) {
            // SAFETY: built above and not mapped.
            unsafe { bindings::sg_free_table(&mut sgt) };
            return Err(e);
        }
        // INVARIANT: built over `pages` and mapped for `dev`.
        Ok(Self {
            sgt,
            dev: dev.into(),
            _pages: pages.clone(),
        })
    }

    /// The mapped segments: (DMA address, length).
    pub(crate) fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: the table is mapped (type invariant) and not changed while
        // `self` is borrowed.
        let table = unsafe { SGTable::from_raw(core::ptr::from_ref(&self.sgt).cast_mut()) };
        table.iter().map(|sg| (sg.dma_address(), sg.dma_len()))
    }
}

impl Drop for DmaMapping {
    fn drop(&mut self) {
        // SAFETY: mapped for `dev` (type invariant); unmapped and freed once.
        unsafe {
            bindings::dma_unmap_sgtable(raw(&self.dev), &mut self.sgt, bidirectional(), 0);
            bindings::sg_free_table(&mut self.sgt);
        }
    }
}

/// Whether `dev` can DMA to `page`: maps it and unmaps it again, through a
/// one-entry scatterlist on the stack (no allocation, so a refusal always
/// means the device cannot reach the page).
///
/// # Safety
///
/// `page` is a valid page held by the caller for the duration of the call.
pub(crate) unsafe fn test_map_page(dev: &Device, page: *mut bindings::page) -> Result {
    let mut sg = bindings::scatterlist::default();
    // SAFETY: `sg` is ours; this marks it as the one, last entry and points
    // it at the whole page the caller holds.
    unsafe {
        bindings::sg_init_table(&mut sg, 1);
        c::p2pdirect_sg_set_page(&mut sg, page, kernel::page::PAGE_SIZE as u32, 0);
    }
    let mut sgt = bindings::sg_table {
        sgl: &mut sg,
        nents: 1,
        orig_nents: 1,
    };
    let attrs = bindings::DMA_ATTR_SKIP_CPU_SYNC as usize;
    // SAFETY: `dev` is valid; `sgt` describes the entry above, which lives
    // until both calls returned.
    let r = unsafe { bindings::dma_map_sgtable(raw(dev), &mut sgt, bidirectional(), attrs) };
    if r == 0 {
        // SAFETY: mapped just above with the same arguments.
        unsafe { bindings::dma_unmap_sgtable(raw(dev), &mut sgt, bidirectional(), attrs) };
    }
    to_result(r)
}
