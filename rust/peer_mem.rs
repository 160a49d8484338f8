// SPDX-License-Identifier: GPL-2.0

//! Peer-memory clients: the callback set of the OFED `peer_memory_client`
//! that nvidia-peermem implements (acquire, get_pages, dma_map, dma_unmap,
//! put_pages, get_page_size, release), behind a registry p2pdirect owns.
//!
//! A consumer (the storage engine, a registration) asks the registry about a
//! user range; the registry asks each client in registration order and the
//! first to claim the range owns it: its context then pins the pages, maps
//! them for a DMA device and lets them go. A client declines what is not its
//! memory, so ordinary RAM is declined by all and the consumer gets a clear
//! "not device memory" error instead of a silent fallback.
//!
//! Release is `Drop` of the context: it runs `dma_unmap` and `put_pages` if
//! the consumer did not, so a context can never leak pins.
//!
//! Invalidation: a consumer that keeps a claim on p2pdirect's own memory
//! subscribes to that allocation (`AllocState::subscribe`); when the memory
//! goes away (FREE, the owner's close or exit, device removal) the devmem
//! room calls every subscriber's [`Consumer::invalidate`], which drops its
//! claim; the memory is reused only once no pin is left.
//!
//! The registry's lock is held only to take a snapshot of the clients: they
//! are asked without it, as they look up VMAs and pin pages.

use crate::error::{edquot, refuse};
use kernel::{
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc,
    },
};

/// A user virtual address range of the calling process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UserRange {
    pub(crate) addr: u64,
    pub(crate) size: u64,
}

impl UserRange {
    /// `EINVAL` for an empty range or one that wraps.
    pub(crate) fn new(addr: u64, size: u64) -> Result<Self> {
        if size == 0 || addr.checked_add(size).is_none() {
            return Err(EINVAL);
        }
        Ok(Self { addr, size })
    }

    pub(crate) fn end(&self) -> u64 {
        self.addr + self.size
    }

    /// Bytes of the whole pages the range touches: what pinning it pins.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        let page = kernel::page::PAGE_SIZE as u64;
        let first = self.addr - self.addr % page;
        // `new` checked `end` does not wrap; a range ending in the last
        // page of the address space rounds to the maximum.
        self.end().div_ceil(page).saturating_mul(page) - first
    }

    /// `EDQUOT` if pinning the range would pin more than `max_pinned_mib`
    /// allows: no single pin of a user's call (nor its page array) is
    /// larger than a file may keep pinned, whichever client's memory it is.
    pub(crate) fn check_pin_cap(&self) -> Result {
        let span = self.pinned_bytes();
        let cap = crate::max_pinned_bytes();
        if span > cap {
            refuse!(
                edquot(),
                "{:#x}+{:#x} would pin {} bytes, more than max_pinned_mib allows ({})\n",
                self.addr,
                self.size,
                span,
                cap
            );
        }
        Ok(())
    }
}

pub(crate) use crate::{devmem::Consumer, ffi::DmaSeg};

/// A claimed range: what `acquire` hands back.
pub(crate) trait Context: Send {
    /// Pins the pages (for writing if `write`).
    fn get_pages(&mut self, write: bool) -> Result;
    /// Page size of the memory behind the range.
    fn page_size(&self) -> u64;
    /// DMA addresses of the pinned pages for `dev`; `EREMOTEIO` if the
    /// device cannot reach the memory.
    fn dma_map(&mut self, dev: &crate::ffi::DmaDevice) -> Result<KVVec<DmaSeg>>;
    /// Undoes `dma_map`.
    fn dma_unmap(&mut self);
    /// Unpins the pages.
    fn put_pages(&mut self);
    /// A reference to the pinned pages for I/O (`None` unless pinned); the
    /// pages stay pinned while it lives, even after `put_pages`.
    fn pages(&self) -> Option<crate::ffi::Pages>;
    /// For p2pdirect's own memory: the allocation the range lies in, so
    /// that freeing it can invalidate the claim.
    fn devmem_state(&self) -> Option<Arc<crate::devmem::AllocState>> {
        None
    }
    /// For a pinned claim on another provider's P2PDMA pages
    /// (`p2pdma-user`): the PCI function whose BAR holds them (as
    /// `PciFunction::id` names it), whose driver's removal invalidates the
    /// claim (see `peer_clients::watch`).
    fn foreign_provider(&self) -> Option<usize> {
        None
    }
    /// For a client of another module: where its invalidation of this
    /// claim is heard, and the id it names the claim by (see `peer_api`).
    fn external(&self) -> Option<(Arc<dyn ExternalClaims>, u64)> {
        None
    }
    /// Whether the memory has pages for block I/O and registrations (a
    /// client of another module's does not).
    fn has_pages(&self) -> bool {
        true
    }
}

/// The claims of a client of another module, which it may invalidate.
pub(crate) trait ExternalClaims: Send + Sync {
    /// Tells `consumer` when claim `core_id` is invalidated.
    fn subscribe(&self, core_id: u64, consumer: Arc<dyn Consumer>) -> Result;
    fn unsubscribe(&self, core_id: u64);
}

/// A peer-memory client.
pub(crate) trait Client: Send + Sync {
    fn name(&self) -> &str;
    /// The UAPI's `P2PDIRECT_CLIENT_*` for built-in clients.
    fn id(&self) -> u32;
    /// Claims `range` (`Ok(Some)`) or declines it (`Ok(None)`): a client
    /// claims only memory it owns, entirely.
    fn acquire(&self, range: UserRange) -> Result<Option<KBox<dyn Context>>>;
}

/// A registered client and how many contexts it has out.
struct Entry {
    client: Arc<dyn Client>,
    live: Arc<Atomic<u64>>,
}

/// The ordered set of clients.
pub(crate) struct Registry {
    entries: KVec<Entry>,
}

/// A context some client claimed, counted against its client until dropped.
pub(crate) struct Claim {
    client: Arc<dyn Client>,
    pub(crate) client_id: u32,
    ctx: KBox<dyn Context>,
    live: Arc<Atomic<u64>>,
    pinned: bool,
    mapped: bool,
}

impl Claim {
    pub(crate) fn get_pages(&mut self, write: bool) -> Result {
        if self.pinned {
            return Err(EBUSY);
        }
        self.ctx.get_pages(write)?;
        self.pinned = true;
        Ok(())
    }

    pub(crate) fn page_size(&self) -> u64 {
        self.ctx.page_size()
    }

    /// The name of the client that claimed the range.
    pub(crate) fn client_name(&self) -> &str {
        self.client.name()
    }

    /// The pinned pages, for I/O; `EINVAL` before `get_pages`,
    /// `EOPNOTSUPP` for a client that gives no pages (another module's:
    /// its memory serves DMA mappings only).
    pub(crate) fn pages(&self) -> Result<crate::ffi::Pages> {
        if !self.pinned {
            return Err(EINVAL);
        }
        self.check_io()?;
        self.ctx.pages().ok_or(EINVAL)
    }

    pub(crate) fn external(&self) -> Option<(Arc<dyn ExternalClaims>, u64)> {
        self.ctx.external()
    }

    /// `EOPNOTSUPP` (with the reason) for memory without pages for block
    /// I/O and registrations: checked before pinning.
    pub(crate) fn check_io(&self) -> Result {
        if !self.ctx.has_pages() {
            crate::error::refuse!(
                crate::error::eopnotsupp(),
                "memory of peer-memory client {} serves DMA mappings only, not block I/O \
                 or registrations\n",
                self.client.name()
            );
        }
        Ok(())
    }

    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped
    }

    pub(crate) fn devmem_state(&self) -> Option<Arc<crate::devmem::AllocState>> {
        self.ctx.devmem_state()
    }

    /// See [`Context::foreign_provider`] (once pinned).
    pub(crate) fn foreign_provider(&self) -> Option<usize> {
        self.ctx.foreign_provider()
    }

    pub(crate) fn dma_map(&mut self, dev: &crate::ffi::DmaDevice) -> Result<KVVec<DmaSeg>> {
        if !self.pinned || self.mapped {
            return Err(EINVAL);
        }
        let segs = self.ctx.dma_map(dev)?;
        self.mapped = true;
        Ok(segs)
    }

    pub(crate) fn dma_unmap(&mut self) {
        if self.mapped {
            self.ctx.dma_unmap();
            self.mapped = false;
        }
    }

    pub(crate) fn put_pages(&mut self) {
        self.dma_unmap();
        if self.pinned {
            self.ctx.put_pages();
            self.pinned = false;
        }
    }
}

impl Drop for Claim {
    /// `release`: whatever the consumer left mapped or pinned goes first.
    fn drop(&mut self) {
        self.put_pages();
        self.live.fetch_sub(1, Relaxed);
    }
}

impl Registry {
    pub(crate) const fn new() -> Self {
        Self {
            entries: KVec::new(),
        }
    }

    /// Adds a client after the existing ones; `EEXIST` for a name in use.
    pub(crate) fn register(&mut self, client: Arc<dyn Client>) -> Result {
        if self
            .entries
            .iter()
            .any(|e| e.client.name() == client.name())
        {
            return Err(EEXIST);
        }
        let live = Arc::new(Atomic::new(0u64), GFP_KERNEL)?;
        self.entries.push(Entry { client, live }, GFP_KERNEL)?;
        Ok(())
    }

    /// Removes a client; `EBUSY` while any of its contexts is alive,
    /// `ENOENT` for an unknown name.
    pub(crate) fn unregister(&mut self, name: &str) -> Result {
        let i = self
            .entries
            .iter()
            .position(|e| e.client.name() == name)
            .ok_or(ENOENT)?;
        if self.entries[i].live.load(Relaxed) != 0 {
            return Err(EBUSY);
        }
        self.entries.remove(i).map_err(|_| ENOENT)?;
        Ok(())
    }

    /// Contexts alive for the client `name`.
    pub(crate) fn live(&self, name: &str) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.client.name() == name)
            .map(|e| e.live.load(Relaxed))
    }

    /// [`acquire`] on a registry of the unit tests' own. The module's
    /// registry is only asked through [`acquire`], which lets go of its lock
    /// before a client runs (clients pin pages and take the mmap lock).
    #[cfg(CONFIG_KUNIT)]
    pub(crate) fn acquire(&self, range: UserRange) -> Result<Claim> {
        ask(self.snapshot()?, range)
    }

    /// The clients now, in order, to ask without the registry's lock.
    fn snapshot(&self) -> Result<Snapshot> {
        let mut v = KVec::with_capacity(self.entries.len(), GFP_KERNEL)?;
        for e in self.entries.iter() {
            v.push((e.client.clone(), e.live.clone()), GFP_KERNEL)?;
        }
        Ok(v)
    }
}

/// The registered clients at one moment, with their live-context counters.
type Snapshot = KVec<(Arc<dyn Client>, Arc<Atomic<u64>>)>;

/// Asks `clients` in order for `range` (see [`acquire`]).
fn ask(clients: Snapshot, range: UserRange) -> Result<Claim> {
    for (client, live) in clients {
        if let Some(ctx) = client.acquire(range)? {
            live.fetch_add(1, Relaxed);
            return Ok(Claim {
                client_id: client.id(),
                client,
                ctx,
                live,
                pinned: false,
                mapped: false,
            });
        }
    }
    Err(ENXIO)
}

/// Asks the module's clients in order; the first to claim `range` owns it.
/// When every client declines: `EFAULT` if nothing is mapped at the range's
/// start, else `ENXIO` (the range is not device memory). A client's own
/// error ends the search. The registry's lock is held only while the
/// clients are listed.
pub(crate) fn acquire(range: UserRange) -> Result<Claim> {
    let clients = clients().snapshot()?;
    ask(clients, range).map_err(|e| {
        use crate::sys::vma::{user_mapping, UserMapping};
        if e == ENXIO && user_mapping(range.addr) == UserMapping::None {
            EFAULT
        } else {
            e
        }
    })
}

#[cfg(CONFIG_KUNIT)]
#[kernel::macros::kunit_tests(p2pdirect_peer_mem)]
mod tests {
    use super::*;
    use kernel::sync::atomic::Atomic;

    /// Calls a fake context saw: each adds its bit, so a repeated call
    /// shows up as a wrong sum.
    struct Log(Atomic<u32>);
    const GOT: u32 = 1;
    const MAPPED: u32 = 2;
    const UNMAPPED: u32 = 4;
    const PUT: u32 = 8;

    struct FakeCtx(Arc<Log>);
    impl Context for FakeCtx {
        fn get_pages(&mut self, _write: bool) -> Result {
            self.0 .0.fetch_add(GOT, Relaxed);
            Ok(())
        }
        fn page_size(&self) -> u64 {
            4096
        }
        fn dma_map(&mut self, _dev: &crate::ffi::DmaDevice) -> Result<KVVec<DmaSeg>> {
            self.0 .0.fetch_add(MAPPED, Relaxed);
            Ok(KVVec::new())
        }
        fn dma_unmap(&mut self) {
            self.0 .0.fetch_add(UNMAPPED, Relaxed);
        }
        fn put_pages(&mut self) {
            self.0 .0.fetch_add(PUT, Relaxed);
        }
        fn pages(&self) -> Option<crate::ffi::Pages> {
            None
        }
    }

    /// Claims `[lo, hi)` only.
    struct Fake {
        name: &'static str,
        lo: u64,
        hi: u64,
        log: Arc<Log>,
    }
    impl Client for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn id(&self) -> u32 {
            0
        }
        fn acquire(&self, r: UserRange) -> Result<Option<KBox<dyn Context>>> {
            if r.addr >= self.lo && r.end() <= self.hi {
                let ctx: KBox<dyn Context> = KBox::new(FakeCtx(self.log.clone()), GFP_KERNEL)?;
                Ok(Some(ctx))
            } else {
                Ok(None)
            }
        }
    }

    fn fake(name: &'static str, lo: u64, hi: u64) -> (Arc<dyn Client>, Arc<Log>) {
        let log = Arc::new(Log(Atomic::new(0)), GFP_KERNEL).unwrap();
        let c: Arc<dyn Client> = Arc::new(
            Fake {
                name,
                lo,
                hi,
                log: log.clone(),
            },
            GFP_KERNEL,
        )
        .unwrap();
        (c, log)
    }

    #[test]
    fn first_claimer_wins_in_order() {
        let mut reg = Registry::new();
        let (a, _) = fake("a", 0x1000, 0x5000);
        let (b, _) = fake("b", 0x0, 0x10000);
        reg.register(a).unwrap();
        reg.register(b).unwrap();
        // Both would claim: the first registered owns it.
        let c = reg
            .acquire(UserRange::new(0x2000, 0x1000).unwrap())
            .unwrap();
        assert_eq!(c.client_name(), "a");
        // Only b claims a range outside a's.
        let c2 = reg
            .acquire(UserRange::new(0x8000, 0x1000).unwrap())
            .unwrap();
        assert_eq!(c2.client_name(), "b");
        // A range straddling a's end is declined by a (not entirely its own).
        let c3 = reg
            .acquire(UserRange::new(0x4000, 0x2000).unwrap())
            .unwrap();
        assert_eq!(c3.client_name(), "b");
    }

    #[test]
    fn declined_by_all_is_enxio() {
        let mut reg = Registry::new();
        let (a, _) = fake("a", 0x1000, 0x2000);
        reg.register(a).unwrap();
        assert_eq!(
            reg.acquire(UserRange::new(0x9000, 0x1000).unwrap()).err(),
            Some(ENXIO)
        );
        let empty = Registry::new();
        assert_eq!(
            empty.acquire(UserRange::new(0x1000, 1).unwrap()).err(),
            Some(ENXIO)
        );
    }

    #[test]
    fn duplicate_names_and_unknown_unregister() {
        let mut reg = Registry::new();
        let (a, _) = fake("a", 0, 1);
        let (a2, _) = fake("a", 0, 1);
        reg.register(a).unwrap();
        assert_eq!(reg.register(a2).err(), Some(EEXIST));
        assert_eq!(reg.unregister("zzz").err(), Some(ENOENT));
        assert_eq!(reg.unregister("a"), Ok(()));
        assert_eq!(reg.unregister("a").err(), Some(ENOENT));
    }

    #[test]
    fn refcounts_block_unregister_until_release() {
        let mut reg = Registry::new();
        let (a, _) = fake("a", 0, 0x100000);
        reg.register(a).unwrap();
        let r = UserRange::new(0x1000, 0x1000).unwrap();
        let c1 = reg.acquire(r).unwrap();
        let c2 = reg.acquire(r).unwrap();
        assert_eq!(reg.live("a"), Some(2));
        assert_eq!(reg.unregister("a").err(), Some(EBUSY));
        drop(c1);
        assert_eq!(reg.live("a"), Some(1));
        drop(c2);
        assert_eq!(reg.live("a"), Some(0));
        assert_eq!(reg.unregister("a"), Ok(()));
    }

    #[test]
    fn release_unmaps_and_unpins() {
        let mut reg = Registry::new();
        let (a, log) = fake("a", 0, 0x100000);
        reg.register(a).unwrap();
        let mut c = reg
            .acquire(UserRange::new(0x1000, 0x1000).unwrap())
            .unwrap();
        // dma_map before get_pages is refused; get_pages twice too.
        let dev = crate::ffi::DmaDevice::none();
        assert_eq!(c.dma_map(&dev).err(), Some(EINVAL));
        c.get_pages(true).unwrap();
        assert_eq!(c.get_pages(true).err(), Some(EBUSY));
        c.dma_map(&dev).unwrap();
        assert_eq!(log.0.load(Relaxed), GOT | MAPPED);
        drop(c);
        assert_eq!(log.0.load(Relaxed), GOT | MAPPED | UNMAPPED | PUT);
    }

    #[test]
    fn pinned_bytes_are_whole_pages() {
        assert_eq!(UserRange::new(0x1000, 1).unwrap().pinned_bytes(), 0x1000);
        assert_eq!(UserRange::new(0x1fff, 2).unwrap().pinned_bytes(), 0x2000);
        assert_eq!(
            UserRange::new(0x1000, 0x1000).unwrap().pinned_bytes(),
            0x1000
        );
        assert_eq!(
            UserRange::new(0x1800, 0x1000).unwrap().pinned_bytes(),
            0x2000
        );
    }

    #[test]
    fn bad_ranges() {
        assert_eq!(UserRange::new(0x1000, 0).err(), Some(EINVAL));
        assert_eq!(UserRange::new(u64::MAX, 2).err(), Some(EINVAL));
    }
}

crate::sys::global::global_mutex! {
    static CLIENTS: Registry = Registry::new();
    /// The registry's global: set up in module init before anything that
    /// uses it, emptied after.
    pub(crate) struct Globals;
    /// The peer-memory client registry (a leaf lock: held only to add,
    /// remove or snapshot clients, never across a client's callbacks).
    pub(crate) fn clients;
}
