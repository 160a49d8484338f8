// SPDX-License-Identifier: GPL-2.0

//! Device memory: providers (a PCI BAR registered as P2PDMA memory) and the
//! allocations users carve out of them and mmap (their "device pointers").
//!
//! Lock order: `OpenFile::allocs` -> `Provider::inner`. The global provider
//! list (`ffi::providers()`) is never held while either is taken.
//!
//! Page lifetime: each allocation's pages carry one reference held by
//! p2pdirect from ALLOC to FREE; a mapping or a pin adds more. FREE refuses
//! (`EBUSY`) while any other reference exists, so memory is never returned to
//! the pool while a process or a device can still reach it.

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

/// Where an allocation's mappings live, so teardown can zap them.
pub(crate) struct MapInfo {
    mapping: FileMapping,
    mmap_offset: u64,
}

struct ProviderInner {
    /// `None` once the device is gone.
    mem: Option<P2pMem>,
    ranges: RangeAllocator<MapInfo>,
}

/// A device-memory provider.
#[pin_data]
pub(crate) struct Provider {
    pub(crate) index: u32,
    pub(crate) pdev: PciFunction,
    pub(crate) bar: u32,
    pub(crate) bar_size: u64,
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
    /// Registers `mem` (all of BAR `bar` of `pdev`) as a provider.
    pub(crate) fn register(pdev: PciFunction, bar: u32, mem: P2pMem) -> Result<Arc<Self>> {
        let size = mem.size() as u64;
        let bus = mem.bus_addr(0);
        let provider = Arc::pin_init(
            pin_init!(Self {
                index: NEXT_PROVIDER.fetch_add(1, Relaxed),
                pdev,
                bar,
                bar_size: size,
                bus_addr: bus,
                inner <- new_mutex!(ProviderInner {
                    mem: Some(mem),
                    ranges: RangeAllocator::new(size),
                }),
            }),
            GFP_KERNEL,
        )?;
        ffi::providers().push(provider.clone(), GFP_KERNEL)?;
        Ok(provider)
    }

    /// The device is going away: drop it from the list, take its memory away
    /// from every user (mappings are zapped; later access gets SIGBUS) and
    /// give the BAR back to the P2PDMA pool.
    pub(crate) fn unregister(&self) {
        ffi::providers().retain(|p| p.index != self.index);
        let mut inner = self.inner.lock();
        for r in inner.ranges.ranges() {
            r.tag.mapping.zap(r.tag.mmap_offset, r.len);
        }
        let mut leaked = false;
        if let Some(mem) = inner.mem.as_ref() {
            for r in inner.ranges.ranges() {
                leaked |= !release_when_idle(mem, r.start, r.len);
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
        Usage {
            total: if inner.mem.is_some() {
                inner.ranges.size()
            } else {
                0
            },
            used: inner.ranges.used_bytes(),
        }
    }
}

/// Finds a provider by index.
pub(crate) fn provider(index: u32) -> Option<Arc<Provider>> {
    ffi::providers().iter().find(|p| p.index == index).cloned()
}

/// Every provider now, by index.
pub(crate) fn providers() -> Result<KVec<Arc<Provider>>> {
    let list = ffi::providers();
    let mut out = KVec::with_capacity(list.len(), GFP_KERNEL)?;
    for p in list.iter() {
        out.push(p.clone(), GFP_KERNEL)?;
    }
    Ok(out)
}

/// Waits (bounded) for transient pins, e.g. an O_DIRECT request in flight,
/// to end, then drops p2pdirect's page references. False if they never did.
fn release_when_idle(mem: &P2pMem, start: u64, len: u64) -> bool {
    let (Ok(start), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
        return false;
    };
    for _ in 0..100 {
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
    pub(crate) start: u64,
    pub(crate) size: u64,
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
        let (start, info) = {
            let mut inner = provider.inner.lock();
            let inner = &mut *inner;
            let mem = inner.mem.as_ref().ok_or(ENODEV)?;
            let start = inner.ranges.alloc(
                size,
                align,
                MapInfo {
                    mapping,
                    mmap_offset,
                },
            )?;
            // Bounded by the BAR size, which is a usize.
            let (ustart, ulen) = (start as usize, size as usize);
            if let Err(e) = mem.hold(ustart, ulen) {
                let _ = inner.ranges.free(start);
                return Err(e);
            }
            let info = AllocInfo {
                handle,
                size,
                mmap_offset,
                bus_addr: mem.bus_addr(ustart),
                provider_offset: start,
            };
            (start, info)
        };
        Ok((
            Self {
                handle,
                provider,
                start,
                size,
            },
            info,
        ))
    }

    /// Frees the allocation unless its memory is still mapped or pinned.
    /// On `EBUSY` the allocation is left as it was.
    pub(crate) fn try_free(&self) -> Result {
        let mut inner = self.provider.inner.lock();
        let inner = &mut *inner;
        if let Some(mem) = inner.mem.as_ref() {
            mem.try_release(self.start as usize, self.size as usize)?;
            inner.ranges.free(self.start)?;
        }
        // Without memory the provider already took everything back.
        Ok(())
    }

    /// Frees the allocation at close or exit: no mapping can remain (a
    /// mapping keeps the file open), so only a transient pin can delay it.
    pub(crate) fn free_at_close(&self) {
        let mut inner = self.provider.inner.lock();
        let inner = &mut *inner;
        if let Some(mem) = inner.mem.as_ref() {
            if release_when_idle(mem, self.start, self.size) {
                let _ = inner.ranges.free(self.start);
            } else {
                // The range stays allocated: the pool never gets pinned pages back.
                pr_err!(
                    "provider {}: allocation {} still pinned at close; not reused\n",
                    self.provider.index,
                    self.handle
                );
            }
        }
    }

    /// Maps the allocation into `vma` (which must cover exactly its size).
    pub(crate) fn map(&self, vma: &VmaNew) -> Result {
        let inner = self.provider.inner.lock();
        let mem = inner.mem.as_ref().ok_or(ENODEV)?;
        mem.map_into(vma, self.start as usize, self.size as usize)
    }
}
