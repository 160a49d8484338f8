// SPDX-License-Identifier: GPL-2.0

//! Kernel-crate extensions: safe, typed wrappers of C subsystems the kernel
//! crate of Linux 7.2 does not cover, each shaped like a `rust/kernel/*.rs`
//! file. They import only `kernel` and its bindings, never a domain module.

pub(crate) mod bio;
pub(crate) mod blkdev;
pub(crate) mod fs;
pub(crate) mod miscdev;
pub(crate) mod pci_notify;
pub(crate) mod uring_cmd;
pub(crate) mod vma;
