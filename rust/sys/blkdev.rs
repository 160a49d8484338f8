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

use super::{c, opaque_ptr, uapi};
use kernel::{
    bindings, c_str,
    device::Device,
    ffi::{c_int, c_void},
    pci,
    prelude::*,
    str::{CStr, CString},
    sync::{
        aref::ARef,
        lock::{mutex::MutexBackend, Backend},
    },
    types::Opaque,
};

/// At most this many levels of stacking are followed (dm on md on an NVMe
/// multipath head on its paths is three): the UAPI's value.
pub(crate) const MAX_DEPTH: u32 = uapi::P2PDIRECT_STACK_MAX_DEPTH;
/// At most this many legs (leaf block devices) per block device: the UAPI's
/// value.
pub(crate) const MAX_LEGS: usize = uapi::P2PDIRECT_STACK_MAX_LEGS as usize;

/// A block device, borrowed from its opener.
///
/// # Invariants
///
/// The `struct block_device` is open (so it and its disk stay valid) for as
/// long as the reference is used.
#[repr(transparent)]
pub(crate) struct BlockDevice(Opaque<bindings::block_device>);

/// What the bio builder needs to know about a block device and its queue.
#[derive(Clone, Copy, Default)]
pub(crate) struct Limits {
    pub(crate) logical_block_size: u32,
    /// Bytes per bio.
    pub(crate) max_bytes: u32,
    /// Segments per bio (at most `BIO_MAX_VECS`).
    pub(crate) max_segments: u32,
    /// The queue accepts P2PDMA pages.
    pub(crate) p2pdma: bool,
    pub(crate) read_only: bool,
    /// `dev_t` of the block device (`MAJOR << 20 | MINOR`).
    pub(crate) devt: u32,
    /// Bytes.
    pub(crate) size: u64,
}

/// The devices doing a block device's DMA (see
/// [`BlockDevice::dma_devices`]).
pub(crate) enum DmaDevices {
    /// It sits on this PCI function itself.
    Own(ARef<pci::Device>),
    /// It is stacked: the leaves under it.
    Legs(KVec<DmaLeg>),
}

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

    /// The `struct block_device`, for the C functions that take it.
    pub(crate) fn as_raw(&self) -> *mut bindings::block_device {
        opaque_ptr(&self.0)
    }

    fn device(&self) -> &Device {
        // SAFETY: an open block device's `bd_device` is a registered device
        // that lives at least as long as the block device (type invariant).
        unsafe { Device::from_raw(&raw mut (*opaque_ptr(&self.0)).bd_device) }
    }

    /// Who the disk under this block device is: its `diskseq` (never the
    /// same for a disk created later, see `inc_diskseq()`) and this block
    /// device's `dev_t` (a partition's own).
    pub(crate) fn identity(&self) -> (u64, u32) {
        // SAFETY: an open block device has a valid disk (type invariant).
        // `inc_diskseq()` may rewrite the sequence of a loop or nbd disk
        // meanwhile: read once, as a whole.
        unsafe {
            (
                core::ptr::read_volatile(&raw const (*(*opaque_ptr(&self.0)).bd_disk).diskseq),
                (*opaque_ptr(&self.0)).bd_dev,
            )
        }
    }

    /// Its queue's limits, size and access (read now: a resize or a change
    /// of the queue limits later is seen by the next I/O).
    pub(crate) fn limits(&self) -> Limits {
        let b = opaque_ptr(&self.0);
        // SAFETY: an open block device has a valid queue (type invariant).
        // The limits are read without the queue's lock, as the block
        // layer's own submitters do: a racing update gives old or new
        // values, each of which the queue accepts.
        let (lbs, max_sectors, max_segments, nr_sectors, devt, features) = unsafe {
            let q = &raw const (*(*b).bd_queue).limits;
            (
                (*q).logical_block_size,
                (*q).max_sectors,
                u32::from((*q).max_segments),
                core::ptr::read_volatile(&raw const (*b).bd_nr_sectors),
                (*b).bd_dev,
                (*q).features,
            )
        };
        Limits {
            logical_block_size: lbs,
            // `queue_max_bytes()`: at most `INT_MAX` rounded down to a sector.
            max_bytes: max_sectors.min(i32::MAX as u32 >> 9) << 9,
            max_segments: max_segments.min(bindings::BIO_MAX_VECS),
            // `blk_queue_pci_p2pdma()`.
            p2pdma: features & c::P2PDIRECT_BLK_FEAT_PCI_P2PDMA != 0,
            // SAFETY: as above.
            read_only: unsafe { c::p2pdirect_bdev_read_only(b) },
            devt,
            size: nr_sectors.saturating_mul(512),
        }
    }

    /// Whether the disk was deleted (`GD_DEAD`). Read without its lock: the
    /// disk may die right after, and then its bios fail.
    pub(crate) fn disk_dead(&self) -> bool {
        // SAFETY: as in `identity`; a racy read of a flags word.
        let state =
            unsafe { core::ptr::read_volatile(&raw const (*(*opaque_ptr(&self.0)).bd_disk).state) };
        state & (1 << bindings::GD_DEAD) != 0
    }

    /// The PCI function doing this block device's DMA if it sits on one
    /// itself (a disk's parents never change while it lives, so that
    /// holds for its [`identity`](Self::identity)), else its legs as
    /// [`BlockDevice::dma_legs`] finds them: the device is read once.
    pub(crate) fn dma_devices(&self) -> Result<DmaDevices> {
        let dev = self.device();
        let mut out = KVec::new();
        match read_node(dev) {
            Node::Pci(pci) => return Ok(DmaDevices::Own(pci)),
            node => walk_node(dev, node, 0, &mut out)?,
        }
        if out.is_empty() {
            return Err(ENODEV);
        }
        by_name(&mut out);
        Ok(DmaDevices::Legs(out))
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
        if out.is_empty() {
            return Err(ENODEV);
        }
        by_name(&mut out);
        Ok(out)
    }
}

/// Puts the legs in name order: the walk finds them in the order their
/// block devices were added (asynchronous scans), which differs from boot to
/// boot, and the UAPI reports the first leg in name order.
fn by_name(legs: &mut [DmaLeg]) {
    legs.sort_unstable_by(|a, b| a.name.to_bytes().cmp(b.name.to_bytes()));
}

/// The `struct device` behind `dev`: `Device` is a transparent wrapper of it.
fn raw(dev: &Device) -> *mut bindings::device {
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// The first PCI device at or above `dev`.
///
/// # Safety
///
/// The ancestors of `dev` are alive: the caller holds the `open_mutex` of
/// `dev`'s disk and saw the disk not dead (see [`read_node`]).
unsafe fn pci_above(dev: &Device) -> Option<&pci::Device> {
    let mut d = raw(dev);
    while !d.is_null() {
        // SAFETY: `d` is `dev` or one of its ancestors, alive by the
        // function's safety requirement.
        let bus = unsafe { (*d).bus };
        if core::ptr::eq(bus, &raw const bindings::pci_bus_type) {
            // SAFETY: a device on the PCI bus is the `dev` of a `pci_dev`,
            // and `pci::Device` is a transparent wrapper of `pci_dev`.
            return Some(unsafe { &*kernel::container_of!(d, bindings::pci_dev, dev).cast() });
        }
        // SAFETY: as above.
        d = unsafe { (*d).parent };
    }
    None
}

/// What the walk needs of one block device, read while its disk lives.
enum Node {
    /// The disk was deleted (or is being deleted): it takes no more I/O.
    Dead,
    /// It sits on this PCI function.
    Pci(ARef<pci::Device>),
    /// It sits on no PCI device: its legs are listed in these directories.
    Stacked(LegDirs),
}

/// Reads `dev` (a disk or a partition of one) under its disk's `open_mutex`.
///
/// `del_gendisk()` marks the disk dead (`GD_DEAD`) under that mutex before
/// it drops the disk's `slave_dir`, removes its sysfs directory, deletes its
/// partitions and device (which puts the parents' references); a disk's
/// device holds its parent (the NVMe controller), which holds its PCI
/// function. So while the mutex is held and the disk is not dead, all of
/// them are valid, and the references taken then outlive the mutex.
fn read_node(dev: &Device) -> Node {
    // SAFETY: `dev` is the `bd_device` of a block device (only disks and
    // partitions are devices of the block class), kept alive by the caller;
    // a partition holds its disk, so `bd_disk` is valid. The mutex is the
    // disk's own, taken and released here; nothing else is held, and the
    // order open_mutex -> kernfs_rwsem (in `LegDirs::of`) is the block
    // layer's own (`bd_link_disk_holder()`).
    unsafe {
        let bdev = kernel::container_of!(raw(dev), bindings::block_device, bd_device);
        let disk = (*bdev).bd_disk;
        let mutex = &raw mut (*disk).open_mutex;
        // The guard state is `()` for a mutex; it is kept to pair the calls.
        #[allow(clippy::let_unit_value)]
        let guard = MutexBackend::lock(mutex);
        let state = core::ptr::read_volatile(&raw const (*disk).state);
        let node = if state & (1 << bindings::GD_DEAD) != 0 {
            Node::Dead
        } else if let Some(p) = pci_above(dev) {
            Node::Pci(p.into())
        } else {
            Node::Stacked(LegDirs::of(disk))
        };
        MutexBackend::unlock(mutex, &guard);
        node
    }
}

fn walk(dev: &Device, depth: u32, out: &mut KVec<DmaLeg>) -> Result {
    walk_node(dev, read_node(dev), depth, out)
}

/// [`walk`] from `dev`, already read as `node`.
fn walk_node(dev: &Device, node: Node, depth: u32, out: &mut KVec<DmaLeg>) -> Result {
    let dirs = match node {
        // A deleted leg gets no more bios; the device itself is refused
        // when it has no live leg at all (`dma_legs`).
        Node::Dead => return Ok(()),
        Node::Pci(pci) => {
            if out.len() >= MAX_LEGS {
                return Err(E2BIG);
            }
            let name = CString::try_from_fmt(fmt!("{}", device_name(dev)))?;
            out.push(DmaLeg { name, pci }, GFP_KERNEL)?;
            return Ok(());
        }
        Node::Stacked(dirs) => dirs,
    };
    if depth >= MAX_DEPTH {
        // The kernel crate has no ELOOP constant.
        return Err(Error::from_errno(-(bindings::ELOOP as i32)));
    }
    for leg in &stacked_legs(dev, &dirs)? {
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
    /// The directories of `disk`, referenced.
    ///
    /// # Safety
    ///
    /// The caller holds `disk`'s `open_mutex` and saw it not dead (see
    /// [`read_node`]): its `slave_dir` and sysfs directory are valid.
    unsafe fn of(disk: *mut bindings::gendisk) -> Self {
        let mut dirs = [core::ptr::null_mut(); 2];
        // SAFETY: by the function's safety requirement.
        unsafe {
            let slaves = (*disk).slave_dir;
            if !slaves.is_null() && !(*slaves).sd.is_null() {
                bindings::kernfs_get((*slaves).sd);
                dirs[0] = (*slaves).sd;
            }
            let whole = &raw mut (*(*disk).part0).bd_device;
            let kn = (*whole).kobj.sd;
            if !kn.is_null() {
                let mp = bindings::kernfs_find_and_get_ns(
                    kn,
                    c_str!("multipath").as_char_ptr(),
                    core::ptr::null(),
                );
                // Only a directory has entries to look up.
                if !mp.is_null()
                    && u32::from((*mp).flags) & bindings::KERNFS_TYPE_MASK
                        != bindings::kernfs_node_type_KERNFS_DIR
                {
                    bindings::kernfs_put(mp);
                } else {
                    dirs[1] = mp;
                }
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

/// The block devices a stacked disk lists as its legs in `dirs`: every
/// device of the block class (that of `dev`) whose name they hold.
fn stacked_legs(dev: &Device, dirs: &LegDirs) -> Result<KVec<ARef<Device>>> {
    if dirs.dirs.iter().all(|d| d.is_null()) {
        return Ok(KVec::new());
    }
    let mut search = Search {
        dirs,
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
