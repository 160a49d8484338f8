// SPDX-License-Identifier: GPL-2.0

//! The ffi room: the only place that touches C or holds `unsafe`.
//!
//! Domain rooms call the safe wrappers below. C APIs the kernel crate lacks
//! (static inlines, headers it does not bind) go through `ffi/shim.c`, whose
//! functions are declared by hand in [`shim`]; each wrapper states the
//! invariants that make its call sound.

pub(crate) mod uapi;

use kernel::{
    prelude::*,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice},
};

mod shim {
    extern "C" {
        /// `__ratelimit()` on the module's own ratelimit state (ffi/shim.c).
        pub(super) fn p2pdirect_ratelimit() -> bool;
    }
}

/// Whether a rate-limited message may be printed now (10 per 5 s).
pub(crate) fn ratelimit() -> bool {
    // SAFETY: `p2pdirect_ratelimit` takes no arguments and only touches the
    // shim's static ratelimit state, which `__ratelimit` locks itself.
    unsafe { shim::p2pdirect_ratelimit() }
}

/// Copies a UAPI struct to the user address `arg`; `EFAULT` if it is not
/// writable user memory. The struct is written whole, padding included, so
/// callers build it from zeroed fields.
pub(crate) fn copy_to_user<T: AsBytes>(arg: usize, value: &T) -> Result {
    UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<T>())
        .writer()
        .write(value)
}
