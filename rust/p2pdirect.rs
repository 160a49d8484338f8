// SPDX-License-Identifier: GPL-2.0

//! p2pdirect: GPUDirect-style device memory, peer-memory registration and
//! direct NVMe I/O on the upstream PCI P2PDMA infrastructure.
//!
//! Crate root: module lines, the module struct and its initializer. The
//! initializer lists the fields in setup order; the struct declares them in
//! teardown order (Rust drops fields in declaration order), the reverse.

mod bar_driver;
mod chardev;
mod devmem;
mod dmabuf;
mod error;
mod ffi;
mod ioctl;
mod peer_api;
mod peer_clients;
mod peer_mem;
mod range_alloc;
mod registration;
mod stats;
mod storage;
mod sys;

use kernel::{driver, pci, prelude::*};

module! {
    type: P2pDirect,
    name: "p2pdirect",
    authors: ["p2pdirect developers"],
    description: "Device memory, peer-memory clients and direct storage I/O on PCI P2PDMA",
    license: "GPL",
    imports_ns: ["DMA_BUF"],
    params: {
        max_pinned_mib: u64 {
            default: 1024,
            description: "Most device memory one open file may keep registered (pinned), in MiB (at most 65536)",
        },
    },
}

/// Most `max_pinned_mib` can raise the cap to (64 GiB): a pin's page array
/// stays far below what one kernel allocation may be.
const MAX_PINNED_MIB_LIMIT: u64 = 64 << 10;

/// The per-open-file cap on registered bytes (and on any single pin).
pub(crate) fn max_pinned_bytes() -> u64 {
    // 7.2's `value()` gives a reference, 7.3's a copy.
    #[cfg(not(kernel_ge_7_3))]
    let mib = *module_parameters::max_pinned_mib.value();
    #[cfg(kernel_ge_7_3)]
    let mib = module_parameters::max_pinned_mib.value();
    mib.min(MAX_PINNED_MIB_LIMIT).saturating_mul(1 << 20)
}

/// This module (`THIS_MODULE`), which files that outlive a call (a dma-buf)
/// hold. 7.2's `module!` defines a static at the crate root, 7.3's a
/// constant of `ModuleMetadata`.
pub(crate) fn this_module() -> &'static ThisModule {
    #[cfg(not(kernel_ge_7_3))]
    return &THIS_MODULE;
    #[cfg(kernel_ge_7_3)]
    return kernel::module::this_module::<P2pDirect>();
}

/// Version of this module, reported by `P2PDIRECT_IOC_GET_VERSION`.
pub(crate) const MODULE_VERSION: &str = "0.1.0";

#[pin_data(PinnedDrop)]
struct P2pDirect {
    /// `/dev/p2pdirect`: set up last, so every room it reaches is ready.
    #[pin]
    chardev: chardev::Registration,
    /// debugfs `p2pdirect/stats` (reads the statistics table, a static).
    #[pin]
    stats_file: kernel::debugfs::File<stats::DebugfsStats>,
    /// debugfs `p2pdirect/file_read_retries` (reads a static counter).
    #[pin]
    retries_file: kernel::debugfs::File<storage::FileReadRetries>,
    /// debugfs `p2pdirect/`: removed after its file.
    debugfs: kernel::debugfs::Dir,
    /// The module's workqueue (file READs run again): destroyed once
    /// `/dev/p2pdirect` is gone, waiting for its work items.
    work_queue: sys::work::WorkQueue,
    /// Revokes allocations of published memory before its driver unbinds.
    #[pin]
    published_unbind: sys::pci_notify::PciUnbindNotifier<devmem::PublishedUnbind>,
    /// Invalidates registrations and consumers of another driver's P2PDMA
    /// memory before that driver unbinds.
    #[pin]
    foreign_unbind: sys::pci_notify::PciUnbindNotifier<peer_clients::ForeignUnbind>,
    /// The PCI driver that turns device BARs into providers.
    #[pin]
    bar_driver: driver::Registration<pci::Adapter<bar_driver::BarDriver>>,
    /// The built-in peer-memory clients.
    peer_clients: peer_clients::Builtins,
    /// The storage engine's bio pool.
    bio_set: sys::bio::BioSet,
    /// Device memory's globals (providers, handles, the graveyard). Fields
    /// drop in this order, so the three globals go in the reverse of the
    /// order `init` sets them up in.
    devmem: devmem::Globals,
    /// The peer-memory client registry.
    peer_mem: peer_mem::Globals,
    /// The kernel API's client handles.
    peer_handles: sys::peer_client::Handles,
}

impl kernel::InPlaceModule for P2pDirect {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        pr_info!(
            "version {} loading (ABI {}.{})\n",
            MODULE_VERSION,
            sys::uapi::P2PDIRECT_ABI_MAJOR,
            sys::uapi::P2PDIRECT_ABI_MINOR
        );
        let debugfs = kernel::debugfs::Dir::new(c"p2pdirect");
        try_pin_init!(Self {
            peer_handles: sys::peer_client::Handles::init()?,
            work_queue: sys::work::WorkQueue::new()?,
            peer_mem: peer_mem::Globals::init()?,
            devmem: devmem::Globals::init()?,
            bio_set: sys::bio::BioSet::new()?,
            peer_clients: peer_clients::Builtins::register()?,
            bar_driver <- driver::Registration::new(c"p2pdirect", module),
            published_unbind <- sys::pci_notify::PciUnbindNotifier::register(),
            foreign_unbind <- sys::pci_notify::PciUnbindNotifier::register(),
            stats_file <- debugfs.read_write_callback_file(
                c"stats",
                stats::DebugfsStats,
                &stats::DebugfsStats::show,
                &stats::DebugfsStats::write,
            ),
            retries_file <- debugfs.read_callback_file(
                c"file_read_retries",
                storage::FileReadRetries,
                &storage::FileReadRetries::show,
            ),
            debugfs,
            chardev <- chardev::register(module),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for P2pDirect {
    fn drop(self: Pin<&mut Self>) {
        pr_info!("unloading\n");
    }
}
