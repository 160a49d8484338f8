// SPDX-License-Identifier: GPL-2.0

//! Errors: the errnos the kernel crate lacks, one way to refuse a request
//! with a reason, and the lock order of the whole module.
//!
//! # Lock order
//!
//! Outer to inner; a lock is only taken while holding locks above it:
//!
//! 0. a PCI device's `device_lock` (driver remove and the bus notifier:
//!    device removal waits there for the last pin of its memory, as every
//!    driver's remove waits for its users)
//! 1. `OpenFile::regs` (a file's registrations; I/O finds them with no
//!    lock, in `OpenFile::reg_index` under RCU)
//! 2. the mmap lock of the calling process (peer-memory lookups, GUP; page
//!    faults on device memory come in holding it)
//! 3. `OpenFile::allocs` (a file's allocations; mmap takes it under 2.)
//! 4. the provider list, then the graveyard (revoked memory waiting for its
//!    last pin)
//! 5. `AllocState::inner` (an allocation's memory and subscribers; page
//!    faults take it under 2.)
//! 6. `Provider::inner`, then the handle pool and the list of devices whose
//!    driver is unbinding; `Provider::reaped` (what removal sleeps on) is a
//!    leaf, taken after `Provider::inner` is let go
//! 7. `RegEntry::claim` and a kernel consumer's `KernelMem::claim` (peer_api;
//!    a client's callbacks for the claim run under it), then `KernelMem::st`;
//!    the peer-memory client registry, the watchers of other providers'
//!    memory (peer_clients), a file's `DmaHints::other` (a spinlock), `RegEntry::io` (a spinlock, taken by I/O inside an RCU
//!    read section) and a client of another module's state are leaves. The
//!    statistics take no lock (atomic counters, stats.rs).
//!
//! A dma-buf export (dmabuf.rs) stands beside 1.-3.: its `Exported::link`,
//! then the buffer's reservation lock (the dma-buf core takes it around
//! map and unmap; importers' `invalidate_mappings` run under it), then
//! `Export::holds`; under the reservation lock a map takes 5. (a hold on
//! the allocation) and the last unmap of revoked memory reaps it (4. to 6.).
//! None of 4. to 7. is held while the reservation lock is taken.
//!
//! Revocation calls subscribers (which take `RegEntry::claim`, or a
//! dma-buf's link and reservation lock) with no lock of devmem's held; a
//! second revocation of the same allocation (FREE racing device removal)
//! waits, interruptibly, for the first one's telling with no lock of
//! p2pdirect's held (a removal that loses holds the device's lock, 0.). No
//! wait for a pin happens with a lock of p2pdirect's held. Besides that
//! telling and its consumers' callbacks, FREE waits only for the fences on
//! a dma-buf of the memory, holding that export's link
//! (which keeps the buffer from being released meanwhile) and its
//! reservation lock, as the kernel's own exporters wait for fences when they
//! revoke; only that buffer's release and its importers' map and unmap wait
//! behind it.

use crate::sys::uapi;
use kernel::{bindings, prelude::*};

fn errno(e: u32) -> Error {
    // Every constant passed is a small positive errno from the bindings.
    Error::from_errno(-(e as i32))
}

/// `EREMOTEIO`: the DMA device cannot reach the memory.
pub(crate) fn eremoteio() -> Error {
    errno(bindings::EREMOTEIO)
}

/// `ELOOP`: a block device stacked deeper than p2pdirect follows.
pub(crate) fn eloop() -> Error {
    errno(bindings::ELOOP)
}

/// The limit on stacked block devices that an error of their walk
/// (`BlockDevice::dma_legs`) says a device passed, and what the limit
/// counts: `ELOOP` levels, `E2BIG` legs (`P2PDIRECT_STACK_MAX_DEPTH`,
/// `P2PDIRECT_STACK_MAX_LEGS`).
pub(crate) fn stack_limit(e: Error) -> Option<(u32, &'static str)> {
    if e == eloop() {
        Some((uapi::P2PDIRECT_STACK_MAX_DEPTH, "levels deep"))
    } else if e == E2BIG {
        Some((uapi::P2PDIRECT_STACK_MAX_LEGS, "legs"))
    } else {
        None
    }
}

/// `ESTALE`: a registration whose memory went away.
pub(crate) fn estale() -> Error {
    errno(bindings::ESTALE)
}

/// `EOPNOTSUPP`.
pub(crate) fn eopnotsupp() -> Error {
    errno(bindings::EOPNOTSUPP)
}

/// `ECANCELED`: an io_uring command whose task went away before it ended.
pub(crate) fn ecanceled() -> Error {
    errno(bindings::ECANCELED)
}

/// `ETOOMANYREFS`: a page pinned `P2PDIRECT_PAGE_PINS_MAX` times already.
pub(crate) fn etoomanyrefs() -> Error {
    errno(bindings::ETOOMANYREFS)
}

/// `EDQUOT`: over the per-file pin quota (`max_pinned_mib`).
pub(crate) fn edquot() -> Error {
    errno(bindings::EDQUOT)
}

/// Refuses a request: returns `Err($err)` from the enclosing function after
/// a rate-limited message saying why, so the caller learns what to fix.
macro_rules! refuse {
    ($err:expr, $($fmt:tt)*) => {{
        if $crate::sys::ratelimit::allow() {
            ::kernel::pr_info!($($fmt)*);
        }
        return Err($err);
    }};
}
pub(crate) use refuse;
