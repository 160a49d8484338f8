// SPDX-License-Identifier: GPL-2.0

//! PCI driver that turns a device's memory BAR into a p2pdirect provider.
//!
//! It binds QEMU's ivshmem-plain (1af4:1110, memory in BAR 2), which plays the
//! GPU in the test VM. Other devices whose BAR 2 is plain memory can be bound
//! through `/sys/bus/pci/drivers/p2pdirect/new_id`.

use crate::{
    devmem::Provider,
    ffi::{self, P2pMem, PciFunction},
};
use kernel::{device::Core, pci, prelude::*, sync::Arc};

/// The BAR that holds the memory.
const MEM_BAR: u32 = 2;
/// The granule the kernel maps device memory in (`SUBSECTION_SIZE`):
/// `memremap_pages` of a range that does not start and end on it fails with
/// a WARN, so such a BAR is refused before. Also the smallest provider.
const BAR_GRANULE: u64 = 1 << 21;

pub(crate) struct BarDriver;

/// Per-device state: the provider, unregistered when the device goes.
pub(crate) struct BoundBar {
    provider: Arc<Provider>,
    /// Dropped after `provider` (fields drop in order): the function stays
    /// enabled until its memory is back.
    _enabled: ffi::MemEnabled,
}

impl Drop for BoundBar {
    fn drop(&mut self) {
        self.provider.unregister();
    }
}

/// ivshmem-plain.
const IVSHMEM: pci::DeviceId = pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110);

#[cfg(not(kernel_ge_7_3))]
kernel::pci_device_table!(
    PCI_TABLE,
    MODULE_PCI_TABLE,
    <BarDriver as pci::Driver>::IdInfo,
    [(IVSHMEM, ())]
);

// From 7.3 an entry's driver_data points to its IdInfo, and `new_id` accepts
// only a driver_data of the table: a table without IdInfo keeps it 0, which
// is what `new_id` writes.
#[cfg(kernel_ge_7_3)]
kernel::pci_device_table!(PCI_TABLE, @none, [IVSHMEM]);

/// Says why a BAR cannot be a provider.
fn check_bar(pdev: &pci::Device<Core<'_>>) -> Result<u64> {
    if !ffi::bar_is_mem(pdev, MEM_BAR) {
        dev_err!(pdev, "BAR{} is not a memory BAR; not a provider\n", MEM_BAR);
        return Err(ENODEV);
    }
    let start = pdev.resource_start(MEM_BAR)?;
    let len = pdev.resource_len(MEM_BAR)?;
    if !bar_fits(start, len) {
        dev_err!(
            pdev,
            "BAR{} at {:#x}+{:#x} is not a provider: device memory is mapped in 2 MiB units, \
             so it must be at least 2 MiB and start and end on a 2 MiB boundary\n",
            MEM_BAR,
            start,
            len
        );
        return Err(ENODEV);
    }
    Ok(len)
}

impl pci::Driver for BarDriver {
    type IdInfo = ();
    type Data<'bound> = BoundBar;
    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    #[cfg(not(kernel_ge_7_3))]
    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: &'bound Self::IdInfo,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        Self::bind(pdev)
    }

    #[cfg(kernel_ge_7_3)]
    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        Self::bind(pdev)
    }
}

impl BarDriver {
    fn bind(pdev: &pci::Device<Core<'_>>) -> Result<BoundBar> {
        let result = (|| {
            let len = check_bar(pdev)?;
            let enabled = ffi::MemEnabled::new(pdev)?;
            ffi::p2pdma_add_bar(pdev, MEM_BAR)?;
            let size = usize::try_from(len).map_err(|_| EINVAL)?;
            let dev: &pci::Device = pdev;
            let mem = P2pMem::alloc(dev.into(), size)?;
            let provider = Provider::register_bar(PciFunction::from_pci(pdev), MEM_BAR, mem)?;
            dev_info!(
                pdev,
                "provider {}: BAR{} {} MiB at bus address {:#x}\n",
                provider.index,
                MEM_BAR,
                len >> 20,
                provider.bus_addr
            );
            Ok(BoundBar {
                provider,
                _enabled: enabled,
            })
        })();
        if let Err(e) = &result {
            dev_err!(pdev, "not registered as a provider ({:?})\n", e);
        }
        result
    }
}

/// Whether a BAR at `start` of `len` bytes can be mapped as device memory.
fn bar_fits(start: u64, len: u64) -> bool {
    len >= BAR_GRANULE && start % BAR_GRANULE == 0 && len % BAR_GRANULE == 0
}

#[kernel::macros::kunit_tests(p2pdirect_bar_driver)]
mod tests {
    use super::*;

    #[test]
    fn bars_in_whole_subsections_only() {
        const MIB: u64 = 1 << 20;
        assert!(bar_fits(0xf400_0000, 64 * MIB));
        assert!(bar_fits(0x8_0000_0000, 2 * MIB));
        // A 1 MiB BAR, or one that ends or starts inside a 2 MiB unit,
        // would make memremap_pages WARN.
        assert!(!bar_fits(0xf400_0000, MIB));
        assert!(!bar_fits(0xf400_0000, 3 * MIB));
        assert!(!bar_fits(0xf410_0000, 2 * MIB));
        assert!(!bar_fits(0, 0));
    }
}
