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
//! An allocation is an [`AllocState`], reference-counted: its file's list,
//! each VMA mapping it, and each claim on it (a registration, an I/O, a
//! DMA_PROBE, through the peer-memory client) hold a reference. Its memory
//! (`Backing`) lives inside it until it is revoked.
//!
//! Revocation (FREE, the owner's close or exit, device removal) takes the
//! memory away from everyone at once, and never waits (but for the fences of
//! a dma-buf of it): under the state's lock the backing is taken out (a page
//! fault from then on is SIGBUS), the user mappings are zapped, and every
//! subscriber drops its claim (a registration its pin; a dma-buf export tells
//! its importers, whose mappings hold the memory as [`Hold`]s until they
//! unmap). The backing then goes to the graveyard, from which [`reap`] gives it
//! back to the provider once no page has a reference besides p2pdirect's own
//! and no hold is left (an I/O in flight, another driver's transient pin or
//! a dma-buf importer's mapping still holds it).
//! Reaping runs when a pin of p2pdirect's goes (end of an I/O, a registration
//! dropped), before each ALLOC, and at device removal, which waits for it.
//! The handle is free for reuse as soon as FREE returned; the memory only
//! once reaped.
//!
//! Lock order (the whole module's is in `error.rs`): `OpenFile::allocs` ->
//! graveyard -> `AllocState::inner` -> `Provider::inner`; the mmap lock is
//! taken before `AllocState::inner` (page faults), never inside it.

use crate::{
    error::refuse,
    ffi::{self, FileMapping, HeldPages, P2pMem, PciFunction},
    range_alloc::RangeAllocator,
    sys::{
        pci_p2pdma::P2pProvider,
        vma::{self, DeviceMapping, Fault, FaultSlot},
    },
};
use core::sync::atomic::{AtomicUsize, Ordering};
use kernel::{
    id_pool::IdPool,
    mm::virt::VmaNew,
    new_condvar, new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{
        atomic::{Acquire, Atomic, Full, Relaxed, Release},
        Arc, CondVar, CondVarTimeoutResult, Mutex,
    },
};

/// What kind of memory a provider has (the UAPI's `P2PDIRECT_PROVIDER_*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bar,
    Published,
}

struct ProviderInner {
    /// `Bar`: all of the BAR; `None` for `Published` and once the device is
    /// gone. Backings of its allocations hold references too.
    mem: Option<Arc<P2pMem>>,
    /// `Bar`: the allocated ranges (live and waiting to be reaped).
    ranges: RangeAllocator<()>,
    /// Allocations not yet reaped, live or revoked.
    allocs: KVVec<Arc<AllocState>>,
    /// `Published`: bytes p2pdirect allocated from the owner's pool.
    published_used: u64,
    /// The device is going away: no new allocation.
    gone: bool,
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
    /// How many of its allocations were given back so far (a leaf lock,
    /// after `inner`): what `wait_idle` sleeps on.
    #[pin]
    reaped: Mutex<u64>,
    /// Notified each time an allocation of the provider is given back.
    #[pin]
    idle: CondVar,
}

/// How long `wait_idle` sleeps before it looks again without being woken:
/// a pin taken outside p2pdirect (another driver's GUP of a user mapping)
/// tells nobody when it goes.
const FOREIGN_PIN_RECHECK_MS: u32 = 1000;

/// Snapshot of a provider's usage.
pub(crate) struct Usage {
    pub(crate) total: u64,
    pub(crate) used: u64,
}

static NEXT_PROVIDER: Atomic<u32> = Atomic::new(0);
const MMAP_SHIFT: u32 = 40;
/// Handles are below this: `handle << MMAP_SHIFT` is a valid file offset.
const MAX_HANDLES: usize = 1 << 20;

crate::sys::global::global_mutex! {
    static PROVIDERS: KVec<Arc<Provider>> = KVec::new();
    /// The provider list's global.
    pub(crate) struct ProvidersGlobal;
    /// Every provider, by index (lock order 4).
    fn provider_list;
}

crate::sys::global::global_mutex! {
    static HANDLES: Option<IdPool> = None;
    /// The handle pool's global.
    pub(crate) struct HandlesGlobal;
    /// The allocation handles in use (lock order 6).
    fn handles;
}

crate::sys::global::global_mutex! {
    static DYING: KVec<usize> = KVec::new();
    /// The unbinding list's global.
    pub(crate) struct DyingGlobal;
    /// Devices whose driver is unbinding: never added back meanwhile
    /// (lock order 6).
    fn dying;
}

crate::sys::global::global_mutex! {
    static GRAVEYARD: KVVec<Arc<AllocState>> = KVVec::new();
    /// The graveyard's global.
    pub(crate) struct GraveyardGlobal;
    /// Revoked allocations waiting for their last pin (lock order 4).
    fn graveyard;
}

/// The device-memory room's globals: set up in module init before the
/// driver, the misc device and the peer clients that use them, torn down
/// after every provider and file went.
pub(crate) struct Globals {
    _providers: ProvidersGlobal,
    _dying: DyingGlobal,
    _handles: HandlesGlobal,
    _graveyard: GraveyardGlobal,
}

impl Globals {
    /// Initialises the globals, once (`EBUSY` on a second call).
    pub(crate) fn init() -> Result<Self> {
        let g = Self {
            _providers: ProvidersGlobal::init()?,
            _dying: DyingGlobal::init()?,
            _handles: HandlesGlobal::init()?,
            _graveyard: GraveyardGlobal::init()?,
        };
        *handles() = Some(IdPool::with_capacity(256, GFP_KERNEL)?);
        Ok(g)
    }
}

impl Drop for Globals {
    fn drop(&mut self) {
        // Every file and device is gone: what is left waits for pins held
        // outside p2pdirect, if any. The tokens then empty each global.
        reap_at_exit();
    }
}

/// A handle from the pool, given back on drop unless kept.
struct Handle(u64);

impl Handle {
    fn acquire() -> Result<Self> {
        let mut guard = handles();
        loop {
            let pool = guard.as_mut().ok_or(ENODEV)?;
            if let Some(id) = pool.find_unused_id(1) {
                return Ok(Self(id.acquire() as u64));
            }
            if pool.capacity() >= MAX_HANDLES {
                return Err(ENOSPC);
            }
            let req = pool.grow_request().ok_or(ENOSPC)?;
            drop(guard);
            let resizer = req.realloc(GFP_KERNEL)?;
            guard = handles();
            if let Some(pool) = guard.as_mut() {
                pool.grow(resizer);
            }
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(pool) = handles().as_mut() {
            pool.release_id(self.0 as usize);
        }
    }
}

impl Provider {
    fn new(
        kind: Kind,
        pdev: PciFunction,
        bar: u32,
        size: u64,
        bus: u64,
        mem: Option<Arc<P2pMem>>,
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
                    allocs: KVVec::new(),
                    published_used: 0,
                    gone: false,
                }),
                reaped <- new_mutex!(0),
                idle <- new_condvar!(),
            }),
            GFP_KERNEL,
        )
    }

    /// Registers `mem` (all of BAR `bar` of `pdev`) as a provider.
    pub(crate) fn register_bar(pdev: PciFunction, bar: u32, mem: P2pMem) -> Result<Arc<Self>> {
        let (size, bus) = (mem.size() as u64, mem.bus_addr(0));
        let mem = Arc::new(mem, GFP_KERNEL)?;
        let provider = Self::new(Kind::Bar, pdev, bar, size, bus, Some(mem))?;
        provider_list().push(provider.clone(), GFP_KERNEL)?;
        Ok(provider)
    }

    /// The device is going away: drop it from the list, revoke every
    /// allocation (mappings zapped, registrations invalidated; later access
    /// gets SIGBUS), wait until the last in-flight I/O let go of the pages,
    /// and give the memory back to the P2PDMA pool.
    pub(crate) fn unregister(&self) {
        provider_list().retain(|p| p.index != self.index);
        self.wait_idle();
        let mut inner = self.inner.lock();
        inner.ranges.clear();
        // Every backing was reaped: the provider's reference is the last.
        inner.mem = None;
    }

    /// Revokes every allocation of the provider; no new one is made. Takes
    /// them one at a time (no list to allocate, so nothing can be missed).
    fn revoke_all(&self) {
        loop {
            let next = {
                let mut inner = self.inner.lock();
                inner.gone = true;
                inner
                    .allocs
                    .iter()
                    .find(|s| !s.revoked.load(Relaxed))
                    .cloned()
            };
            match next {
                Some(s) => s.revoke(),
                None => return,
            }
        }
    }

    /// Reaps whatever of this provider's revoked memory has no pin left;
    /// true once nothing of it is left at all.
    fn reap_all(&self) -> bool {
        let mut i = 0;
        loop {
            let next = self.inner.lock().allocs.get(i).cloned();
            let Some(s) = next else {
                return self.inner.lock().allocs.is_empty();
            };
            // A reaped state leaves the list: the same index is the next one.
            if !s.try_reap() {
                i += 1;
            }
        }
    }

    /// Waits until every allocation of the provider was revoked and given
    /// back. The last pin of p2pdirect's own (an I/O ending, a registration
    /// dropped) reaps and wakes this; a pin taken outside p2pdirect is
    /// looked at again every `FOREIGN_PIN_RECHECK_MS`. No lock of
    /// p2pdirect's is held while it sleeps (the condition variable drops
    /// `reaped`).
    fn wait_idle(&self) {
        let mut waited_ms = 0u32;
        let mut next_warn = 5000u32;
        loop {
            let seen = *self.reaped.lock();
            self.revoke_all();
            if self.reap_all() {
                reap();
                return;
            }
            let mut guard = self.reaped.lock();
            if *guard != seen {
                // Something was given back since the look above: look again.
                continue;
            }
            let timeout = kernel::time::msecs_to_jiffies(FOREIGN_PIN_RECHECK_MS);
            match self.idle.wait_interruptible_timeout(&mut guard, timeout) {
                CondVarTimeoutResult::Woken { .. } => {}
                CondVarTimeoutResult::Timeout => {
                    waited_ms = waited_ms.saturating_add(FOREIGN_PIN_RECHECK_MS)
                }
                CondVarTimeoutResult::Signal { .. } => {
                    // Removal is not interruptible; without a lock, sleep
                    // out a short while instead of spinning on the signal
                    // (or on this thread's pending task work, which runs
                    // only once it returns to userspace: no pin waits for
                    // task work, except a file READ's io_uring retry whose
                    // kernel worker could not be allocated).
                    drop(guard);
                    kernel::time::delay::fsleep(kernel::time::Delta::from_millis(10));
                    waited_ms = waited_ms.saturating_add(10);
                }
            }
            if waited_ms >= next_warn {
                next_warn = waited_ms.saturating_add(5000);
                pr_warn!(
                    "provider {}: freed memory still held (I/O or a dma-buf importer); waiting for it\n",
                    self.index
                );
            }
        }
    }

    /// Counts an allocation given back and wakes `wait_idle`.
    fn note_reaped(&self) {
        *self.reaped.lock() += 1;
        self.idle.notify_all();
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
/// since the last look. Removal is the PCI notifier's alone (below): a
/// device whose driver is unbinding is never added back.
pub(crate) fn refresh_published() -> Result {
    let found = PciFunction::with_published_p2pmem()?;
    let mut list = provider_list();
    for f in found {
        let known = list
            .iter()
            .any(|p| p.kind == Kind::Published && p.pdev.addr() == f.addr());
        if known || dying().iter().any(|&id| id == f.id()) {
            continue;
        }
        // One page tells which BAR the pool lives in; the owner may also
        // have handed out everything, and then there is nothing to offer.
        let Ok(probe) = P2pMem::alloc(f.aref(), PAGE_SIZE) else {
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

/// Published memory goes away with its driver: before that driver's
/// `remove` tears its P2PDMA pool down (waiting for every page reference),
/// p2pdirect revokes its allocations of it and waits for their I/O to end.
pub(crate) struct PublishedUnbind;

impl crate::sys::pci_notify::PciUnbind for PublishedUnbind {
    fn unbinding(id: usize, _addr: u32) {
        // Never added back until the driver is gone (`unbound`); if the
        // mark cannot be kept, a LIST meanwhile may re-add the provider,
        // whose allocations the owner's teardown then waits for.
        let _ = dying().push(id, GFP_KERNEL);
        loop {
            let gone = {
                let mut list = provider_list();
                match list
                    .iter()
                    .position(|p| p.kind == Kind::Published && p.pdev.id() == id)
                {
                    Some(i) => list.remove(i).ok(),
                    None => None,
                }
            };
            let Some(p) = gone else { return };
            pr_info!(
                "provider {}: its driver is unbinding; allocations of it are revoked\n",
                p.index
            );
            p.wait_idle();
        }
    }

    fn unbound(id: usize, _addr: u32) {
        dying().retain(|d| *d != id);
    }
}

/// Finds a provider by index.
pub(crate) fn provider(index: u32) -> Option<Arc<Provider>> {
    let find = || provider_list().iter().find(|p| p.index == index).cloned();
    // A provider published since the last LIST is found on a second look.
    find().or_else(|| refresh_published().ok().and_then(|()| find()))
}

/// Every provider now, by index.
pub(crate) fn providers() -> Result<KVec<Arc<Provider>>> {
    refresh_published()?;
    let list = provider_list();
    let mut out = KVec::with_capacity(list.len(), GFP_KERNEL)?;
    for p in list.iter() {
        out.push(p.clone(), GFP_KERNEL)?;
    }
    Ok(out)
}

/// Someone holding a claim on p2pdirect's memory (a peer-memory consumer:
/// a registration), told when it goes away.
pub(crate) trait Consumer: Send + Sync {
    /// Distinguishes subscriptions (for [`AllocState::unsubscribe`]).
    fn consumer_id(&self) -> u64;
    /// The memory is going away: drop the claim (unmap, unpin) now and never
    /// use it again.
    fn invalidate(&self);
    /// Whether [`Consumer::invalidate`] waits for others (a dma-buf's
    /// fences): such consumers are told after every other one.
    fn waits(&self) -> bool {
        false
    }
}

/// Where an allocation's memory is.
enum Backing {
    /// The allocation's pages of the provider's BAR memory.
    Bar { mem: Arc<P2pMem>, held: HeldPages },
    /// Memory taken from the owner's pool for this allocation, whose pages
    /// from `held`'s offset on (alignment) are the allocation's.
    Published { own: Arc<P2pMem>, held: HeldPages },
}

/// What a released [`Backing`] leaves to give back to its provider.
enum Released {
    /// The range of the BAR starting there.
    Range(usize),
    /// The memory taken from the owner's pool (freed when dropped).
    Pool { _own: Arc<P2pMem> },
}

impl Backing {
    fn mem(&self) -> (&Arc<P2pMem>, usize) {
        match self {
            Backing::Bar { mem, held } => (mem, held.offset()),
            Backing::Published { own, held } => (own, held.offset()),
        }
    }

    /// Lets go of the pages if nothing but p2pdirect references them;
    /// hands the backing back otherwise.
    fn release(self) -> core::result::Result<Released, Self> {
        match self {
            Backing::Bar { mem, held } => {
                let start = held.offset();
                match mem.try_release(held) {
                    Ok(()) => Ok(Released::Range(start)),
                    Err(held) => Err(Backing::Bar { mem, held }),
                }
            }
            Backing::Published { own, held } => match own.try_release(held) {
                Ok(()) => Ok(Released::Pool { _own: own }),
                Err(held) => Err(Backing::Published { own, held }),
            },
        }
    }
}

struct Live {
    backing: Backing,
    /// Where the allocation's user mappings live, to zap them.
    mapping: FileMapping,
}

/// The key of consumer `id` among an allocation's subscribers: kernel
/// consumers (ids from `1 << 62`) first, then registrations (from 1), then
/// dma-bufs (from `1 << 63`), each kind in the order it came. Revocation
/// tells them in that order (dma-bufs, which wait for fences, last).
fn subscriber_key(id: u64) -> u64 {
    id ^ (1 << 62)
}

struct StateInner {
    /// The memory, until revoked.
    live: Option<Live>,
    /// Revoked memory waiting for its last pin (reaped by the graveyard).
    dead: Option<Backing>,
    /// Told when the memory is revoked, in the order of their keys
    /// ([`subscriber_key`]); one leaves in logarithmic time, so closing
    /// files with many registrations of one allocation costs what they
    /// hold, not its square.
    subscribers: RBTree<u64, Arc<dyn Consumer>>,
    /// A revocation took the memory and is still zapping the mappings and
    /// telling the subscribers (`AllocState::told` wakes its waiters).
    telling: bool,
}

/// One allocation (see the module documentation for its lifetime).
#[pin_data]
pub(crate) struct AllocState {
    pub(crate) handle: u64,
    pub(crate) size: u64,
    pub(crate) provider: Arc<Provider>,
    /// Set when revocation starts (read without the lock, by `revoke_all`).
    revoked: Atomic<bool>,
    /// [`Hold`]s alive (dma-buf mappings): the memory is not given back
    /// while there is one.
    holds: Atomic<u64>,
    #[pin]
    inner: Mutex<StateInner>,
    /// Notified when a revocation has told everyone (`StateInner::telling`).
    #[pin]
    told: CondVar,
}

/// Keeps an allocation's memory from being reused after revocation, for a
/// user that does not reference its pages (a dma-buf mapping: importers DMA
/// to the physical range; a revocation until it told every subscriber).
/// Dropping it lets the memory go.
pub(crate) struct Hold(Arc<AllocState>);

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.holds.fetch_sub(1, Full) == 1 {
            reap();
        }
    }
}

/// Where a range of an allocation is, to map it for a peer.
pub(crate) struct PeerRange {
    pub(crate) provider: P2pProvider,
    pub(crate) phys: u64,
    pub(crate) hold: Hold,
}

impl AllocState {
    pub(crate) fn mmap_offset(&self) -> u64 {
        self.handle << MMAP_SHIFT
    }

    /// Tells `consumer` when the memory goes; `EFAULT` if it already went
    /// (the range was freed under the caller).
    pub(crate) fn subscribe(&self, consumer: Arc<dyn Consumer>) -> Result {
        // The subscription's node lives as long as it does: charged to its
        // maker, as its record is.
        let key = subscriber_key(consumer.consumer_id());
        let node = RBTreeNode::new(key, consumer, GFP_KERNEL_ACCOUNT)?;
        let mut inner = self.inner.lock();
        if inner.live.is_none() {
            return Err(EFAULT);
        }
        // Ids are unique (each kind of consumer counts in a range of its
        // own), so nothing is replaced.
        let replaced = inner.subscribers.insert(node);
        drop(inner);
        if replaced.is_some() {
            pr_warn!(
                "subscriber {:#x} subscribed twice: the first is not told\n",
                key
            );
        }
        drop(replaced);
        Ok(())
    }

    /// Ends the subscription of consumer `id`.
    pub(crate) fn unsubscribe(&self, id: u64) {
        let node = self
            .inner
            .lock()
            .subscribers
            .remove_node(&subscriber_key(id));
        drop(node);
    }

    /// Whether every page of `pin` lies in this allocation's memory (a
    /// mapping replaced between the lookup and the pin is caught here).
    pub(crate) fn holds(&self, pin: &ffi::UserPin) -> bool {
        let inner = self.inner.lock();
        let Some(live) = inner.live.as_ref() else {
            return false;
        };
        let (mem, start) = live.backing.mem();
        pin.within(mem, start, self.size as usize)
    }

    /// The provider and physical address of bytes `off..off + len` (inside
    /// the allocation), held until the [`Hold`] drops; `ENODEV` once revoked.
    pub(crate) fn hold_range(self: &Arc<Self>, off: u64, len: u64) -> Result<PeerRange> {
        let end = off.checked_add(len).ok_or(EINVAL)?;
        if end > self.size {
            return Err(EINVAL);
        }
        let inner = self.inner.lock();
        let live = inner.live.as_ref().ok_or(ENODEV)?;
        let (mem, start) = live.backing.mem();
        // Bounded by the allocation's size, which is a usize.
        let at = start + off as usize;
        let provider = mem.provider(at).ok_or(ENODEV)?;
        let phys = mem.phys(at).ok_or(ENODEV)?;
        // Under the lock, so a revocation (which takes it) sees the hold.
        self.holds.fetch_add(1, Full);
        Ok(PeerRange {
            provider,
            phys,
            hold: Hold(self.clone()),
        })
    }

    /// Holds the memory of an allocation being revoked (live, or dead and
    /// not yet given back); `None` once it went back.
    pub(crate) fn hold_dying(self: &Arc<Self>) -> Option<Hold> {
        let inner = self.inner.lock();
        if inner.live.is_none() && inner.dead.is_none() {
            return None;
        }
        self.holds.fetch_add(1, Full);
        Some(Hold(self.clone()))
    }

    /// Maps the page at byte `off` of the allocation into `slot`.
    pub(crate) fn fault_at(&self, off: u64, slot: FaultSlot<'_>) -> Fault {
        if off >= self.size {
            return Fault::Gone;
        }
        let inner = self.inner.lock();
        let Some(live) = inner.live.as_ref() else {
            return Fault::Gone;
        };
        let (mem, start) = live.backing.mem();
        match mem.insert_page(start + off as usize, slot) {
            Ok(()) => Fault::Mapped,
            Err(e) if e == ENOMEM => Fault::NoMemory,
            Err(_) => Fault::Gone,
        }
    }

    /// Takes the memory away from everyone (see the module documentation)
    /// and hands it to the graveyard. Idempotent; never waits for I/O. When
    /// it returns the mappings are zapped and the subscribers told, also
    /// where another revocation (FREE racing the device's removal) took
    /// the memory first: this one then waits for that one to finish, unless
    /// a signal interrupts it (or task work queued for this thread, such as
    /// an io_uring completion, which `signal_pending()` reports too).
    pub(crate) fn revoke(self: &Arc<Self>) {
        self.revoked.store(true, Release);
        let (mapping, subscribers, telling_hold) = {
            let mut inner = self.inner.lock();
            let Some(live) = inner.live.take() else {
                // A signal ends the wait (the memory is revoked already;
                // only the "everyone told" guarantee is left to the other
                // revocation): a thread the winner waits for (a fence it
                // signals, a consumer it answers) can be killed.
                while inner.telling {
                    if self.told.wait_interruptible(&mut inner) {
                        break;
                    }
                }
                return;
            };
            inner.telling = true;
            // The memory stays out of the graveyard's reach until every
            // subscriber was told: a reap by one of them (a kernel
            // consumer's, or another thread's) must not give it back
            // before a later one (a dma-buf export) took its own hold for
            // the fences its importers may still DMA under.
            self.holds.fetch_add(1, Full);
            // Dead from here on: reaping waits for the zap below (the pages
            // are still mapped until it ran, so they are not idle).
            inner.dead = Some(live.backing);
            (
                live.mapping,
                core::mem::take(&mut inner.subscribers),
                Hold(self.clone()),
            )
        };
        // The graveyard is the fast path of `reap`; a state it could not take
        // is still found in its provider's list by the next ALLOC there and
        // by device removal (`Provider::reap_all`).
        {
            let mut graves = graveyard();
            let _ = graves.push(self.clone(), GFP_KERNEL);
            let _ = BURIED.swap(graves.len(), Ordering::SeqCst);
        }
        mapping.zap(self.mmap_offset(), self.size);
        drop(mapping);
        // Registrations and kernel consumers first, then the dma-bufs, whose
        // invalidation waits for their fences: an importer's fence never
        // keeps a registration live or a consumer untold.
        for waits in [false, true] {
            for s in subscribers.values().filter(|s| s.waits() == waits) {
                s.invalidate();
            }
        }
        drop(subscribers);
        self.inner.lock().telling = false;
        self.told.notify_all();
        drop(telling_hold);
        reap();
    }

    /// Gives the memory back if nothing but p2pdirect references its pages.
    fn try_reap(&self) -> bool {
        let mut inner = self.inner.lock();
        let Some(dead) = inner.dead.take() else {
            return inner.live.is_none();
        };
        if self.holds.load(Acquire) != 0 {
            inner.dead = Some(dead);
            return false;
        }
        let released = match dead.release() {
            Ok(r) => r,
            Err(dead) => {
                inner.dead = Some(dead);
                return false;
            }
        };
        drop(inner);
        let mut p = self.provider.inner.lock();
        match &released {
            Released::Range(start) => {
                let _ = p.ranges.free(*start as u64);
            }
            Released::Pool { .. } => p.published_used = p.published_used.saturating_sub(self.size),
        }
        p.allocs.retain(|s| !core::ptr::eq(&**s, self));
        drop(p);
        self.provider.note_reaped();
        true
    }
}

impl DeviceMapping for AllocState {
    fn fault(&self, offset: u64, slot: FaultSlot<'_>) -> Fault {
        let Some(off) = offset.checked_sub(self.mmap_offset()) else {
            return Fault::Gone;
        };
        self.fault_at(off, slot)
    }
}

/// Allocations in the graveyard: lets the I/O path skip its lock when empty.
/// A core atomic: every I/O reads it, and the kernel crate's `Atomic` is an
/// out-of-line call per operation in these kernels (a core atomic compiles
/// to the instruction).
static BURIED: AtomicUsize = AtomicUsize::new(0);

/// Gives back revoked memory whose pages nobody references any more.
pub(crate) fn reap() {
    if BURIED.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut graves = graveyard();
    graves.retain(|s| !s.try_reap());
    let _ = BURIED.swap(graves.len(), Ordering::SeqCst);
}

/// Module exit: every file and device is gone, so every pin of p2pdirect's
/// went; each provider left (published memory whose driver stays) waits for
/// pins taken outside p2pdirect, as device removal does.
fn reap_at_exit() {
    reap();
    let list = core::mem::take(&mut *provider_list());
    for p in list.iter() {
        p.wait_idle();
    }
}

/// ALLOC's size and alignment, before any provider is looked up: `EINVAL`
/// for a size of 0 or an alignment that is not 0 or a power of two.
pub(crate) fn check_alloc_args(size: u64, align: u64) -> Result {
    if size == 0 || (align != 0 && !align.is_power_of_two()) {
        return Err(EINVAL);
    }
    Ok(())
}

/// An allocation, as its file owns it.
pub(crate) struct Allocation {
    pub(crate) state: Arc<AllocState>,
    _handle: Handle,
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
    pub(crate) fn handle(&self) -> u64 {
        self.state.handle
    }

    /// Carves `size` bytes (rounded up to pages) aligned to `align` (0: page)
    /// out of `provider`, zeroed, for the file whose address space is
    /// `mapping`. A refused ALLOC takes nothing (no handle, no memory).
    /// `size` and `align` passed [`check_alloc_args`] (before the provider
    /// was looked up).
    pub(crate) fn new(
        provider: Arc<Provider>,
        size: u64,
        align: u64,
        mapping: FileMapping,
    ) -> Result<(Self, AllocInfo)> {
        let page = PAGE_SIZE as u64;
        let size = size.checked_next_multiple_of(page).ok_or(ENOMEM)?;
        if size > provider.bar_size {
            return Err(ENOMEM);
        }
        let align = align.max(page);
        // Memory freed earlier may be waiting for its last pin to go.
        reap();
        provider.reap_all();
        let (backing, bus, provider_offset) = match provider.kind {
            Kind::Bar => {
                let mut inner = provider.inner.lock();
                if inner.gone {
                    return Err(ENODEV);
                }
                let mem = inner.mem.clone().ok_or(ENODEV)?;
                let start = inner.ranges.alloc(size, align, ())?;
                // Bounded by the BAR size, which is a usize.
                let (s, l) = (start as usize, size as usize);
                // Free pages are referenced by nobody: a range that is
                // (cannot happen) is memory not to be had, `ENOMEM`.
                let held = match mem.try_hold(s, l) {
                    Ok(h) => h,
                    Err(_) => {
                        let _ = inner.ranges.free(start);
                        return Err(ENOMEM);
                    }
                };
                let bus = mem.bus_addr(s);
                (Backing::Bar { mem, held }, bus, start)
            }
            Kind::Published => {
                if !provider.pdev.has_published_p2pmem() || provider.inner.lock().gone {
                    return Err(ENODEV);
                }
                if align > provider.bar_size {
                    return Err(ENOMEM);
                }
                // The owner's pool aligns to pages only: take enough to align within.
                let total = usize::try_from(size + align - page).map_err(|_| ENOMEM)?;
                let own = Arc::new(
                    P2pMem::alloc(provider.pdev.aref(), total)?,
                    GFP_KERNEL_ACCOUNT,
                )?;
                let first = own.bus_addr(0);
                let skip = (first.next_multiple_of(align) - first) as usize;
                let bus = first + skip as u64;
                // The pool is expected in the published BAR; memory of it
                // anywhere else is not to be had here (checked before any
                // page is held: `own` goes back to the pool whole).
                let offset = bus.checked_sub(provider.bus_addr).ok_or(ENOMEM)?;
                // A page of the pool still referenced for an instant by its
                // previous user's teardown (`p2pmem_alloc_mmap` failing) is
                // memory not to be had now: `ENOMEM`, as the pool's own.
                let held = own.try_hold(skip, size as usize).map_err(|_| ENOMEM)?;
                provider.inner.lock().published_used += size;
                (Backing::Published { own, held }, bus, offset)
            }
        };
        // The previous owner's data never shows (GPU drivers zero between
        // processes too). A caller killed meanwhile gets nothing: the memory
        // goes back at once, not after gigabytes of zeros nobody reads.
        let (mem, start) = backing.mem();
        if let Err(e) = mem.zero(start, size as usize) {
            undo(&provider, backing, size);
            return Err(e);
        }
        let state = {
            let handle = Handle::acquire();
            let owner = provider.clone();
            let state = handle.and_then(move |h| {
                let s = Arc::pin_init(
                    pin_init!(AllocState {
                        handle: h.0,
                        size,
                        provider: owner,
                        revoked: Atomic::new(false),
                        holds: Atomic::new(0),
                        inner <- new_mutex!(StateInner {
                            live: None,
                            dead: None,
                            subscribers: RBTree::new(),
                            telling: false,
                        }),
                        told <- new_condvar!(),
                    }),
                    GFP_KERNEL_ACCOUNT,
                )?;
                Ok((h, s))
            });
            match state {
                Ok(s) => s,
                Err(e) => {
                    undo(&provider, backing, size);
                    return Err(e);
                }
            }
        };
        let (handle, state) = state;
        // Live before anyone can see it: a revocation (device removal) that
        // finds it in the provider's list then takes its memory like any.
        state.inner.lock().live = Some(Live { backing, mapping });
        let listed = {
            let mut p = provider.inner.lock();
            if p.gone {
                Err(ENODEV)
            } else {
                p.allocs
                    .push(state.clone(), GFP_KERNEL)
                    .map_err(Error::from)
            }
        };
        if let Err(e) = listed {
            if let Some(live) = state.inner.lock().live.take() {
                undo(&provider, live.backing, size);
            }
            return Err(e);
        }
        let info = AllocInfo {
            handle: state.handle,
            size,
            mmap_offset: state.mmap_offset(),
            bus_addr: bus,
            provider_offset,
        };
        Ok((
            Self {
                state,
                _handle: handle,
            },
            info,
        ))
    }

    /// Frees the allocation: revokes it (never waits for I/O; see
    /// [`AllocState::revoke`]); the handle is free again when this returns,
    /// the memory once its last pin went.
    pub(crate) fn free(self) {
        self.state.revoke();
    }

    /// Maps the allocation into `vma` (which must cover exactly its size).
    /// Nothing is mapped now: the pages come in through faults, which only
    /// happen once the VMA is linked where revocation's zap finds it.
    pub(crate) fn map(&self, vma: &VmaNew) -> Result {
        if self.state.inner.lock().live.is_none() {
            refuse!(
                ENODEV,
                "mmap refused: the allocation's memory is gone (its device was removed or \
                 its driver unbound)\n"
            );
        }
        vma.set_mixedmap();
        vma::install(vma, self.state.clone());
        Ok(())
    }
}

/// The policy every user mapping of device memory follows (the
/// `/dev/p2pdirect` mapping and a dma-buf's): shared, never executable.
pub(crate) fn check_mapping(vma: &VmaNew) -> Result {
    if !vma::may_share(vma) {
        crate::error::refuse!(EINVAL, "mmap refused: device memory needs MAP_SHARED\n");
    }
    if vma.executable() {
        crate::error::refuse!(EPERM, "mmap refused: device memory is never executable\n");
    }
    vma.try_clear_mayexec()
}

/// Not inherited by fork, never grown by mremap, not in core dumps.
pub(crate) fn seal_mapping(vma: &VmaNew) {
    vma.set_dontcopy();
    vma.set_dontexpand();
    vma.set_dontdump();
}

/// Gives back the memory of an ALLOC that failed after taking it.
fn undo(provider: &Provider, backing: Backing, size: u64) {
    // Nothing was given the memory yet, so nothing else references it but,
    // for an instant, a lockless lookup through a stale page table entry:
    // try again a little while. Memory still referenced after that stays
    // taken, and counted as used (never handed out twice).
    let mut backing = backing;
    let mut tries = 0;
    let released = loop {
        match backing.release() {
            Ok(r) => break Some(r),
            Err(b) if tries < 100 => {
                backing = b;
                tries += 1;
                kernel::time::delay::fsleep(kernel::time::Delta::from_micros(100));
            }
            Err(b) => {
                pr_err!("memory of a failed ALLOC is still referenced: it stays taken\n");
                // Its pages stay held (a provider's teardown waits for them).
                drop(b);
                break None;
            }
        }
    };
    let mut p = provider.inner.lock();
    match released {
        Some(Released::Range(start)) => {
            let _ = p.ranges.free(start as u64);
        }
        Some(Released::Pool { .. }) => p.published_used = p.published_used.saturating_sub(size),
        None => {}
    }
}

/// The allocation of p2pdirect's own memory that `[addr, addr + len)` of the
/// calling process lies in, with the range's offset in it. `Ok(None)` if the
/// range does not start in p2pdirect's memory (whatever follows); `EFAULT`
/// if it starts in a mapping of it and runs past its end (into another
/// allocation or another kind of memory).
pub(crate) fn user_range(addr: u64, len: u64) -> Result<Option<(Arc<AllocState>, u64)>> {
    match vma::lookup::<AllocState>(addr, len) {
        vma::Lookup::Elsewhere => Ok(None),
        vma::Lookup::Inside(state, file_off) => {
            let off = file_off.checked_sub(state.mmap_offset()).ok_or(EFAULT)?;
            if off.checked_add(len).is_none_or(|end| end > state.size) {
                return Err(EFAULT);
            }
            Ok(Some((state, off)))
        }
        vma::Lookup::Straddles => {
            crate::error::refuse!(
                EFAULT,
                "{:#x}+{:#x} runs out of a device-memory mapping (into other memory or \
                 another allocation)\n",
                addr,
                len
            )
        }
    }
}
