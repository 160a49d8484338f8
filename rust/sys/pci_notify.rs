// SPDX-License-Identifier: GPL-2.0

//! Being told when a driver is about to be unbound from a PCI device.
//!
//! Memory another driver published for P2PDMA (an NVMe CMB) goes away with
//! that driver: its removal tears the P2PDMA pool down and waits for every
//! page reference. A user of such memory must let go first; a bus notifier
//! on the PCI bus tells it, before the driver's `remove` runs.

use core::marker::PhantomData;
use kernel::{bindings, error::to_result, ffi::c_void, prelude::*, types::Opaque};

/// Told about drivers leaving and joining PCI devices. `id` identifies the
/// device as `PciFunction::id` of the ffi room does (its `struct pci_dev`),
/// `addr` is its address as `pci_p2pdma::pci_addr` encodes it.
pub(crate) trait PciUnbind: 'static {
    /// In process context, before the driver's resources go: its `remove`
    /// is about to run, or its `probe` failed.
    fn unbinding(id: usize, addr: u32);
    /// The driver is gone, a new one is about to probe, or the device is
    /// being removed (after a failed probe no driver was there to go).
    fn unbound(id: usize, addr: u32);
}

/// A registered notifier on the PCI bus.
///
/// # Invariants
///
/// `nb` is registered with `bus_register_notifier(&pci_bus_type)` from
/// construction until `Drop`, and stays at its address (pinned).
#[pin_data(PinnedDrop)]
pub(crate) struct PciUnbindNotifier<T: PciUnbind> {
    #[pin]
    nb: Opaque<bindings::notifier_block>,
    _t: PhantomData<T>,
}

// SAFETY: registration and unregistration may happen on any thread.
unsafe impl<T: PciUnbind> Send for PciUnbindNotifier<T> {}
// SAFETY: no `&self` method touches the notifier block.
unsafe impl<T: PciUnbind> Sync for PciUnbindNotifier<T> {}

impl<T: PciUnbind> PciUnbindNotifier<T> {
    pub(crate) fn register() -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            nb <- Opaque::try_ffi_init(|slot: *mut bindings::notifier_block| {
                // SAFETY: `slot` is valid for writes; once written it is a
                // valid notifier block, pinned, registered until `Drop`.
                unsafe {
                    slot.write(bindings::notifier_block {
                        notifier_call: Some(Self::call),
                        next: core::ptr::null_mut(),
                        priority: 0,
                    });
                    // INVARIANT: registered here, unregistered in `Drop`.
                    to_result(bindings::bus_register_notifier(
                        &raw const bindings::pci_bus_type,
                        slot,
                    ))
                }
            }),
            _t: PhantomData,
        })
    }

    /// # Safety
    ///
    /// Called by the notifier chain of the PCI bus only, with the device a
    /// bus event is about.
    unsafe extern "C" fn call(
        _nb: *mut bindings::notifier_block,
        action: kernel::ffi::c_ulong,
        data: *mut c_void,
    ) -> kernel::ffi::c_int {
        let event = |e: bindings::bus_notifier_event| u32::try_from(action).is_ok_and(|a| a == e);
        let dev = data.cast::<bindings::device>();
        // SAFETY: the PCI bus's notifier is called with a device of that bus,
        // valid for the call; a `struct pci_dev` embeds it as `dev`.
        let pdev = unsafe { kernel::container_of!(dev, bindings::pci_dev, dev) };
        // SAFETY: `pdev` is a valid `struct pci_dev` for the call, and
        // `pci::Device` is a transparent wrapper of one.
        let addr = || super::pci_p2pdma::pci_addr(unsafe { &*pdev.cast::<kernel::pci::Device>() });
        let id = pdev as usize;
        if event(bindings::bus_notifier_event_BUS_NOTIFY_UNBIND_DRIVER)
            || event(bindings::bus_notifier_event_BUS_NOTIFY_DRIVER_NOT_BOUND)
        {
            T::unbinding(id, addr());
        } else if event(bindings::bus_notifier_event_BUS_NOTIFY_UNBOUND_DRIVER)
            || event(bindings::bus_notifier_event_BUS_NOTIFY_BIND_DRIVER)
            || event(bindings::bus_notifier_event_BUS_NOTIFY_DEL_DEVICE)
        {
            T::unbound(id, addr());
        }
        bindings::NOTIFY_DONE as kernel::ffi::c_int
    }
}

#[pinned_drop]
impl<T: PciUnbind> PinnedDrop for PciUnbindNotifier<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: registered by the type invariant; unregistered once, here.
        unsafe {
            bindings::bus_unregister_notifier(&raw const bindings::pci_bus_type, self.nb.get())
        };
    }
}
