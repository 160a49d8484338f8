// SPDX-License-Identifier: GPL-2.0

//! Reference counts of ZONE_DEVICE pages a driver owns outright.
//!
//! C header: [`include/linux/page_ref.h`](srctree/include/linux/page_ref.h)
//!
//! While an allocation of device memory lives, its owner holds one
//! reference on each of its pages; mappings and pins add theirs on top. The
//! reference is set and cleared directly, never dropped with `put_page()`:
//! a page reaching zero through `put_page()` would be handed back to the
//! P2PDMA pool page by page, while the pool sees the whole BAR as taken.

use kernel::{ffi::c_void, page::PAGE_SIZE};

use super::c;

/// Takes the owner's reference on every page of `[kaddr, kaddr + len)` if
/// nothing references any of them (false, with nothing changed, otherwise).
/// Each count goes from 0 to 1 atomically, so a page someone else holds (a
/// range held twice) is never taken over.
///
/// # Safety
///
/// The range is whole pages of device memory the caller owns.
pub(crate) unsafe fn try_hold(kaddr: *mut c_void, len: usize) -> bool {
    let page = |off: usize| {
        // SAFETY: `off` lies in the caller's range.
        unsafe { c::p2pdirect_virt_to_page(kaddr.byte_add(off)) }
    };
    for off in (0..len).step_by(PAGE_SIZE) {
        // SAFETY: a page of the caller's range.
        if !unsafe { c::p2pdirect_page_ref_swap(page(off), 0, 1) } {
            for back in (0..off).step_by(PAGE_SIZE) {
                // The count goes back from 1 to 0 atomically. Only a
                // lockless lookup (GUP fast) that read a stale page table
                // entry can hold another reference meanwhile, and it drops
                // it at once: wait for that rather than leave the page
                // taken (bounded, in case).
                let mut tries = 0u32;
                // SAFETY: a page this loop claimed just before.
                while !unsafe { c::p2pdirect_page_ref_swap(page(back), 1, 0) } {
                    tries += 1;
                    if tries == 1 << 20 {
                        kernel::pr_warn!("a page stays held: a reference outlived its release\n");
                        break;
                    }
                    core::hint::spin_loop();
                }
            }
            return false;
        }
    }
    true
}

/// Drops the owner's reference on every page of `[kaddr, kaddr + len)` if
/// nothing else references any (false, with nothing changed, otherwise).
/// Each count goes from 1 to 0 atomically, so a concurrent speculative
/// reference (lockless GUP) is never lost.
///
/// # Safety
///
/// The range was held by [`try_hold`] and not released since.
pub(crate) unsafe fn try_release(kaddr: *mut c_void, len: usize) -> bool {
    let page = |off: usize| {
        // SAFETY: `off` lies in the caller's held range.
        unsafe { c::p2pdirect_virt_to_page(kaddr.byte_add(off)) }
    };
    for off in (0..len).step_by(PAGE_SIZE) {
        // SAFETY: a page of the caller's held range.
        if !unsafe { c::p2pdirect_page_ref_swap(page(off), 1, 0) } {
            for back in (0..off).step_by(PAGE_SIZE) {
                // Back from 0 to 1: frozen by this loop just before, so
                // nobody took a reference since (none is taken from 0).
                // SAFETY: a page of the caller's held range.
                if !unsafe { c::p2pdirect_page_ref_swap(page(back), 0, 1) } {
                    kernel::pr_warn!("a frozen page was referenced: its count is not restored\n");
                }
            }
            return false;
        }
    }
    true
}
