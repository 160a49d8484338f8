// SPDX-License-Identifier: GPL-2.0

//! Exporting device memory as dma-bufs that peers map for P2P DMA, with
//! revocation.
//!
//! [`export`] makes a dma-buf whose operations are those of an
//! [`Exporter`]: it decides which importers may attach, names the memory
//! (a P2PDMA provider and a physical range) each map covers, and maps it
//! for the CPU. The DMA addresses come from `dma_buf_phys_vec_to_sgt()`, so
//! they are right for the importer's device whichever way it reaches the
//! memory (the bus address behind a common switch, an IOMMU mapping through
//! the host bridge).
//!
//! [`Exported::revoke`] takes the memory away: under the buffer's
//! reservation lock it lets the exporter mark itself dead (so no map
//! succeeds after) and tells every importer through its
//! `invalidate_mappings` callback; mappings then go as each importer
//! unmaps, which the exporter sees through [`Exporter::unmapped`].
//!
//! C headers: [`include/linux/dma-buf.h`](srctree/include/linux/dma-buf.h),
//! [`include/linux/dma-buf-mapping.h`](srctree/include/linux/dma-buf-mapping.h)

use core::{marker::PhantomData, ptr::NonNull};
use kernel::{
    bindings, device,
    error::from_err_ptr,
    ffi::c_int,
    fs::File,
    mm::virt::VmaNew,
    new_mutex, pci,
    prelude::*,
    str::CStr,
    sync::{aref::ARef, Arc, Mutex},
    types::ForeignOwnable,
};

use super::{c, file::FileMapping, pci_p2pdma::P2pProvider};

/// A device asking to import a buffer (a `struct dma_buf_attachment`).
///
/// # Invariants
///
/// `att` is an attachment being attached or mapped, valid for `'a`.
pub(crate) struct Importer<'a> {
    att: NonNull<bindings::dma_buf_attachment>,
    _p: PhantomData<&'a bindings::dma_buf_attachment>,
}

impl Importer<'_> {
    /// Whether the importer accepts memory only peers can reach
    /// (`allow_peer2peer`).
    pub(crate) fn allows_p2p(&self) -> bool {
        // SAFETY: valid by the type invariant.
        unsafe { (*self.att.as_ptr()).peer2peer }
    }

    /// Whether the importer unmaps when told to (`invalidate_mappings`), so
    /// that a revocation ends in bounded time.
    pub(crate) fn revocable(&self) -> bool {
        // SAFETY: valid by the type invariant.
        unsafe { bindings::dma_buf_attach_revocable(self.att.as_ptr()) }
    }

    /// The importer's device name (`dev_name()`).
    pub(crate) fn name(&self) -> &CStr {
        // SAFETY: the attachment's device is valid while it is attached; a
        // registered device's name is a NUL-terminated string that lives as
        // long as the device.
        unsafe {
            let name = (*(*self.att.as_ptr()).dev).kobj.name;
            if name.is_null() {
                return c"(unnamed)";
            }
            CStr::from_char_ptr(name)
        }
    }

    /// Whether the importer's device can reach `provider`'s memory, as the
    /// P2PDMA core judges (its distance; the map itself then picks the bus
    /// address or the host bridge's mapping).
    pub(crate) fn reaches(&self, provider: &P2pProvider) -> bool {
        // SAFETY: the attachment's device is valid while it is attached.
        let dev = unsafe { device::Device::from_raw((*self.att.as_ptr()).dev) };
        // Only a PCI function itself (not a device below one, such as a USB
        // device behind its host controller): the map would fail.
        <&pci::Device>::try_from(dev).is_ok_and(|pdev| provider.reaches(pdev))
    }
}

/// Memory one map covers: `len` bytes at physical address `phys` of
/// `provider`.
pub(crate) struct MapRange {
    pub(crate) provider: P2pProvider,
    pub(crate) phys: u64,
    pub(crate) len: u64,
}

/// The operations of a kind of exported buffer.
pub(crate) trait Exporter: Send + Sync + Sized + 'static {
    /// Whether `importer` may attach.
    fn attach(&self, importer: &Importer<'_>) -> Result;
    /// The memory to map for `importer`, taking whatever hold keeps it from
    /// being reused until [`Exporter::unmapped`]. Called with the buffer's
    /// reservation lock held, so never at the same time as a revocation.
    fn map(&self, importer: &Importer<'_>) -> Result<MapRange>;
    /// A mapping `map` allowed went away (reservation lock held).
    fn unmapped(&self);
    /// Maps the buffer for the CPU into `vma` (its file offsets are offsets
    /// in the buffer).
    fn mmap(&self, vma: &VmaNew) -> Result;
    /// The buffer's file was released: nothing can reach the buffer any more.
    fn released(&self);
}

/// The live buffer, as [`Exported`] names it.
///
/// # Invariants
///
/// `buf` was returned by `dma_buf_export()` with operations `Ops<T>`; it is
/// valid until its `release` operation, which clears the link first.
struct RawBuf {
    buf: NonNull<bindings::dma_buf>,
    /// The user mappings of the buffer's file.
    mapping: FileMapping,
}

// SAFETY: a dma-buf is used from any thread; access is serialised by the
// buffer's reservation lock and the `Exported::link` mutex.
unsafe impl Send for RawBuf {}

/// An exporter's data and the buffer it backs.
#[pin_data]
pub(crate) struct Exported<T: Exporter> {
    #[pin]
    data: T,
    /// The buffer until it is released.
    #[pin]
    link: Mutex<Option<RawBuf>>,
}

impl<T: Exporter> Exported<T> {
    /// The exporter.
    pub(crate) fn data(&self) -> &T {
        &self.data
    }

    /// Revokes the buffer: `mark` runs under the reservation lock (the
    /// exporter marks itself dead there, so no map succeeds after), then
    /// every importer is told to unmap, fences are waited for and the CPU
    /// mappings of the buffer's file are zapped. Importers unmap in their own
    /// time ([`Exporter::unmapped`]). A released buffer only runs `mark`.
    pub(crate) fn revoke(&self, mark: impl FnOnce()) {
        let link = self.link.lock();
        let Some(raw) = link.as_ref() else {
            mark();
            return;
        };
        let buf = raw.buf.as_ptr();
        // SAFETY: the buffer is valid while the link holds it (its release
        // clears the link under this lock first); its reservation object
        // lives as long as it does.
        unsafe {
            let resv = (*buf).resv;
            // Without an acquire context the lock cannot fail (no `-EDEADLK`).
            bindings::dma_resv_lock(resv, core::ptr::null_mut());
            mark();
            bindings::dma_buf_invalidate_mappings(buf);
            bindings::dma_resv_wait_timeout(
                resv,
                bindings::dma_resv_usage_DMA_RESV_USAGE_BOOKKEEP,
                false,
                // MAX_SCHEDULE_TIMEOUT (LONG_MAX)
                kernel::ffi::c_ulong::MAX >> 1,
            );
            bindings::dma_resv_unlock(resv);
            raw.mapping.zap(0, (*buf).size as u64);
        }
    }
}

/// A new buffer's file, holding the reference `dma_buf_export()` gave:
/// install it in a file descriptor, or drop it (which releases the buffer).
pub(crate) struct NewBuf(ARef<File>);

impl NewBuf {
    /// The file, for `fd_install`.
    pub(crate) fn into_file(self) -> ARef<File> {
        self.0
    }
}

/// Exports `size` bytes with the operations of `data`, owned by `module`
/// (which the buffer's file holds). The file is opened read-write.
pub(crate) fn export<T: Exporter>(
    module: &'static ThisModule,
    data: impl PinInit<T, Error>,
    size: usize,
) -> Result<(Arc<Exported<T>>, NewBuf)> {
    let shared = Arc::pin_init(
        try_pin_init!(Exported {
            data <- data,
            link <- new_mutex!(None),
        }),
        GFP_KERNEL_ACCOUNT,
    )?;
    let info = bindings::dma_buf_export_info {
        exp_name: c"p2pdirect".as_char_ptr(),
        owner: module.as_ptr(),
        ops: &Ops::<T>::VTABLE,
        size,
        flags: bindings::O_RDWR as c_int,
        resv: core::ptr::null_mut(),
        priv_: shared.clone().into_foreign().cast(),
    };
    // SAFETY: `info` is complete; on success the buffer owns the reference
    // passed as `priv_` (dropped by `release`).
    let buf = match from_err_ptr(unsafe { bindings::dma_buf_export(&info) }) {
        Ok(b) => b,
        Err(e) => {
            // SAFETY: the export failed, so the reference is still ours.
            drop(unsafe { <Arc<Exported<T>> as ForeignOwnable>::from_foreign(info.priv_.cast()) });
            return Err(e);
        }
    };
    // SAFETY: `buf` is a new buffer with its file; we hold its only
    // reference, which the `ARef` takes over.
    let file = unsafe {
        let f = File::from_raw_file((*buf).file);
        ARef::from_raw(NonNull::from(f))
    };
    let mapping = FileMapping::of(&file)?;
    // INVARIANT: `buf` stays valid until `release`, which clears the link.
    *shared.link.lock() = Some(RawBuf {
        buf: NonNull::new(buf).ok_or(EINVAL)?,
        mapping,
    });
    Ok((shared, NewBuf(file)))
}

/// `dma_buf_ops` for buffers of `T`.
struct Ops<T>(PhantomData<T>);

impl<T: Exporter> Ops<T> {
    const VTABLE: bindings::dma_buf_ops = bindings::dma_buf_ops {
        attach: Some(Self::attach),
        map_dma_buf: Some(Self::map),
        unmap_dma_buf: Some(Self::unmap),
        release: Some(Self::release),
        mmap: Some(Self::mmap),
        ..pin_init::zeroed()
    };

    /// # Safety
    ///
    /// `buf` is a live buffer of these operations.
    unsafe fn data<'a>(
        buf: *mut bindings::dma_buf,
    ) -> <Arc<Exported<T>> as ForeignOwnable>::Borrowed<'a> {
        // SAFETY: the buffer owns a reference to its `Exported` until
        // `release`, and the caller's buffer is live.
        unsafe { <Arc<Exported<T>> as ForeignOwnable>::borrow((*buf).priv_.cast()) }
    }

    /// # Safety
    ///
    /// Called by the dma-buf core only.
    unsafe extern "C" fn attach(
        buf: *mut bindings::dma_buf,
        att: *mut bindings::dma_buf_attachment,
    ) -> c_int {
        // SAFETY: the core attaches to a live buffer of ours.
        let data = unsafe { Self::data(buf) };
        let Some(att) = NonNull::new(att) else {
            return EINVAL.to_errno();
        };
        // INVARIANT: the attachment being attached.
        let imp = Importer {
            att,
            _p: PhantomData,
        };
        match data.data.attach(&imp) {
            Ok(()) => 0,
            Err(e) => e.to_errno(),
        }
    }

    /// # Safety
    ///
    /// Called by the dma-buf core only, with the reservation lock held.
    unsafe extern "C" fn map(
        att: *mut bindings::dma_buf_attachment,
        dir: bindings::dma_data_direction,
    ) -> *mut bindings::sg_table {
        let Some(nn) = NonNull::new(att) else {
            return EINVAL.to_ptr();
        };
        // SAFETY: a mapped attachment belongs to a live buffer of ours.
        let data = unsafe { Self::data((*att).dmabuf) };
        // INVARIANT: the attachment being mapped.
        let imp = Importer {
            att: nn,
            _p: PhantomData,
        };
        let r = match data.data.map(&imp) {
            Ok(r) => r,
            Err(e) => return e.to_ptr(),
        };
        let (Ok(len), true) = (usize::try_from(r.len), r.len > 0) else {
            data.data.unmapped();
            return EINVAL.to_ptr();
        };
        let mut vec = bindings::phys_vec { paddr: r.phys, len };
        // SAFETY: the reservation lock is held (the core's contract); the
        // provider is valid while `r` lives (`P2pProvider`'s invariant: it
        // holds the memory); `vec` is read during the call.
        let sgt =
            unsafe { c::dma_buf_phys_vec_to_sgt(att, r.provider.as_ptr(), &mut vec, 1, len, dir) };
        if from_err_ptr(sgt).is_err() {
            data.data.unmapped();
        }
        sgt
    }

    /// # Safety
    ///
    /// Called by the dma-buf core only, with the reservation lock held, on
    /// a table `map` returned.
    unsafe extern "C" fn unmap(
        att: *mut bindings::dma_buf_attachment,
        sgt: *mut bindings::sg_table,
        dir: bindings::dma_data_direction,
    ) {
        // SAFETY: as promised by the core; the table came from
        // `dma_buf_phys_vec_to_sgt()` on this attachment.
        let data = unsafe {
            // `dma_buf_phys_vec_to_sgt()` zeroes `orig_nents` (no CPU list),
            // and `dma_buf_free_sgt()` frees the list by it, so on Linux 7.2
            // and 7.3 the scatterlist itself would leak (kmemleak): every
            // entry it allocated is a DMA entry, so `nents` is its size.
            (*sgt).orig_nents = (*sgt).nents;
            c::dma_buf_free_sgt(att, sgt, dir);
            Self::data((*att).dmabuf)
        };
        data.data.unmapped();
    }

    /// # Safety
    ///
    /// Called by the dma-buf core only, on a buffer being set up for a CPU
    /// mapping (`mmap` of its file).
    unsafe extern "C" fn mmap(
        buf: *mut bindings::dma_buf,
        vma: *mut bindings::vm_area_struct,
    ) -> c_int {
        // SAFETY: a live buffer of ours; `vma` is being set up by its file's
        // `mmap` (mmap lock held for writing).
        let (data, vma) = unsafe { (Self::data(buf), VmaNew::from_raw(vma)) };
        match data.data.mmap(vma) {
            Ok(()) => 0,
            Err(e) => e.to_errno(),
        }
    }

    /// # Safety
    ///
    /// Called by the dma-buf core only, once, when the buffer's file goes.
    unsafe extern "C" fn release(buf: *mut bindings::dma_buf) {
        // SAFETY: the buffer owns this reference (see `export`); this is its
        // last use.
        let shared =
            unsafe { <Arc<Exported<T>> as ForeignOwnable>::from_foreign((*buf).priv_.cast()) };
        *shared.link.lock() = None;
        shared.data.released();
    }
}
