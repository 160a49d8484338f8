// SPDX-License-Identifier: GPL-2.0

//! Device memory: providers and the allocations users carve out of them and
//! mmap (their "device pointers").
//!
//! Two kinds of provider:
//! - `Bar`: a BAR p2pdirect registered itself (bar_driver). p2pdirect takes
//!   all of it from the P2PDMA pool at once and carves allocations out of it
//!   with its own range allocator, so it knows exactly what is free.
//! - `Published`: P2PDMA memory another driver published (the NVMe CMB).
//!   Each allocation comes from that driver's pool; its size is the BAR's,
//!   and what is free is an upper bound (the owner allocates from it too).
//!
//! Lock order: `OpenFile::allocs` -> `Provider::inner` -> invalidation
//! subscribers (peer_mem) -> a consumer's own lock. The global provider list
//! (`ffi::providers()`) is taken alone, or before `Provider::inner`.
//!
//! Page lifetime: each allocation's pages carry one reference held by
//! p2pdirect from ALLOC to FREE; a mapping or a pin adds more. Freeing first
//! takes the memory away from everyone (registrations invalidated, user
//! mappings zapped: later access gets SIGBUS), then waits a bounded time for
//! transient pins (I/O in flight) and refuses with `EBUSY` if any remain, so
//! memory is never returned to the pool while a device can still reach it.

use crate::{
    ffi::{self, FileMapping, P2pMem, PciFunction},
    range_alloc::RangeAllocator,
};
use kernel::{
    mm::virt::VmaNew,
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
};

/// What kind of memory a provider has (the UAPI's `P2PDIRECT_PROVIDER_*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bar,
    Published,
}

/// Where an allocation's mappings live, so teardown can zap them.
pub(crate) struct MapInfo {
    mapping: FileMapping,
    mmap_offset: u64,
}

struct ProviderInner {
    /// `Bar`: all of the BAR; `None` for `Published` and once the device is gone.
    mem: Option<P2pMem>,
    /// `Bar`: the allocated ranges. `Published`: unused.
    ranges: RangeAllocator<MapInfo>,
    /// `Published`: bytes p2pdirect allocated from the owner's pool.
    published_used: u64,
}

/// A device-memory provider.
#[pin_data]
pub(crate) struct Provider {
    pub(crate) index: u32,
    pub(crate) kind: Kind,
    pub(crate) pdev: PciFunction,
    pub(crate) bar: u32,
    pub(crate) bar_size: u64,
    /// Bus address of the first byte of the provider's memory.
    pub(crate) bus_addr: u64,
    #[pin]
    inner: Mutex<ProviderInner>,
}

/// Snapshot of a provider's usage.
pub(crate) struct Usage {
    pub(crate) total: u64,
    pub(crate) used: u64,
}

static NEXT_PROVIDER: Atomic<u32> = Atomic::new(0);
/// Allocation ids are global so that mmap offsets, `id << MMAP_SHIFT`, never
/// collide between files sharing the device node's address space.
static NEXT_ALLOC: Atomic<u64> = Atomic::new(1);
const MMAP_SHIFT: u32 = 40;

impl Provider {
    fn new(
        kind: Kind,
        pdev: PciFunction,
        bar: u32,
        size: u64,
        bus: u64,
        mem: Option<P2pMem>,
    ) -> Result<Arc<Self>> {
        let managed = if kind == Kind::Bar { size } else { 0 };
        Arc::pin_init(
            pin_init!(Self {
                index: NEXT_PROVIDER.fetch_add(1, Relaxed),
                kind,
                pdev,
                bar,
                bar_size: size,
                bus_addr: bus,
                inner <- new_mutex!(ProviderInner {
                    mem,
                    ranges: RangeAllocator::new(managed),
                    published_used: 0,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// Registers `mem` (all of BAR `bar` of `pdev`) as a provider.
    pub(crate) fn register_bar(pdev: PciFunction, bar: u32, mem: P2pMem) -> Result<Arc<Self>> {
        let (size, bus) = (mem.size() as u64, mem.bus_addr(0));
        let provider = Self::new(Kind::Bar, pdev, bar, size, bus, Some(mem))?;
        ffi::providers().push(provider.clone(), GFP_KERNEL)?;
        Ok(provider)
    }

    /// The device is going away: drop it from the list, take its memory away
    /// from every user (mappings are zapped, registrations invalidated; later
    /// access gets SIGBUS) and give the BAR back to the P2PDMA pool.
    pub(crate) fn unregister(&self) {
        ffi::providers().retain(|p| p.index != self.index);
        // One lock hold from the first zap to the last release: no mmap or
        // ALLOC can reach the memory in between.
        let mut inner = self.inner.lock();
        for r in inner.ranges.ranges() {
            r.tag.mapping.zap(r.tag.mmap_offset, r.len);
        }
        let mut leaked = false;
        if let Some(mem) = inner.mem.as_ref() {
            for r in inner.ranges.ranges() {
                let handle = handle_of_mmap_offset(r.tag.mmap_offset);
                leaked |= !release_when_idle(mem, handle, r.start, r.len);
            }
        }
        inner.ranges.clear();
        if leaked {
            // Someone still pins pages: keeping the memory is the only safe choice.
            pr_err!(
                "provider {}: pages still pinned at removal; keeping its memory\n",
                self.index
            );
            core::mem::forget(inner.mem.take());
        } else {
            inner.mem = None;
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        let inner = self.inner.lock();
        match self.kind {
            Kind::Bar => Usage {
                total: if inner.mem.is_some() {
                    inner.ranges.size()
                } else {
                    0
                },
                used: inner.ranges.used_bytes(),
            },
            Kind::Published => Usage {
                total: self.bar_size,
                used: inner.published_used,
            },
        }
    }
}

/// Adds a provider for every device whose driver published P2PDMA memory
/// since the last look, and drops those whose driver withdrew it.
pub(crate) fn refresh_published() -> Result {
    let found = PciFunction::with_published_p2pmem()?;
    let mut list = ffi::providers();
    list.retain(|p| p.kind != Kind::Published || p.pdev.has_published_p2pmem());
    for f in found {
        if list
            .iter()
            .any(|p| p.kind == Kind::Published && p.pdev.addr() == f.addr())
        {
            continue;
        }
        // One page tells which BAR the pool lives in; the owner may also have
        // handed out everything, and then there is nothing to offer.
        let Ok(probe) = P2pMem::alloc(f.clone_ref(), PAGE_SIZE) else {
            continue;
        };
        let bus = probe.bus_addr(0);
        drop(probe);
        let Some((bar, start, len)) = f.bar_of_bus_addr(bus) else {
            continue;
        };
        let provider = Provider::new(Kind::Published, f, bar, len, start, None)?;
        list.push(provider, GFP_KERNEL)?;
    }
    Ok(())
}

/// The allocation handle an mmap offset names.
pub(crate) fn handle_of_mmap_offset(offset: u64) -> u64 {
    offset >> MMAP_SHIFT
}

/// Finds a provider by index.
pub(crate) fn provider(index: u32) -> Option<Arc<Provider>> {
    let find = || ffi::providers().iter().find(|p| p.index == index).cloned();
    // A provider published since the last LIST is found on a second look.
    find().or_else(|| refresh_published().ok().and_then(|()| find()))
}

/// Every provider now, by index.
pub(crate) fn providers() -> Result<KVec<Arc<Provider>>> {
    refresh_published()?;
    let list = ffi::providers();
    let mut out = KVec::with_capacity(list.len(), GFP_KERNEL)?;
    for p in list.iter() {
        out.push(p.clone(), GFP_KERNEL)?;
    }
    Ok(out)
}

/// Tells every consumer of allocation `handle` to let go, then waits
/// (bounded) for transient pins, e.g. an O_DIRECT request in flight, to end
/// and drops p2pdirect's page references on `mem[start..][..len]`. False if
/// they never ended. Invalidation is repeated on each try, so a consumer that
/// subscribed while pinning (REGISTER racing FREE) is caught as well.
fn release_when_idle(mem: &P2pMem, handle: u64, start: u64, len: u64) -> bool {
    let (Ok(start), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
        return false;
    };
    for _ in 0..100 {
        crate::peer_mem::invalidate(handle);
        if mem.try_release(start, len).is_ok() {
            return true;
        }
        ffi::msleep(100);
    }
    false
}

/// An allocation, owned by the open file that made it.
pub(crate) struct Allocation {
    pub(crate) handle: u64,
    provider: Arc<Provider>,
    /// Offset within the provider's memory (`Bar`) or within `own` (`Published`).
    start: u64,
    pub(crate) size: u64,
    /// `Published`: the memory taken from the owner's pool for this allocation.
    own: Option<P2pMem>,
    /// Where the allocation's user mappings live.
    mapping: FileMapping,
}

/// What ALLOC reports.
pub(crate) struct AllocInfo {
    pub(crate) handle: u64,
    pub(crate) size: u64,
    pub(crate) mmap_offset: u64,
    pub(crate) bus_addr: u64,
    pub(crate) provider_offset: u64,
}

impl Allocation {
    pub(crate) fn mmap_offset(&self) -> u64 {
        self.handle << MMAP_SHIFT
    }

    /// Carves `size` bytes (rounded up to pages) aligned to `align` (0: page)
    /// out of `provider`, for the file whose address space is `mapping`.
    pub(crate) fn new(
        provider: Arc<Provider>,
        size: u64,
        align: u64,
        mapping: FileMapping,
    ) -> Result<(Self, AllocInfo)> {
        let page = PAGE_SIZE as u64;
        if size == 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(EINVAL);
        }
        let size = size.checked_next_multiple_of(page).ok_or(ENOMEM)?;
        if size >= 1 << MMAP_SHIFT {
            return Err(ENOMEM);
        }
        let align = align.max(page);
        let handle = NEXT_ALLOC.fetch_add(1, Relaxed);
        if handle >= 1 << (63 - MMAP_SHIFT) {
            return Err(ENOSPC);
        }
        let mmap_offset = handle << MMAP_SHIFT;
        let (start, own, info) = match provider.kind {
            Kind::Bar => {
                let mut inner = provider.inner.lock();
                let inner = &mut *inner;
                let mem = inner.mem.as_ref().ok_or(ENODEV)?;
                let start = inner.ranges.alloc(
                    size,
                    align,
                    MapInfo {
                        mapping: mapping.clone(),
                        mmap_offset,
                    },
                )?;
                // Bounded by the BAR size, which is a usize.
                if let Err(e) = mem.hold(start as usize, size as usize) {
                    let _ = inner.ranges.free(start);
                    return Err(e);
                }
                let bus = mem.bus_addr(start as usize);
                (start, None, (bus, start))
            }
            Kind::Published => {
                if !provider.pdev.has_published_p2pmem() {
                    return Err(ENODEV);
                }
                if size > provider.bar_size || align > provider.bar_size {
                    return Err(ENOMEM);
                }
                // The owner's pool aligns to pages only: take enough to align within.
                let total = usize::try_from(size + align - page).map_err(|_| ENOMEM)?;
                let mem = P2pMem::alloc(provider.pdev.clone_ref(), total)?;
                let first = mem.bus_addr(0);
                let skip = first.next_multiple_of(align) - first;
                mem.hold(skip as usize, size as usize)?;
                let bus = first + skip;
                provider.inner.lock().published_used += size;
                (skip, Some(mem), (bus, bus - provider.bus_addr))
            }
        };
        let info = AllocInfo {
            handle,
            size,
            mmap_offset,
            bus_addr: info.0,
            provider_offset: info.1,
        };
        Ok((
            Self {
                handle,
                provider,
                start,
                size,
                own,
                mapping,
            },
            info,
        ))
    }

    /// Frees the allocation: takes the memory away from every user first
    /// (registrations invalidated, mappings zapped), then returns it unless a
    /// transient pin outlives a bounded wait (`EBUSY`; the allocation stays).
    pub(crate) fn try_free(&mut self) -> Result {
        self.mapping.zap(self.mmap_offset(), self.size);
        if let Some(own) = self.own.take() {
            if !release_when_idle(&own, self.handle, self.start, self.size) {
                self.own = Some(own);
                return Err(EBUSY);
            }
            drop(own);
            self.provider.inner.lock().published_used -= self.size;
            return Ok(());
        }
        let mut inner = self.provider.inner.lock();
        let inner = &mut *inner;
        if let Some(mem) = inner.mem.as_ref() {
            if !release_when_idle(mem, self.handle, self.start, self.size) {
                return Err(EBUSY);
            }
            inner.ranges.free(self.start)?;
        }
        // Without memory the provider already took everything back.
        Ok(())
    }

    /// Frees the allocation at close or exit. If a pin outlives the wait the
    /// memory is never reused: the pool must not get pinned pages back.
    pub(crate) fn free_at_close(&mut self) {
        if self.try_free().is_err() {
            self.leaked();
            core::mem::forget(self.own.take());
        }
    }

    fn leaked(&self) {
        pr_err!(
            "provider {}: allocation {} still pinned at close; its memory is not reused\n",
            self.provider.index,
            self.handle
        );
    }

    /// Maps the allocation into `vma` (which must cover exactly its size).
    pub(crate) fn map(&self, vma: &VmaNew) -> Result {
        let (start, size) = (self.start as usize, self.size as usize);
        if let Some(own) = self.own.as_ref() {
            return own.map_into(vma, start, size);
        }
        let inner = self.provider.inner.lock();
        let mem = inner.mem.as_ref().ok_or(ENODEV)?;
        mem.map_into(vma, start, size)
    }
}
