// SPDX-License-Identifier: GPL-2.0

//! PCI functions as P2PDMA providers: publishing a BAR, taking its memory
//! from the pool, distances, the published providers, who owns a physical
//! address, and how a function is named.
//!
//! C header: [`include/linux/pci-p2pdma.h`](srctree/include/linux/pci-p2pdma.h)

use core::{
    ptr::NonNull,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
};
use kernel::{
    bindings,
    device::Core,
    error::to_result,
    ffi::c_void,
    page::PAGE_SIZE,
    pci,
    prelude::*,
    sync::{aref::ARef, Arc},
};

use super::{c, page_ref, vma::FaultSlot};

fn raw(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`,
    // so a reference to it points at the `struct pci_dev` itself.
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// The function's `struct device`.
pub(crate) fn raw_device(dev: &pci::Device) -> *mut bindings::device {
    // SAFETY: `dev` is a valid `struct pci_dev`, which embeds its device.
    unsafe { &raw mut (*raw(dev)).dev }
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
    location_addr(domain, bus, devfn)
}

/// [`pci_addr`] of the function at `domain:bus:devfn`.
fn location_addr(domain: u32, bus: u32, devfn: u32) -> u32 {
    (domain << 16) | (bus << 8) | devfn
}

/// A PCI function with its [`slot_key`] and [`pci_addr`], read once: for a
/// function the I/O path names on every I/O.
pub(crate) struct LocatedPci {
    pci: ARef<pci::Device>,
    key: u64,
    addr: u32,
}

impl LocatedPci {
    /// Reads the function's location.
    pub(crate) fn new(pci: ARef<pci::Device>) -> Self {
        let (domain, bus, devfn) = location(&pci);
        Self {
            key: location_key(domain, bus, devfn),
            addr: location_addr(domain, bus, devfn),
            pci,
        }
    }

    pub(crate) fn pci(&self) -> &pci::Device {
        &self.pci
    }

    /// [`slot_key`] of the function.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// [`pci_addr`] of the function.
    pub(crate) fn addr(&self) -> u32 {
        self.addr
    }
}

/// A key naming the function's place in the topology, unique across every
/// segment.
pub(crate) fn slot_key(dev: &pci::Device) -> u64 {
    let (domain, bus, devfn) = location(dev);
    location_key(domain, bus, devfn)
}

/// [`slot_key`] of the function at `domain:bus:devfn` (bus and devfn are
/// 8-bit values).
pub(crate) fn location_key(domain: u32, bus: u32, devfn: u32) -> u64 {
    (u64::from(domain) << 16) | u64::from(((bus & 0xff) << 8) | (devfn & 0xff))
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
        // SAFETY: the walk holds a reference on `dev`; `pci::Device` is a
        // transparent wrapper of `struct pci_dev`.
        let pdev = unsafe { dev.cast::<pci::Device>().as_ref() };
        let hit = (0..bindings::PCI_STD_NUM_BARS).any(|bar| {
            resource(pdev, bar).is_some_and(|r| {
                // An unassigned BAR may still read [0, size): not an owner.
                let unset = (bindings::IORESOURCE_UNSET | bindings::IORESOURCE_DISABLED) as usize;
                r.flags & bindings::IORESOURCE_TYPE_BITS as usize
                    == bindings::IORESOURCE_MEM as usize
                    && r.flags & unset == 0
                    && phys >= r.start
                    && phys <= r.end
            })
        });
        if hit {
            // SAFETY: the walk's reference on `dev` is handed to the `ARef`;
            // `pci::Device` is a transparent wrapper of `struct pci_dev`.
            return Some(unsafe { ARef::from_raw(dev.cast()) });
        }
    }
}

/// A PCI function the driver bound to it enabled (`pci_enable_device_mem()`);
/// disabled again when dropped (`pci_disable_device()`), at the unbind or
/// when the probe fails after it. The PCI core does not do it: each bind
/// would add to the function's enable count, so that the next driver's
/// disable would not bring it to 0.
///
/// # Invariants
///
/// `dev` was enabled once by [`MemEnabled::new`] and not disabled since.
pub(crate) struct MemEnabled {
    dev: ARef<pci::Device>,
}

impl MemEnabled {
    /// Enables `dev`'s memory decoding for the driver bound to it.
    pub(crate) fn new(dev: &pci::Device<Core<'_>>) -> Result<Self> {
        dev.enable_device_mem()?;
        let dev: &pci::Device = dev;
        // INVARIANT: enabled just above.
        Ok(Self { dev: dev.into() })
    }
}

impl Drop for MemEnabled {
    fn drop(&mut self) {
        // SAFETY: `dev` is a valid PCI device (a reference is held), enabled
        // once by `new` (type invariant); this balances that enable.
        unsafe { bindings::pci_disable_device(raw(&self.dev)) };
    }
}

/// Registers all of BAR `bar` of `dev` as P2PDMA memory (device-managed: the
/// kernel removes it when the driver unbinds).
pub(crate) fn add_bar(dev: &pci::Device<Core<'_>>, bar: u32) -> Result {
    let bar = i32::try_from(bar).map_err(|_| EINVAL)?;
    // SAFETY: `dev` is bound to the caller's driver (Core context), as devm
    // requires.
    to_result(unsafe { bindings::pci_p2pdma_add_resource(raw(dev), bar, 0, 0) })
}

/// Whether BAR `bar` of `dev` is a memory BAR.
pub(crate) fn bar_is_mem(dev: &pci::Device, bar: u32) -> bool {
    let Some(r) = resource(dev, bar) else {
        return false;
    };
    r.flags & bindings::IORESOURCE_MEM as usize != 0
}

/// BAR `bar`'s resource in `dev` (standard BARs only).
fn resource_ptr(dev: &pci::Device, bar: u32) -> Option<*mut bindings::resource> {
    if bar >= bindings::PCI_STD_NUM_BARS {
        return None;
    }
    // SAFETY: `dev` is a valid `struct pci_dev`; `bar` indexes its array.
    Some(unsafe {
        (&raw mut (*raw(dev)).resource)
            .cast::<bindings::resource>()
            .add(bar as usize)
    })
}

/// A copy of BAR `bar`'s resource, read without forming a reference: the
/// PCI core may rewrite the resources of a device no driver holds (rescan,
/// BAR resize) while it is walked.
fn resource(dev: &pci::Device, bar: u32) -> Option<bindings::resource> {
    let r = resource_ptr(dev, bar)?;
    // SAFETY: `r` points into the live `struct pci_dev`; a racing update
    // gives a stale or mixed value, which the callers treat as a hint.
    Some(unsafe { core::ptr::read_volatile(r) })
}

/// The kernel's P2PDMA distance from `provider` to `client`, or `None`
/// when they cannot reach each other.
pub(crate) fn distance(provider: &pci::Device, client: &pci::Device) -> Option<u32> {
    let mut clients = [raw_device(client)];
    // SAFETY: both devices are valid; the array holds one client device.
    let d = unsafe {
        bindings::pci_p2pdma_distance_many(raw(provider), clients.as_mut_ptr(), 1, false)
    };
    u32::try_from(d).ok()
}

/// Collects the functions a `pci_get_*` walker yields.
///
/// # Safety
///
/// `next(NULL)` starts the walk, `next(prev)` drops the reference on `prev`
/// and returns the next function with a new reference, or NULL at the end
/// (the `pci_get_device()` contract).
unsafe fn collect(
    mut next: impl FnMut(*mut bindings::pci_dev) -> *mut bindings::pci_dev,
    mut keep: impl FnMut(&pci::Device) -> bool,
) -> Result<KVec<ARef<pci::Device>>> {
    let mut out = KVec::new();
    let mut cur: *mut bindings::pci_dev = core::ptr::null_mut();
    loop {
        cur = next(cur);
        let Some(dev) = NonNull::new(cur) else {
            return Ok(out);
        };
        // SAFETY: the walk holds a reference on `dev` until the next call;
        // `pci::Device` is a transparent wrapper of `struct pci_dev`.
        let dev = unsafe { dev.cast::<pci::Device>().as_ref() };
        if keep(dev) {
            // The list's own reference (the walk keeps its own).
            if let Err(e) = out.push(ARef::from(dev), GFP_KERNEL) {
                // SAFETY: ends the walk early, dropping its reference.
                unsafe { bindings::pci_dev_put(cur) };
                return Err(e.into());
            }
        }
    }
}

/// Every NVMe controller present now.
pub(crate) fn nvme_controllers() -> Result<KVec<ARef<pci::Device>>> {
    // SAFETY: `pci_get_class` follows the walker contract of `collect`.
    unsafe {
        collect(
            |prev| bindings::pci_get_class(bindings::PCI_CLASS_STORAGE_EXPRESS, prev),
            |_| true,
        )
    }
}

/// Whether `dev`'s driver published P2PDMA memory (`pci_has_p2pmem()` is
/// private to the PCI core): the published provider closest to a device is
/// the device itself, at distance 0, exactly when it published.
pub(crate) fn has_published_p2pmem(dev: &pci::Device) -> bool {
    let mut clients = [raw_device(dev)];
    // SAFETY: the array holds one valid device; the result is referenced.
    let closest = unsafe { bindings::pci_p2pmem_find_many(clients.as_mut_ptr(), 1) };
    let published = closest == raw(dev);
    // SAFETY: drops the reference `pci_p2pmem_find_many` took (NULL is fine).
    unsafe { bindings::pci_dev_put(closest) };
    published
}

/// Every function whose driver published P2PDMA memory (an NVMe CMB...).
pub(crate) fn with_published_p2pmem() -> Result<KVec<ARef<pci::Device>>> {
    // SAFETY: `pci_get_device` follows the walker contract of `collect`.
    unsafe {
        collect(
            |prev| {
                bindings::pci_get_device(
                    bindings::PCI_ANY_ID as u32,
                    bindings::PCI_ANY_ID as u32,
                    prev,
                )
            },
            has_published_p2pmem,
        )
    }
}

/// The memory BAR of `dev` holding bus address `bus`: (index, bus start,
/// size).
pub(crate) fn bar_of_bus_addr(dev: &pci::Device, bus: u64) -> Option<(u32, u64, u64)> {
    (0..bindings::PCI_STD_NUM_BARS).find_map(|bar| {
        let r = resource(dev, bar)?;
        let len = if r.end >= r.start && r.end != 0 {
            (r.end - r.start).checked_add(1)?
        } else {
            0
        };
        if r.flags & bindings::IORESOURCE_MEM as usize == 0 || len == 0 {
            return None;
        }
        let mut region = bindings::pci_bus_region::default();
        // SAFETY: `dev` and its bus are valid; `r` is a copy of one of its
        // resources, which the call only reads; `region` is our local.
        unsafe {
            bindings::pcibios_resource_to_bus(
                (*raw(dev)).bus,
                &mut region,
                core::ptr::from_ref(&r).cast_mut(),
            )
        };
        let start = region.start;
        (bus >= start && bus - start < len).then_some((bar, start, len))
    })
}

/// All of a provider's P2PDMA memory, taken from its pool at once, in the
/// kernel's address space.
///
/// # Invariants
///
/// `kaddr..kaddr + size` was returned by `pci_alloc_p2pmem(pdev, size)` and
/// is freed only by `Drop`, and only once no [`HeldPages`] of it is left
/// (`held` counts them); `size` is a non-zero multiple of `PAGE_SIZE`;
/// `serial` names this allocation alone among all of them.
pub(crate) struct P2pMem {
    pdev: ARef<pci::Device>,
    kaddr: NonNull<u8>,
    size: usize,
    serial: u64,
    held: AtomicUsize,
}

/// The owner's reference on each page of one range of a [`P2pMem`]: taken
/// by [`P2pMem::try_hold`], given back only by [`P2pMem::try_release`].
/// Dropping it keeps the pages taken (and the memory with them: a leak,
/// never a page freed under its user).
///
/// # Invariants
///
/// Each page of `off..off + len` of the `P2pMem` whose serial is `owner`
/// holds one reference for this value alone, and `len` is a non-zero
/// multiple of `PAGE_SIZE`.
#[must_use]
pub(crate) struct HeldPages {
    owner: u64,
    off: usize,
    len: usize,
}

impl HeldPages {
    /// Where the range starts in its memory.
    pub(crate) fn offset(&self) -> usize {
        self.off
    }
}

/// Names each [`P2pMem`] for its [`HeldPages`].
static SERIAL: AtomicU64 = AtomicU64::new(1);

// SAFETY: the memory is device memory addressed by kernel virtual address;
// the methods take explicit ranges and the owner serialises their use.
unsafe impl Send for P2pMem {}
// SAFETY: as above.
unsafe impl Sync for P2pMem {}

impl P2pMem {
    /// Takes `size` bytes (whole pages) from the P2PDMA pool of `pdev`.
    pub(crate) fn alloc(pdev: ARef<pci::Device>, size: usize) -> Result<Self> {
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        // SAFETY: `pdev` is valid; a null return means no memory.
        let raw_mem = unsafe { bindings::pci_alloc_p2pmem(raw(&pdev), size) };
        let kaddr = NonNull::new(raw_mem.cast::<u8>()).ok_or(ENOMEM)?;
        // INVARIANT: just allocated from the pool with this size; the
        // serial is new (a 64-bit count never wraps).
        Ok(Self {
            pdev,
            kaddr,
            size,
            serial: SERIAL.fetch_add(1, Relaxed),
            held: AtomicUsize::new(0),
        })
    }

    /// The kernel address of bytes `off..off + len`, whole pages inside the
    /// allocation; `EINVAL` otherwise.
    pub(crate) fn range(&self, off: usize, len: usize) -> Result<*mut c_void> {
        // An empty range is still the place of one page: `off` itself must
        // lie inside.
        let end = off.checked_add(len.max(1)).ok_or(EINVAL)?;
        if end > self.size || off % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        // SAFETY: `off` is within the allocation (checked above).
        Ok(unsafe { self.kaddr.as_ptr().add(off) }.cast())
    }

    /// Bytes of device memory held.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// PCI bus address of byte `off` (0 past the end).
    pub(crate) fn bus_addr(&self, off: usize) -> u64 {
        let Ok(p) = self.range(off - off % PAGE_SIZE, 0) else {
            return 0;
        };
        // SAFETY: `p` lies in memory allocated from this device's pool.
        let page_bus = unsafe { bindings::pci_p2pmem_virt_to_bus(raw(&self.pdev), p) };
        page_bus + (off % PAGE_SIZE) as u64
    }

    /// The physical address of byte `off` (`None` past the end).
    pub(crate) fn phys(&self, off: usize) -> Option<u64> {
        let p = self.range(off - off % PAGE_SIZE, 0).ok()?;
        // SAFETY: `p` lies in this allocation, in the kernel's linear map,
        // and its page is the provider's while the allocation lives.
        let page = unsafe { c::p2pdirect_page_phys(c::p2pdirect_virt_to_page(p)) };
        Some(page + (off % PAGE_SIZE) as u64)
    }

    /// Takes the owner's reference on the pages of a range of the allocation
    /// (see [`super::page_ref`]); `EBUSY` if any of them is referenced
    /// already (a range held twice, or one still mapped), `EINVAL` for a
    /// range that is empty or not whole pages inside.
    pub(crate) fn try_hold(&self, off: usize, len: usize) -> Result<HeldPages> {
        if len == 0 {
            return Err(EINVAL);
        }
        let p = self.range(off, len)?;
        // SAFETY: the range is whole pages of this allocation (checked).
        if !unsafe { page_ref::try_hold(p, len) } {
            return Err(EBUSY);
        }
        self.held.fetch_add(1, Relaxed);
        // INVARIANT: each page went from no reference to this one.
        Ok(HeldPages {
            owner: self.serial,
            off,
            len,
        })
    }

    /// Gives back the owner's reference on the pages of `held` if nothing
    /// else (a mapping, a pin) references them; otherwise, or if `held` is
    /// another allocation's, hands `held` back unchanged.
    pub(crate) fn try_release(&self, held: HeldPages) -> core::result::Result<(), HeldPages> {
        if held.owner != self.serial {
            return Err(held);
        }
        // By the invariants `held` is a non-empty range of whole pages of
        // this allocation.
        let Ok(p) = self.range(held.off, held.len) else {
            return Err(held);
        };
        // SAFETY: by `held`'s invariant, its pages hold its reference and
        // nothing else has released it (it is given back only here, which
        // consumes `held`).
        if !unsafe { page_ref::try_release(p, held.len) } {
            return Err(held);
        }
        self.held.fetch_sub(1, Relaxed);
        Ok(())
    }

    /// Fills `len` bytes at `off` with zeros through the CPU, in chunks of
    /// 1 MiB with rescheduling points (a large BAR takes a while). `EINTR`
    /// when the calling task is killed before the end: what it zeroed so
    /// far is of no use to anyone, so it stops. Process context only.
    pub(crate) fn zero(&self, off: usize, len: usize) -> Result {
        let p = self.range(off, len)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(1 << 20);
            // SAFETY: `p + done .. + n` lies in this allocation (checked),
            // mapped in the kernel's address space by the P2PDMA core.
            unsafe { bindings::memset_io(p.cast::<u8>().add(done).cast(), 0, n) };
            done += n;
            if super::resched() && done < len {
                return Err(EINTR);
            }
        }
        Ok(())
    }

    /// Maps the page at `off` where a fault on one of its mappings waits.
    pub(crate) fn insert_page(&self, off: usize, slot: FaultSlot<'_>) -> Result {
        let p = self.range(off - off % PAGE_SIZE, PAGE_SIZE)?;
        let (vma, addr) = slot.target();
        // SAFETY: `vma` is faulting (the slot's invariant) and the page is
        // this allocation's, which the caller keeps from going away.
        let r = unsafe { bindings::vm_insert_page(vma, addr, c::p2pdirect_virt_to_page(p)) };
        // `EBUSY`: another thread's fault mapped it first.
        if r == -(bindings::EBUSY as i32) {
            return Ok(());
        }
        to_result(r)
    }
}

impl P2pMem {
    /// The P2PDMA provider (the BAR) holding byte `off`, for mapping it to
    /// peers (`None` past the end).
    pub(crate) fn provider(self: &Arc<Self>, off: usize) -> Option<P2pProvider> {
        let (bar, _, _) = bar_of_bus_addr(&self.pdev, self.bus_addr(off))?;
        // SAFETY: the memory came from this function's pool, so its P2PDMA
        // state is set up (`pcim_p2pdma_init`) and `bar` is a memory BAR.
        let p = unsafe { bindings::pcim_p2pdma_provider(raw(&self.pdev), bar as i32) };
        // INVARIANT: the provider of a BAR whose pool this memory is from,
        // with the memory.
        NonNull::new(p).map(|p| P2pProvider {
            p,
            mem: self.clone(),
        })
    }
}

/// The P2PDMA provider of one BAR (`struct p2pdma_provider`).
///
/// # Invariants
///
/// `p` is the provider of the BAR `mem` was taken from. The PCI core frees
/// it with the device's P2PDMA state when the owning driver unbinds
/// (device-managed), after `memunmap_pages()` waited for every reference on
/// the pool's pages, which `mem`, not yet given back, still holds: so `p`
/// is valid while `self` lives.
pub(crate) struct P2pProvider {
    p: NonNull<bindings::p2pdma_provider>,
    mem: Arc<P2pMem>,
}

impl P2pProvider {
    pub(crate) fn as_ptr(&self) -> *mut bindings::p2pdma_provider {
        self.p.as_ptr()
    }

    /// Whether `client` can reach the memory (its P2PDMA [`distance`]).
    pub(crate) fn reaches(&self, client: &pci::Device) -> bool {
        distance(&self.mem.pdev, client).is_some()
    }
}

impl Drop for P2pMem {
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        if held != 0 {
            // Pages still held may still be mapped or pinned: the memory
            // stays taken (the owner's teardown then waits for it).
            pr_err!(
                "{} bytes of P2PDMA memory stay taken: {} ranges of it are still held\n",
                self.size,
                held
            );
            return;
        }
        // SAFETY: by the type invariant this is the allocation's one free,
        // with the size it was allocated with, and no page of it is held.
        unsafe {
            bindings::pci_free_p2pmem(raw(&self.pdev), self.kaddr.as_ptr().cast(), self.size)
        };
    }
}
