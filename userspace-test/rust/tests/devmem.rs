// SPDX-License-Identifier: GPL-2.0
//! Device-memory tests from Rust (in the test VM, module loaded, root).

mod common;

use p2pdirect::{sys, Device};
use std::io;

const MIB: u64 = 1 << 20;

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("call should have failed")
        .raw_os_error()
        .unwrap_or(0)
}

/// The emulated GPUs (providers of kind BAR).
fn gpus(dev: &Device) -> Vec<p2pdirect::Provider> {
    let all = dev.providers().unwrap();
    all.into_iter()
        .filter(|p| p.kind == sys::P2PDIRECT_PROVIDER_BAR)
        .collect()
}

/// Whether `client` hangs below the switch upstream port above `provider`
/// (its grandparent in sysfs).
fn same_switch(provider: p2pdirect::PciAddr, client: p2pdirect::PciAddr) -> bool {
    let real = |a: p2pdirect::PciAddr| {
        std::fs::canonicalize(format!("/sys/bus/pci/devices/{a}")).unwrap_or_default()
    };
    let p = real(provider);
    let up = p.parent().and_then(|d| d.parent());
    up.is_some_and(|up| real(client).starts_with(up))
}

#[test]
fn providers_reachability() {
    let dev = Device::open().unwrap();
    let ps = gpus(&dev);
    assert_eq!(ps.len(), 2, "two emulated GPUs expected, got {ps:?}");
    for p in &ps {
        assert_eq!(p.kind, sys::P2PDIRECT_PROVIDER_BAR);
        assert_eq!(p.bar_size, 64 * MIB);
        assert_eq!(p.bytes_free + p.bytes_used, p.bytes_total);
        // Every NVMe controller of the VM (ci/vm.sh); those below the GPU's
        // switch reach it, the two on root ports do not.
        assert_eq!(p.clients.len(), 6);
        for c in &p.clients {
            assert_eq!(
                c.distance.is_some(),
                same_switch(p.pci_addr, c.pci_addr),
                "client {c:?} of provider {}",
                p.pci_addr
            );
        }
        assert_eq!(p.clients.iter().filter(|c| c.distance.is_some()).count(), 4);
        eprintln!("provider {} at {}: {:?}", p.index, p.pci_addr, p.clients);
    }
}

#[test]
fn alloc_map_write_read_free() {
    let dev = Device::open().unwrap();
    let p = gpus(&dev)[1].clone();
    let a = common::alloc(&dev, p.index, 3 * MIB);
    assert_eq!(a.size, 3 * MIB);
    assert_eq!(a.bus_addr, p.bus_addr + a.provider_offset);
    let m = dev.map(&a).unwrap();
    // Restored below: the host checks other suites' device memory after the run.
    let mut saved = vec![0u8; 4096];
    m.read(MIB as usize, &mut saved).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    m.write(MIB as usize, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    m.read(MIB as usize, &mut back).unwrap();
    assert_eq!(back, data);
    m.write(MIB as usize, &saved).unwrap();
    assert!(m.write(3 * MIB as usize - 1, &[0, 0]).is_err());
    drop(m);
    dev.free(a.handle).unwrap();
    assert_eq!(errno(dev.free(a.handle)), libc::ENOENT);
    let after = gpus(&dev)[1].clone();
    assert_eq!(after.bytes_used, p.bytes_used);
}

#[test]
fn published_cmb_is_listed_and_allocatable() {
    let dev = Device::open().unwrap();
    let cmb = dev
        .providers()
        .unwrap()
        .into_iter()
        .find(|p| p.kind == sys::P2PDIRECT_PROVIDER_PUBLISHED)
        .expect("the NVMe CMB is listed as a PUBLISHED provider");
    let a = common::alloc(&dev, cmb.index, 64 << 10);
    let m = dev.map(&a).unwrap();
    m.write(0, b"cmb").unwrap();
    let mut back = [0u8; 3];
    m.read(0, &mut back).unwrap();
    assert_eq!(&back, b"cmb");
    drop(m);
    dev.free(a.handle).unwrap();
}

#[test]
fn bad_input() {
    let dev = Device::open().unwrap();
    let p = gpus(&dev)[0].clone();
    assert_eq!(errno(dev.alloc(p.index, 0, 0)), libc::EINVAL);
    assert_eq!(errno(dev.alloc(p.index, 4096, 12345)), libc::EINVAL);
    assert_eq!(
        errno(dev.alloc(p.index, p.bar_size + 4096, 0)),
        libc::ENOMEM
    );
    assert_eq!(errno(dev.alloc(u32::MAX, 4096, 0)), libc::ENODEV);
    let a = common::alloc(&dev, p.index, MIB);
    // MAP_PRIVATE is refused.
    // SAFETY: a new mapping of our own fd; it must fail.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MIB as usize,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            dev.as_raw_fd(),
            a.mmap_offset as libc::off_t,
        )
    };
    assert_eq!(r, libc::MAP_FAILED);
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // Another open file does not see this file's allocation.
    let other = Device::open().unwrap();
    assert_eq!(errno(other.free(a.handle)), libc::ENOENT);
    assert_eq!(errno(other.map(&a)), libc::EINVAL);
    dev.free(a.handle).unwrap();
}

/// EXPORT_DMABUF: the fd names exactly the range asked for (its size, as
/// lseek reports it), shares the allocation's bytes, and dies with FREE.
#[test]
fn export_dmabuf() {
    use std::{
        fs::File,
        io::{Seek, SeekFrom},
    };
    let dev = Device::open().unwrap();
    let gpu = &gpus(&dev)[0];
    let a = dev.alloc(gpu.index, 2 * MIB, 0).unwrap();
    let fd = dev.export_dmabuf(a.handle, MIB, 0).unwrap();
    let mut f = File::from(fd);
    assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), MIB);
    assert_eq!(errno(dev.export_dmabuf(a.handle, 1, 0)), libc::EINVAL);
    assert_eq!(errno(dev.export_dmabuf(a.handle, 0, 3 * MIB)), libc::EINVAL);
    dev.free(a.handle).unwrap();
    assert_eq!(errno(dev.export_dmabuf(a.handle, 0, 0)), libc::ENOENT);
    // The fd stays a valid (dead) file until closed.
    assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), MIB);
}

/// fork() does not copy a mapping of device memory (VM_DONTCOPY), so in the
/// child its range is a hole another mapping may fill: the parent's
/// `Mapping` must then neither write there nor unmap it, and the parent's
/// own use goes on.
#[test]
fn a_fork_child_leaves_the_parents_mapping_alone() {
    let dev = Device::open().unwrap();
    let gpu = gpus(&dev)[0].index;
    let a = common::alloc(&dev, gpu, MIB);
    let m = dev.map(&a).unwrap();
    m.write(0, b"parent").unwrap();
    // SAFETY: the child makes system calls and allocates (glibc's fork
    // leaves malloc usable in the child), then leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: an anonymous page at the hole the device mapping left;
        // MAP_FIXED_NOREPLACE fails rather than replace anything.
        let hole = unsafe {
            libc::mmap(
                m.as_ptr().cast(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if hole != m.as_ptr().cast() {
            // SAFETY: leaving the child without running the harness.
            unsafe { libc::_exit(2) };
        }
        let refused = m
            .write(0, b"X")
            .is_err_and(|e| e.to_string().contains("fork()"));
        let mut back = [0u8; 1];
        let read_refused = m.read(0, &mut back).is_err();
        // SAFETY: the anonymous page mapped above.
        let untouched = unsafe { *hole.cast::<u8>() } == 0;
        drop(m);
        // SAFETY: still mapped if the drop unmapped nothing; else SIGSEGV,
        // which the parent sees.
        unsafe { *hole.cast::<u8>() = 1 };
        let code = if refused && read_refused && untouched {
            0
        } else {
            1
        };
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child used or unmapped what is at the parent's mapping's address (status {status:#x}: \
         exit 1 = written or read, 2 = the hole could not be mapped, a signal = unmapped)"
    );
    let mut back = [0u8; 6];
    m.read(0, &mut back).unwrap();
    assert_eq!(&back, b"parent");
    drop(m);
    dev.free(a.handle).unwrap();
}
