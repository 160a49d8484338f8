// SPDX-License-Identifier: GPL-2.0
//! Helpers shared by the Rust tests: the test VM's GPUs and NVMe namespaces.
#![allow(dead_code)]

use p2pdirect::{sys, Allocation, Device};
use std::{fs, io::Write, os::unix::fs::OpenOptionsExt};

/// ALLOC that tells the host what the memory now holds: ALLOC zeroes it.
/// The record goes to the file `P2PDIRECT_RECORDS` names (the guest's TAP
/// channel), which the host replays in order (ci/hostcheck.py).
pub fn alloc(dev: &Device, provider: u32, size: u64) -> Allocation {
    let a = dev.alloc(provider, size, 0).expect("ALLOC");
    let p = dev
        .providers()
        .unwrap()
        .into_iter()
        .find(|p| p.index == provider)
        .expect("the provider just used");
    if p.kind == sys::P2PDIRECT_PROVIDER_BAR {
        if let Ok(path) = std::env::var("P2PDIRECT_RECORDS") {
            // One write(2) for the whole line: `writeln!` on a `File` writes
            // each formatted piece with its own call, and the libtest output
            // sharing the console can land between them (a record cut in two
            // the host cannot read).
            let line = format!(
                "# HOSTCHECK gpu={} off={} len={} zero guard=0\n",
                p.pci_addr, a.provider_offset, a.size
            );
            let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
            f.write_all(line.as_bytes()).unwrap();
        }
    }
    a
}

/// Namespace 1 of the NVMe controller with this serial.
pub fn nvme(serial: &str) -> fs::File {
    for e in fs::read_dir("/sys/class/nvme").unwrap() {
        let e = e.unwrap();
        let s = fs::read_to_string(e.path().join("serial")).unwrap_or_default();
        if s.trim() == serial {
            let ns = format!("/dev/{}n1", e.file_name().to_string_lossy());
            return fs::File::open(ns).unwrap();
        }
    }
    panic!("no NVMe controller with serial {serial}");
}

/// The block device of the NVMe namespace with this NSID.
pub fn namespace(nsid: u32, write: bool) -> fs::File {
    for e in fs::read_dir("/sys/block").unwrap() {
        let e = e.unwrap();
        let id = fs::read_to_string(e.path().join("nsid")).unwrap_or_default();
        if id.trim().parse::<u32>().ok() == Some(nsid) {
            return fs::OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(libc::O_DIRECT)
                .open(format!("/dev/{}", e.file_name().to_string_lossy()))
                .unwrap();
        }
    }
    panic!("no NVMe namespace with NSID {nsid}");
}

/// The first emulated GPU.
pub fn gpu(dev: &Device) -> p2pdirect::Provider {
    dev.providers()
        .unwrap()
        .into_iter()
        .find(|p| p.kind == sys::P2PDIRECT_PROVIDER_BAR)
        .expect("an emulated GPU")
}
