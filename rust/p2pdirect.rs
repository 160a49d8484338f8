// SPDX-License-Identifier: GPL-2.0

//! p2pdirect: GPUDirect-style device memory, peer-memory registration and
//! direct NVMe I/O on the upstream PCI P2PDMA infrastructure.
//!
//! Crate root: module lines, the module struct and its initializer. Field
//! order of [`P2pDirect`] is the setup order; teardown is the reverse (Drop).

mod bar_driver;
mod chardev;
mod devmem;
mod ffi;
mod ioctl;
mod range_alloc;

use kernel::{driver, pci, prelude::*};

module! {
    type: P2pDirect,
    name: "p2pdirect",
    authors: ["p2pdirect developers"],
    description: "Device memory, peer-memory clients and direct storage I/O on PCI P2PDMA",
    license: "GPL",
}

/// Version of this module, reported by `P2PDIRECT_IOC_GET_VERSION`.
pub(crate) const MODULE_VERSION: &str = "0.1.0";

#[pin_data(PinnedDrop)]
struct P2pDirect {
    /// The PCI driver that turns device BARs into providers.
    #[pin]
    bar_driver: driver::Registration<pci::Adapter<bar_driver::BarDriver>>,
    /// `/dev/p2pdirect`: registered last, so every room it reaches is ready.
    #[pin]
    chardev: chardev::Registration,
}

impl kernel::InPlaceModule for P2pDirect {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        ffi::init_globals();
        pr_info!(
            "version {} loading (ABI {}.{})\n",
            MODULE_VERSION,
            ffi::uapi::P2PDIRECT_ABI_MAJOR,
            ffi::uapi::P2PDIRECT_ABI_MINOR
        );
        try_pin_init!(Self {
            bar_driver <- driver::Registration::new(c"p2pdirect", module),
            chardev <- chardev::register(),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for P2pDirect {
    fn drop(self: Pin<&mut Self>) {
        pr_info!("unloading\n");
    }
}
