// SPDX-License-Identifier: GPL-2.0

//! PCI functions as P2PDMA providers: who owns a physical address, and how
//! a function is named.
//!
//! C header: [`include/linux/pci-p2pdma.h`](srctree/include/linux/pci-p2pdma.h)

use core::ptr::NonNull;
use kernel::{bindings, pci, sync::aref::ARef};

use super::c;

fn raw(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`,
    // so a reference to it points at the `struct pci_dev` itself.
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// The function's PCI segment (domain), bus number and devfn.
fn location(dev: &pci::Device) -> (u32, u32, u32) {
    let pdev = raw(dev);
    // SAFETY: `dev` is a valid `struct pci_dev`, whose bus outlives it; the
    // fields read are set at enumeration and never change.
    unsafe {
        (
            c::p2pdirect_pci_domain(pdev) as u32,
            u32::from((*(*pdev).bus).number),
            (*pdev).devfn,
        )
    }
}

/// The function's address as `P2PDIRECT_PCI_ADDR()` encodes it (segment in
/// bits 16..31: segments past 0xffff do not fit).
pub(crate) fn pci_addr(dev: &pci::Device) -> u32 {
    let (domain, bus, devfn) = location(dev);
    (domain << 16) | (bus << 8) | devfn
}

/// A key naming the function's place in the topology, unique across every
/// segment.
pub(crate) fn slot_key(dev: &pci::Device) -> u64 {
    let (domain, bus, devfn) = location(dev);
    (u64::from(domain) << 16) | u64::from((bus << 8) | devfn)
}

/// The PCI function one of whose memory BARs holds physical address `phys`.
pub(crate) fn bar_owner(phys: u64) -> Option<ARef<pci::Device>> {
    let mut cur: *mut bindings::pci_dev = core::ptr::null_mut();
    loop {
        // SAFETY: `cur` is null or the previous result, whose reference this
        // call drops; the result holds a new reference (or is null).
        cur = unsafe {
            bindings::pci_get_device(
                bindings::PCI_ANY_ID as u32,
                bindings::PCI_ANY_ID as u32,
                cur,
            )
        };
        let dev = NonNull::new(cur)?;
        // SAFETY: `dev` is a referenced `struct pci_dev`; its resources are
        // read-only while it is bound or being walked.
        let hit = unsafe { &(*dev.as_ptr()).resource }
            .iter()
            .take(bindings::PCI_STD_NUM_BARS as usize)
            .any(|r| {
                r.flags & bindings::IORESOURCE_TYPE_BITS as usize
                    == bindings::IORESOURCE_MEM as usize
                    && phys >= r.start
                    && phys <= r.end
            });
        if hit {
            // SAFETY: the walk's reference on `dev` is handed to the `ARef`;
            // `pci::Device` is a transparent wrapper of `struct pci_dev`.
            return Some(unsafe { ARef::from_raw(dev.cast()) });
        }
    }
}
