// SPDX-License-Identifier: GPL-2.0

//! ioctl dispatch for `/dev/p2pdirect`.
//!
//! A command number encodes direction and argument size, so matching the whole
//! number refuses a caller built against another layout with `ENOTTY` before
//! any byte of its argument is read.

use crate::ffi::{self, uapi};
use kernel::{ioctl, prelude::*};

/// The command numbers the header defines must be exactly what `_IOWR` with the
/// (bindgen-checked) argument struct gives: direction and size agree with C.
const _: () = assert!(
    uapi::P2PDIRECT_IOC_GET_VERSION
        == ioctl::_IOWR::<uapi::p2pdirect_version>(
            uapi::P2PDIRECT_IOCTL_MAGIC as u32,
            uapi::P2PDIRECT_IOCTL_BASE
        )
);

/// Handles one ioctl on `/dev/p2pdirect`; `arg` is the caller's argument pointer.
pub(crate) fn dispatch(cmd: u32, arg: usize) -> Result<isize> {
    match cmd {
        uapi::P2PDIRECT_IOC_GET_VERSION => get_version(arg),
        _ => Err(unknown(cmd)),
    }
}

/// Says, rate-limited, why a command was refused, so a caller built against
/// another header learns what to fix.
fn unknown(cmd: u32) -> Error {
    let (ty, nr, size) = (
        ioctl::_IOC_TYPE(cmd),
        ioctl::_IOC_NR(cmd),
        ioctl::_IOC_SIZE(cmd),
    );
    if ty == u32::from(uapi::P2PDIRECT_IOCTL_MAGIC) && ffi::ratelimit() {
        pr_warn!(
            "ioctl 0x{:08x} (nr 0x{:02x}, size {}) is not a command of ABI {}.{}; \
             was the caller built against another p2pdirect.h?\n",
            cmd,
            nr,
            size,
            uapi::P2PDIRECT_ABI_MAJOR,
            uapi::P2PDIRECT_ABI_MINOR
        );
    }
    ENOTTY
}

fn get_version(arg: usize) -> Result<isize> {
    let mut out = uapi::p2pdirect_version {
        abi_major: uapi::P2PDIRECT_ABI_MAJOR,
        abi_minor: uapi::P2PDIRECT_ABI_MINOR,
        module_version: [0; uapi::P2PDIRECT_MODULE_VERSION_LEN as usize],
    };
    // Keep the last byte as the terminating NUL.
    let len = crate::MODULE_VERSION
        .len()
        .min(out.module_version.len() - 1);
    for (dst, src) in out
        .module_version
        .iter_mut()
        .zip(&crate::MODULE_VERSION.as_bytes()[..len])
    {
        *dst = *src as kernel::ffi::c_char;
    }
    ffi::copy_to_user(arg, &out)?;
    Ok(0)
}
