// SPDX-License-Identifier: GPL-2.0

//! Kernel-crate extensions: safe, typed wrappers of C subsystems the kernel
//! crate of Linux 7.2 does not cover, each shaped like a `rust/kernel/*.rs`
//! file. They import only `kernel` and its bindings, never a domain module.

pub(crate) mod bio;
pub(crate) mod blkdev;
pub(crate) mod box_cache;
pub(crate) mod dma;
pub(crate) mod dma_buf;
pub(crate) mod file;
pub(crate) mod fs;
pub(crate) mod global;
pub(crate) mod gup;
pub(crate) mod miscdev;
pub(crate) mod page_ref;
pub(crate) mod pci_notify;
pub(crate) mod pci_p2pdma;
pub(crate) mod peer_client;
pub(crate) mod ratelimit;
pub(crate) mod rcu_map;
pub(crate) mod uapi;
pub(crate) mod uring_cmd;
pub(crate) mod vma;
pub(crate) mod work;

/// The C shim's functions (rust/ffi/shim.c, for what only C can reach:
/// static inlines and macros), declared by bindgen at build time from
/// rust/ffi/shim.c itself (see Kbuild).
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unreachable_pub,
    improper_ctypes,
    clippy::all
)]
pub(crate) mod c {
    include!("ffi/shim_generated.rs");
}

/// A rescheduling point in a long loop of the calling task; whether the
/// task is being killed (a fatal signal pending), at which a loop whose
/// result nobody will read may stop. Process context only.
pub(crate) fn resched() -> bool {
    // SAFETY: takes no arguments; `cond_resched()` and
    // `fatal_signal_pending(current)` only look at the current task.
    unsafe { c::p2pdirect_resched() }
}

/// [`kernel::types::Opaque::get`] without the call: the C object an
/// `Opaque` wraps. In these kernels `Opaque::get` is not `#[inline]`, so
/// each use is a call into vmlinux; the I/O path uses this instead.
#[inline(always)]
pub(crate) fn opaque_ptr<T>(o: &kernel::types::Opaque<T>) -> *mut T {
    // `Opaque<T>` is `#[repr(transparent)]` over `UnsafeCell<MaybeUninit<T>>`
    // (also transparent): its address is the object's, and all of it is
    // interior-mutable, as `UnsafeCell::get`'s own cast assumes.
    core::ptr::from_ref(o).cast_mut().cast::<T>()
}
