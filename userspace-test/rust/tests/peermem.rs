// SPDX-License-Identifier: GPL-2.0
//! Peer-memory tests from Rust (in the test VM, module loaded, root).

mod common;

use common::{gpu, nvme};
use p2pdirect::{sys, Device};
use std::os::fd::AsRawFd;

#[test]
fn devmem_probe_sw_and_rp() {
    let dev = Device::open().unwrap();
    let gpu = gpu(&dev);
    let a = common::alloc(&dev, gpu.index, 1 << 20);
    let m = dev.map(&a).unwrap();
    let sw = nvme("p2pnvme-sw");
    let p = dev.dma_probe(m.as_ptr(), a.size, sw.as_raw_fd()).unwrap();
    assert_eq!(p.client, sys::P2PDIRECT_CLIENT_DEVMEM);
    assert_eq!(p.segments.first().map(|s| s.0), Some(a.bus_addr));
    assert_eq!(p.segments.iter().map(|s| s.1).sum::<u64>(), a.size);
    for (addr, len) in &p.segments {
        assert!(*addr >= gpu.bus_addr && addr + len <= gpu.bus_addr + gpu.bar_size);
    }
    let rp = nvme("p2pnvme-rp");
    let e = dev
        .dma_probe(m.as_ptr(), a.size, rp.as_raw_fd())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EREMOTEIO));
}

#[test]
fn ram_is_declined() {
    let dev = Device::open().unwrap();
    let ram = vec![1u8; 1 << 20];
    let sw = nvme("p2pnvme-sw");
    let e = dev
        .dma_probe(ram.as_ptr(), ram.len() as u64, sw.as_raw_fd())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENXIO));
}

#[test]
fn register_then_free_invalidates() {
    let dev = Device::open().unwrap();
    let gpu = gpu(&dev);
    let a = common::alloc(&dev, gpu.index, 1 << 20);
    let m = dev.map(&a).unwrap();
    let (id, client) = dev.register(m.as_ptr(), a.size, true).unwrap();
    assert_eq!(client, sys::P2PDIRECT_CLIENT_DEVMEM);
    assert!(dev.registration_live(id).unwrap());
    assert_eq!(
        dev.register(m.as_ptr(), a.size, true)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EEXIST)
    );
    drop(m);
    dev.free(a.handle).unwrap();
    assert!(!dev.registration_live(id).unwrap());
    assert!(!dev.deregister(id).unwrap());
    assert_eq!(
        dev.deregister(id).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
}
