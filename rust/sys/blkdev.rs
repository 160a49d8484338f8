// SPDX-License-Identifier: GPL-2.0

//! Block-device topology: the PCI functions that do a block device's DMA.
//!
//! A disk on a PCI controller (an NVMe namespace, a partition of one) has
//! one: the first PCI device above it in the device tree. A stacked disk has
//! none of its own; its bios go on to its legs. md and dm list their legs in
//! the disk's `slaves/` directory (`bd_link_disk_holder()`), NVMe native
//! multipath lists a head's paths in its `multipath/` group. [`dma_legs`]
//! follows both, recursively, down to the controllers, so that a caller can
//! check every device that may DMA to a buffer, not only the first.

use kernel::{
    bindings, c_str,
    device::Device,
    ffi::{c_int, c_void},
    pci,
    prelude::*,
    str::{CStr, CString},
    sync::aref::ARef,
    types::Opaque,
};

/// At most this many levels of stacking are followed (dm on md on an NVMe
/// multipath head on its paths is three).
pub(crate) const MAX_DEPTH: u32 = 4;
/// At most this many legs (leaf block devices) per block device.
pub(crate) const MAX_LEGS: usize = 32;

/// A block device, borrowed from its opener.
///
/// # Invariants
///
/// The `struct block_device` is open (so it and its disk stay valid) for as
/// long as the reference is used.
#[repr(transparent)]
pub(crate) struct BlockDevice(Opaque<bindings::block_device>);

/// One leaf under a block device: a block device that sits on a PCI
/// controller, and that controller.
pub(crate) struct DmaLeg {
    /// The leaf's name in /sys/block (`nvme0n1p2`, `nvme1c2n1`, ...).
    pub(crate) name: CString,
    /// The PCI function doing the leaf's DMA.
    pub(crate) pci: ARef<pci::Device>,
}

impl BlockDevice {
    /// # Safety
    ///
    /// `ptr` points to a block device the caller holds open for `'a`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::block_device) -> &'a Self {
        // SAFETY: `BlockDevice` is a transparent wrapper; validity for `'a`
        // is the caller's promise.
        unsafe { &*ptr.cast() }
    }

    fn device(&self) -> &Device {
        // SAFETY: an open block device's `bd_device` is a registered device
        // that lives at least as long as the block device (type invariant).
        unsafe { Device::from_raw(&raw mut (*self.0.get()).bd_device) }
    }

    /// The leaves under this block device and their PCI functions: itself
    /// if it sits on a PCI controller, else the legs of its stacking driver,
    /// followed down to the controllers. `ENODEV` if a branch ends with no
    /// PCI device (a loop device, a RAM disk), `ELOOP` past [`MAX_DEPTH`]
    /// levels, `E2BIG` past [`MAX_LEGS`] leaves.
    pub(crate) fn dma_legs(&self) -> Result<KVec<DmaLeg>> {
        let mut out = KVec::new();
        // The caller's open keeps the device alive; the walk takes its own
        // references on everything below it.
        walk(self.device(), 0, &mut out)?;
        Ok(out)
    }
}

/// The `struct device` behind `dev`: `Device` is a transparent wrapper of it.
fn raw(dev: &Device) -> *mut bindings::device {
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// The first PCI device at or above `dev`.
fn pci_above(dev: &Device) -> Option<&pci::Device> {
    let mut d = raw(dev);
    while !d.is_null() {
        // SAFETY: `d` is `dev` or one of its ancestors; a device holds a
        // reference on its parent, so each is valid while `dev` is.
        let bus = unsafe { (*d).bus };
        if core::ptr::eq(bus, &raw const bindings::pci_bus_type) {
            // SAFETY: a device on the PCI bus is the `dev` of a `pci_dev`,
            // and `pci::Device` is a transparent wrapper of `pci_dev`; it
            // lives as long as `dev` (see above).
            return Some(unsafe { &*kernel::container_of!(d, bindings::pci_dev, dev).cast() });
        }
        // SAFETY: as above.
        d = unsafe { (*d).parent };
    }
    None
}

fn walk(dev: &Device, depth: u32, out: &mut KVec<DmaLeg>) -> Result {
    if let Some(p) = pci_above(dev) {
        if out.len() >= MAX_LEGS {
            return Err(E2BIG);
        }
        let name = CString::try_from_fmt(fmt!("{}", device_name(dev)))?;
        out.push(
            DmaLeg {
                name,
                pci: p.into(),
            },
            GFP_KERNEL,
        )?;
        return Ok(());
    }
    if depth >= MAX_DEPTH {
        // The kernel crate has no ELOOP constant.
        return Err(Error::from_errno(-(bindings::ELOOP as i32)));
    }
    let legs = stacked_legs(dev)?;
    if legs.is_empty() {
        return Err(ENODEV);
    }
    for leg in &legs {
        walk(leg, depth + 1, out)?;
    }
    Ok(())
}

fn device_name(dev: &Device) -> &CStr {
    // SAFETY: a registered device has a name (its kobject's), a valid C
    // string that lives as long as the device.
    unsafe { CStr::from_char_ptr((*raw(dev)).kobj.name) }
}

/// The `kernfs_node`s of the directories that list a stacked disk's legs,
/// each with a reference (released on drop).
struct LegDirs {
    dirs: [*mut bindings::kernfs_node; 2],
}

impl LegDirs {
    /// `dev` is the device of a block device (a disk or a partition); the
    /// directories are those of its disk.
    fn of(dev: &Device) -> Self {
        let mut dirs = [core::ptr::null_mut(); 2];
        // SAFETY: `dev` is the `bd_device` of a block device (the callers
        // walk only block-class devices), valid while `dev` is; so are its
        // disk and the disk's whole-device `part0`.
        unsafe {
            let bdev = kernel::container_of!(raw(dev), bindings::block_device, bd_device);
            let disk = (*bdev).bd_disk;
            let slaves = (*disk).slave_dir;
            if !slaves.is_null() && !(*slaves).sd.is_null() {
                bindings::kernfs_get((*slaves).sd);
                dirs[0] = (*slaves).sd;
            }
            let whole = &raw mut (*(*disk).part0).bd_device;
            let kn = (*whole).kobj.sd;
            if !kn.is_null() {
                dirs[1] = bindings::kernfs_find_and_get_ns(
                    kn,
                    c_str!("multipath").as_char_ptr(),
                    core::ptr::null(),
                );
            }
        }
        Self { dirs }
    }

    /// Whether one of the directories has an entry named `name`.
    fn lists(&self, name: &CStr) -> bool {
        self.dirs.iter().filter(|d| !d.is_null()).any(|&d| {
            // SAFETY: `d` is a referenced kernfs node (type invariant of
            // the array); `name` is a valid C string.
            let kn = unsafe {
                bindings::kernfs_find_and_get_ns(d, name.as_char_ptr(), core::ptr::null())
            };
            if kn.is_null() {
                return false;
            }
            // SAFETY: `kn` was returned with a reference just above.
            unsafe { bindings::kernfs_put(kn) };
            true
        })
    }
}

impl Drop for LegDirs {
    fn drop(&mut self) {
        for &d in self.dirs.iter().filter(|d| !d.is_null()) {
            // SAFETY: each non-null entry holds one reference (see `of`).
            unsafe { bindings::kernfs_put(d) };
        }
    }
}

struct Search<'a> {
    dirs: &'a LegDirs,
    found: KVec<ARef<Device>>,
    err: Option<Error>,
}

/// The block devices a stacked disk lists as its legs: every device of the
/// block class whose name one of its leg directories holds.
fn stacked_legs(dev: &Device) -> Result<KVec<ARef<Device>>> {
    let dirs = LegDirs::of(dev);
    if dirs.dirs.iter().all(|d| d.is_null()) {
        return Ok(KVec::new());
    }
    let mut search = Search {
        dirs: &dirs,
        found: KVec::new(),
        err: None,
    };
    // SAFETY: `dev` is valid; its class is the block class, registered for
    // as long as the block layer is (built in). `search` outlives the call,
    // and `visit` treats `data` as a `Search`.
    let ret = unsafe {
        bindings::class_for_each_device(
            (*raw(dev)).class,
            core::ptr::null(),
            (&raw mut search).cast(),
            Some(visit),
        )
    };
    if let Some(e) = search.err {
        return Err(e);
    }
    kernel::error::to_result(ret)?;
    Ok(search.found)
}

/// `class_for_each_device()` callback: keeps `dev` if it is a listed leg.
///
/// # Safety
///
/// `dev` is a device the iterator holds a reference on, `data` the `Search`
/// that `stacked_legs` passed, alive and not otherwise borrowed.
unsafe extern "C" fn visit(dev: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: `stacked_legs` passes a `Search` that outlives the iteration.
    let search = unsafe { &mut *data.cast::<Search<'_>>() };
    // SAFETY: the iterator holds a reference on `dev` during the call.
    let dev = unsafe { Device::from_raw(dev) };
    if !search.dirs.lists(device_name(dev)) {
        return 0;
    }
    if search.found.len() >= MAX_LEGS {
        search.err = Some(E2BIG);
        return 1;
    }
    if let Err(e) = search.found.push(dev.into(), GFP_KERNEL) {
        search.err = Some(e.into());
        return 1;
    }
    0
}
