// SPDX-License-Identifier: GPL-2.0

//! User mappings of device memory whose pages the owner can take back.
//!
//! [`install`] gives a VMA set up by a driver's `mmap` a reference-counted
//! object `T: DeviceMapping` and `vm_operations_struct` of its own: each VMA
//! (the first one, and those made from it by a split or `mremap`) holds one
//! reference, dropped when the VMA closes. A page fault, e.g. after
//! `MADV_DONTNEED` zapped the pages, asks `T` for the page again; `T` answers
//! from behind its own lock, so that revoking (taking the lock, marking the
//! memory gone, then zapping) can never race with a fault that maps the page
//! back. After revocation a fault is `SIGBUS`.
//!
//! [`lookup`] finds such a mapping from a user address of the calling
//! process, so that the driver can learn which of its objects a user range
//! lies in, exactly (the object, not a name that may be reused).

use core::marker::PhantomData;
use kernel::{bindings, ffi::c_void, mm::virt::VmaNew, sync::Arc, types::ForeignOwnable};

/// What a fault on a device mapping came to.
pub(crate) enum Fault {
    /// The page is mapped now.
    Mapped,
    /// The memory is gone (or the offset is outside it): `SIGBUS`.
    Gone,
    /// Mapping it needed memory the kernel did not have: `VM_FAULT_OOM`.
    NoMemory,
}

/// An object whose memory is mapped into user space through [`install`].
pub(crate) trait DeviceMapping: Send + Sync + Sized + 'static {
    /// Maps the page at byte `offset` of the object into `slot`.
    fn fault(&self, offset: u64, slot: FaultSlot<'_>) -> Fault;
}

/// The place a faulting access waits for its page.
///
/// # Invariants
///
/// `vmf` is the `struct vm_fault` of a fault being handled (mmap lock or the
/// VMA lock held) on a VMA set up by [`install`].
pub(crate) struct FaultSlot<'a> {
    vmf: *mut bindings::vm_fault,
    _p: PhantomData<&'a mut bindings::vm_fault>,
}

impl FaultSlot<'_> {
    /// The VMA and the page-aligned user address that faulted.
    pub(crate) fn target(&self) -> (*mut bindings::vm_area_struct, usize) {
        // SAFETY: `vmf` is valid during the fault (type invariant).
        unsafe {
            (
                (*self.vmf).__bindgen_anon_1.vma,
                (*self.vmf).__bindgen_anon_1.address,
            )
        }
    }
}

/// `vm_operations_struct` for mappings of `T`.
struct Ops<T>(PhantomData<T>);

impl<T: DeviceMapping> Ops<T> {
    const VTABLE: bindings::vm_operations_struct = bindings::vm_operations_struct {
        open: Some(Self::open),
        close: Some(Self::close),
        fault: Some(Self::fault),
        ..pin_init::zeroed()
    };

    fn build() -> &'static bindings::vm_operations_struct {
        &Self::VTABLE
    }

    /// A VMA made from one of ours (split, mremap) takes its own reference.
    ///
    /// # Safety
    ///
    /// Called by the mm core only, on a VMA whose operations are these.
    unsafe extern "C" fn open(vma: *mut bindings::vm_area_struct) {
        // SAFETY: the kernel passes a VMA whose private data `install` (or a
        // previous `open`) set to a reference of `Arc<T>`, alive while the
        // VMA it was copied from is.
        let data = unsafe { <Arc<T> as ForeignOwnable>::borrow((*vma).vm_private_data) };
        let mine: Arc<T> = data.into();
        // SAFETY: `vma` is valid; the new VMA owns the reference taken above.
        unsafe { (*vma).vm_private_data = mine.into_foreign().cast() };
    }

    /// The VMA goes: its reference with it.
    ///
    /// # Safety
    ///
    /// Called by the mm core only, once, on a VMA whose operations are these.
    unsafe extern "C" fn close(vma: *mut bindings::vm_area_struct) {
        // SAFETY: this VMA owns one reference (see `install` and `open`);
        // `close` is its last callback.
        drop(unsafe { <Arc<T> as ForeignOwnable>::from_foreign((*vma).vm_private_data) });
    }

    /// A page of the mapping is missing (never mapped back after a zap).
    ///
    /// # Safety
    ///
    /// Called by the mm core only, on a fault of a VMA whose operations are
    /// these, with the mmap lock or the VMA lock held.
    unsafe extern "C" fn fault(vmf: *mut bindings::vm_fault) -> bindings::vm_fault_t {
        // SAFETY: a fault on one of our VMAs: `vmf` and its VMA are valid and
        // the VMA holds a reference on the object for the whole call.
        let (data, offset) = unsafe {
            let vma = (*vmf).__bindgen_anon_1.vma;
            let data = <Arc<T> as ForeignOwnable>::borrow((*vma).vm_private_data);
            (
                data,
                ((*vmf).__bindgen_anon_1.pgoff as u64) << kernel::page::PAGE_SHIFT,
            )
        };
        // INVARIANT: the fault being handled.
        let slot = FaultSlot {
            vmf,
            _p: PhantomData,
        };
        match data.fault(offset, slot) {
            Fault::Mapped => bindings::vm_fault_reason_VM_FAULT_NOPAGE,
            Fault::Gone => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
            Fault::NoMemory => bindings::vm_fault_reason_VM_FAULT_OOM,
        }
    }
}

/// Hands `vma`, whose pages the caller has just inserted, to `data`: from now
/// on faults and VMA copies go through `T`. Call last in `mmap`, once nothing
/// can fail any more.
pub(crate) fn install<T: DeviceMapping>(vma: &VmaNew, data: Arc<T>) {
    let raw = vma.as_ptr();
    // SAFETY: `vma` is being set up by `mmap` (mmap lock held for writing);
    // the VMA owns the reference passed in, dropped by `close`.
    unsafe {
        (*raw).vm_private_data = data.into_foreign().cast::<c_void>();
        (*raw).vm_ops = Ops::<T>::build();
    }
}

/// Where a user range lies, as far as mappings of `T` are concerned.
pub(crate) enum Lookup<T> {
    /// Not in any mapping of `T` at its first byte (whatever follows:
    /// such a range is other memory, or none).
    Elsewhere,
    /// All in one mapping of `T`: the object and the file offset of the
    /// range's first byte (the VMA's offset plus the distance into it).
    Inside(Arc<T>, u64),
    /// Starts in a mapping of `T` and runs out of it (into other memory,
    /// none, or another one).
    Straddles,
}

/// Finds where `[addr, addr + len)` of the calling process lies.
pub(crate) fn lookup<T: DeviceMapping>(addr: u64, len: u64) -> Lookup<T> {
    let Some(end) = addr.checked_add(len) else {
        return Lookup::Elsewhere;
    };
    let task = kernel::current!();
    let Some(mm) = task.mm() else {
        return Lookup::Elsewhere;
    };
    let ops: *const bindings::vm_operations_struct = Ops::<T>::build();
    let _guard = mm.mmap_read_lock();
    let (Ok(addr), Ok(end)) = (usize::try_from(addr), usize::try_from(end)) else {
        return Lookup::Elsewhere;
    };
    let mut at = addr;
    let mut ours = 0usize;
    let mut first: Option<(Arc<T>, u64)> = None;
    let mut all_ours = true;
    while at < end {
        // SAFETY: the mmap lock is held (the guard); `find_vma` returns the
        // first VMA ending above `at`, valid while the lock is held.
        let vma = unsafe { bindings::find_vma(mm.as_raw(), at as kernel::ffi::c_ulong) };
        if vma.is_null() {
            all_ours = false;
            break;
        }
        // SAFETY: `vma` is valid under the mmap lock.
        let (start, vend, vops) = unsafe {
            (
                (*vma).__bindgen_anon_1.__bindgen_anon_1.vm_start as usize,
                (*vma).__bindgen_anon_1.__bindgen_anon_1.vm_end as usize,
                (*vma).vm_ops,
            )
        };
        if start >= end {
            all_ours = false;
            break;
        }
        if start > at {
            all_ours = false;
        }
        if core::ptr::eq(vops, ops) {
            ours += 1;
            if first.is_none() && start <= addr {
                // SAFETY: one of our VMAs: its private data is an `Arc<T>`
                // reference, alive under the mmap lock; we take our own.
                let data: Arc<T> =
                    unsafe { <Arc<T> as ForeignOwnable>::borrow((*vma).vm_private_data) }.into();
                // SAFETY: as above.
                let pgoff = unsafe { (*vma).vm_pgoff } as u64;
                let off = (pgoff << kernel::page::PAGE_SHIFT) + (addr - start) as u64;
                first = Some((data, off));
            }
        } else {
            all_ours = false;
        }
        at = vend;
    }
    match (ours, first) {
        (_, None) => Lookup::Elsewhere,
        (1, Some((data, off))) if all_ours => Lookup::Inside(data, off),
        _ => Lookup::Straddles,
    }
}

/// Whether `[addr, addr + len)` of the calling process lies in one mapping
/// (one VMA), whatever maps it.
pub(crate) fn in_one_mapping(addr: u64, len: u64) -> bool {
    let (Ok(start), Some(Ok(end))) = (
        usize::try_from(addr),
        addr.checked_add(len).map(usize::try_from),
    ) else {
        return false;
    };
    let task = kernel::current!();
    let Some(mm) = task.mm() else {
        return false;
    };
    let guard = mm.mmap_read_lock();
    guard.vma_lookup(start).is_some_and(|vma| end <= vma.end())
}

/// What the calling process has mapped at a user address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum UserMapping {
    /// Nothing (or no address space: a kernel thread).
    None,
    /// A mapping whose pages `get_user_pages` cannot pin or must not
    /// fault: pure PFNs or I/O memory (`VM_IO`, `VM_PFNMAP`: a GPU driver's
    /// or a sysfs PCI resource's), or one with no access (a `PROT_NONE`
    /// reservation).
    NoPages,
    /// A mapping of pages.
    Pages,
}

/// What the calling process maps at `addr`.
pub(crate) fn user_mapping(addr: u64) -> UserMapping {
    use kernel::mm::virt::flags;
    let Ok(addr) = usize::try_from(addr) else {
        return UserMapping::None;
    };
    let task = kernel::current!();
    let Some(mm) = task.mm() else {
        return UserMapping::None;
    };
    let guard = mm.mmap_read_lock();
    let Some(vma) = guard.vma_lookup(addr) else {
        return UserMapping::None;
    };
    let f = vma.flags();
    if f & (flags::IO | flags::PFNMAP) != 0 || f & (flags::READ | flags::WRITE) == 0 {
        UserMapping::NoPages
    } else {
        UserMapping::Pages
    }
}

/// The file offset (in bytes) that `vma` maps.
pub(crate) fn vma_offset(vma: &VmaNew) -> u64 {
    // SAFETY: `vma` is a valid VMA under setup; `vm_pgoff` is set.
    let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
    (pgoff as u64) << kernel::page::PAGE_SHIFT
}

/// Whether `vma` is a shared mapping (`MAP_SHARED`: `VM_MAYSHARE`).
///
/// Not `kernel::mm::virt::flags::MAYSHARE`: Linux 7.2 binds that to
/// `VM_MAYEXEC`, so the shim gives the real flag.
pub(crate) fn may_share(vma: &VmaNew) -> bool {
    vma.flags() & super::c::P2PDIRECT_VM_MAYSHARE != 0
}
