// SPDX-License-Identifier: GPL-2.0
//! Direct storage I/O from Rust (in the test VM, module loaded, root).
//!
//! Device memory these tests write is restored before they end, so the
//! host's byte checks of the C suites' records still hold.

mod common;

use common::{gpu, namespace};
use p2pdirect::{fill, Device, Io, Memory};
use std::os::fd::AsRawFd;

const MIB: u64 = 1 << 20;

#[test]
fn read_write_namespace_through_device_memory() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, 2 * MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; m.len()];
    m.read(0, &mut saved).unwrap();

    let ns = namespace(1, true);
    let io = Io {
        fd: ns.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size: MIB,
        file_offset: 5 * MIB,
        buf_offset: 0,
        compat: false,
    };
    let done = dev.read(&io).unwrap();
    assert_eq!(
        (done.bytes, done.p2p_bytes, done.bounce_bytes),
        (MIB, MIB, 0)
    );
    let (mut got, mut want) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    m.read(0, &mut got).unwrap();
    fill(&mut want, 5 * MIB, 1);
    assert!(got == want, "device memory differs from the namespace");

    // Out through a registration, at the end of the NSID 1 write area.
    let (id, _) = dev.register(m.as_ptr(), 2 * MIB, true).unwrap();
    let out = Io {
        memory: Memory::Registered(id),
        file_offset: 120 * MIB,
        ..io
    };
    assert_eq!(dev.write(&out).unwrap().bytes, MIB);
    let back = Io {
        buf_offset: MIB,
        ..out
    };
    assert_eq!(dev.read(&back).unwrap().bytes, MIB);
    m.read(MIB as usize, &mut got).unwrap();
    assert!(got == want, "the write did not reach the namespace");
    assert!(dev.deregister(id).unwrap());
    m.write(0, &saved).unwrap();
}

#[test]
fn unreachable_without_compat() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, MIB);
    let m = dev.map(&a).unwrap();
    let ns = namespace(4, false);
    let io = Io {
        fd: ns.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size: MIB,
        file_offset: 0,
        buf_offset: 0,
        compat: false,
    };
    let e = dev.read(&io).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EREMOTEIO));
}
