// SPDX-License-Identifier: GPL-2.0
//! ABI tests of /dev/p2pdirect from Rust. They need the module loaded and root;
//! `make check` runs them inside the test VM with `--test-threads=1`
//! (the non-root test forks).

use p2pdirect::{ioc, sys, Device, IOC_READ, IOC_READ_WRITE};
use std::{io, mem::size_of};

fn errno(r: io::Result<i32>) -> i32 {
    r.expect_err("ioctl should have failed")
        .raw_os_error()
        .unwrap_or(0)
}

#[test]
fn get_version() {
    let dev = Device::open().expect("open /dev/p2pdirect");
    let v = dev.version().expect("GET_VERSION");
    assert_eq!(v.abi_major, sys::P2PDIRECT_ABI_MAJOR);
    assert_eq!(v.abi_minor, sys::P2PDIRECT_ABI_MINOR);
    assert!(!v.module.is_empty());
    assert!(v.is_compatible());
    eprintln!("{v}");
}

#[test]
fn read_only_open_may_only_look() {
    let ro = Device::open_read_only().expect("open /dev/p2pdirect O_RDONLY");
    assert!(ro.version().is_ok());
    let providers = ro.providers().expect("LIST_PROVIDERS on a read-only open");
    assert!(!providers.is_empty());
    assert!(ro.stats(false).is_ok());
    let code = |r: io::Result<()>| r.expect_err("must be refused").raw_os_error();
    assert_eq!(code(ro.stats(true).map(|_| ())), Some(libc::EBADF));
    assert_eq!(
        code(ro.alloc(providers[0].index, 4096, 0).map(|_| ())),
        Some(libc::EBADF)
    );
    assert_eq!(code(ro.free(1)), Some(libc::EBADF));
}

#[test]
fn unknown_command_is_enotty() {
    let dev = Device::open().unwrap();
    let mut v = sys::p2pdirect_version::default();
    let size = size_of::<sys::p2pdirect_version>() as u32;
    let cmd = ioc(
        IOC_READ_WRITE,
        sys::P2PDIRECT_IOCTL_MAGIC.into(),
        0xef,
        size,
    );
    // SAFETY: `v` is valid for a command of its size; the module must not use it.
    let r = unsafe { dev.ioctl_raw(cmd, std::ptr::from_mut(&mut v).cast()) };
    assert_eq!(errno(r), libc::ENOTTY);
}

#[test]
fn wrong_size_or_direction_is_enotty() {
    let dev = Device::open().unwrap();
    let mut buf = [0u8; 64];
    let size = size_of::<sys::p2pdirect_version>() as u32;
    let magic: u32 = sys::P2PDIRECT_IOCTL_MAGIC.into();
    for cmd in [
        ioc(IOC_READ_WRITE, magic, sys::P2PDIRECT_IOCTL_BASE, size - 8),
        ioc(IOC_READ_WRITE, magic, sys::P2PDIRECT_IOCTL_BASE, size + 8),
        ioc(IOC_READ, magic, sys::P2PDIRECT_IOCTL_BASE, size),
    ] {
        // SAFETY: `buf` is larger than any of these sizes.
        let r = unsafe { dev.ioctl_raw(cmd, buf.as_mut_ptr().cast()) };
        assert_eq!(errno(r), libc::ENOTTY, "cmd {cmd:#x}");
    }
}

#[test]
fn bad_pointer_is_efault() {
    let dev = Device::open().unwrap();
    let cmd: libc::c_ulong = sys::P2PDIRECT_IOC_GET_VERSION.into();
    // SAFETY: a null argument; the kernel must refuse it with EFAULT.
    let r = unsafe { dev.ioctl_raw(cmd, std::ptr::null_mut()) };
    assert_eq!(errno(r), libc::EFAULT);
    // SAFETY: an anonymous read-only page; the kernel's write to it must fault.
    let ro = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ro, libc::MAP_FAILED);
    // SAFETY: `ro` is mapped but not writable: the copy-out fails with EFAULT.
    assert_eq!(errno(unsafe { dev.ioctl_raw(cmd, ro) }), libc::EFAULT);
    // SAFETY: `ro` is the mapping made above.
    unsafe { libc::munmap(ro, 4096) };
}

#[test]
fn nonroot_open_is_eacces() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    // SAFETY: the test harness runs single-threaded (--test-threads=1); the
    // child only makes raw system calls and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: async-signal-safe calls only, in the forked child.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(100);
            }
            let fd = libc::open(c"/dev/p2pdirect".as_ptr(), libc::O_RDWR);
            libc::_exit(if fd >= 0 {
                0
            } else {
                *libc::__errno_location()
            });
        }
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), libc::EACCES);
}
