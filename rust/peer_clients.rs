// SPDX-License-Identifier: GPL-2.0

//! The built-in peer-memory clients, in the order the registry asks them:
//! 1. `p2pdirect-devmem`: p2pdirect's own device memory. Claims a range that
//!    lies in one of its device-memory mappings, or in a CPU mapping of a
//!    dma-buf exported from one of its allocations (direct lookup of the VMA).
//! 2. `p2pdma-user`: any user mapping backed by P2PDMA pages of another
//!    provider (an mmap of a device's sysfs `p2pmem/allocate`, or a GPU
//!    driver that maps its BAR as P2PDMA pages). Claims a range whose first
//!    page is P2PDMA memory (`EFAULT` if the range runs out of that
//!    mapping); pinning then requires every page to be.
//!
//! Ordinary RAM is declined by both.
//!
//! Another provider's P2PDMA pages go away with its driver, whose removal
//! waits for every page reference: consumers that keep a `p2pdma-user`
//! claim (registrations, kernel-API consumers) watch the provider
//! ([`watch`]) and are invalidated before that driver's `remove` runs
//! ([`ForeignUnbind`]), as consumers of p2pdirect's own memory are on FREE.

use crate::{
    devmem::AllocState,
    error::{etoomanyrefs, refuse},
    ffi::{self, DmaDevice, UserPin},
    peer_mem::{Client, Consumer, Context, DmaSeg, UserRange},
    stats::Bdf,
    sys::uapi,
};
use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::Arc,
};

/// A claimed range, pinned with `FOLL_PCI_P2PDMA` by `get_pages`.
struct PinContext {
    range: UserRange,
    pin: Option<UserPin>,
    /// The p2pdirect allocation the range lies in (devmem client only).
    state: Option<Arc<AllocState>>,
    /// Another provider's pages (p2pdma-user client): the PCI function
    /// whose BAR holds them (`PciFunction::id`), once pinned.
    provider: Option<usize>,
}

impl Context for PinContext {
    fn get_pages(&mut self, write: bool) -> Result {
        // No pin (nor its page array) larger than a file may keep pinned.
        self.range.check_pin_cap()?;
        let pin = UserPin::new(self.range.addr, self.range.size, write).inspect_err(|e| {
            if *e == EFAULT && crate::sys::ratelimit::allow() {
                pr_info!(
                    "{:#x}+{:#x}: the memory cannot be pinned{}: not mapped{} (FREE, device \
                     removal, munmap, mprotect)\n",
                    self.range.addr,
                    self.range.size,
                    if write { " for writing" } else { "" },
                    if write { " writable" } else { "" }
                );
            }
        })?;
        // A range that runs from device memory into RAM is not device memory.
        if !pin.is_p2pdma() {
            return Err(ENXIO);
        }
        // The mapping looked up may have been replaced before the pages
        // were pinned: the pages must be the allocation's.
        match self.state.as_ref() {
            Some(state) if !state.holds(&pin) => refuse!(
                EFAULT,
                "{:#x}+{:#x}: the device-memory mapping changed while it was pinned\n",
                self.range.addr,
                self.range.size
            ),
            Some(_) => {}
            // Another provider's pages, all of one device (whose unbind is
            // watched for): a mapping replaced by another device's between
            // the lookup and the pin is caught here.
            None => match pin.single_provider_id() {
                Some(id) => self.provider = Some(id),
                None => refuse!(
                    EFAULT,
                    "{:#x}+{:#x}: its P2PDMA pages are not all of one region of a device \
                     p2pdirect can find (a mapping replaced while it was pinned?)\n",
                    self.range.addr,
                    self.range.size
                ),
            },
        }
        // The kernel counts a page's pins in its 32-bit reference count,
        // 1024 to a pin: registrations of one page from many files would
        // overflow it (and the next pin would warn). The pin taken here
        // counts, so a page that held the most before is refused.
        let pins = pin.most_pins();
        if pins > uapi::P2PDIRECT_PAGE_PINS_MAX {
            refuse!(
                etoomanyrefs(),
                "{:#x}+{:#x}: a page of it holds {} pins already, the most one may\n",
                self.range.addr,
                self.range.size,
                pins - 1
            );
        }
        self.pin = Some(pin);
        Ok(())
    }

    fn page_size(&self) -> u64 {
        PAGE_SIZE as u64
    }

    fn dma_map(&mut self, dev: &DmaDevice) -> Result<KVVec<DmaSeg>> {
        let pin = self.pin.as_mut().ok_or(EINVAL)?;
        pin.dma_map(dev.pci().ok_or(ENODEV)?)?;
        // A mapping nobody learns the segments of is undone at once.
        pin.dma_segs().inspect_err(|_| pin.dma_unmap())
    }

    fn dma_unmap(&mut self) {
        if let Some(pin) = self.pin.as_mut() {
            pin.dma_unmap();
        }
    }

    fn put_pages(&mut self) {
        self.pin = None;
    }

    fn pages(&self) -> Option<ffi::Pages> {
        self.pin.as_ref().map(UserPin::share)
    }

    fn devmem_state(&self) -> Option<Arc<AllocState>> {
        self.state.clone()
    }

    fn foreign_provider(&self) -> Option<usize> {
        self.pin.as_ref().and(self.provider)
    }
}

fn context(range: UserRange, state: Option<Arc<AllocState>>) -> Result<Option<KBox<dyn Context>>> {
    let ctx: KBox<dyn Context> = KBox::new(
        PinContext {
            range,
            pin: None,
            state,
            provider: None,
        },
        GFP_KERNEL_ACCOUNT,
    )?;
    Ok(Some(ctx))
}

/// p2pdirect's own device memory.
pub(crate) struct DevmemClient;

impl Client for DevmemClient {
    fn name(&self) -> &'static str {
        "p2pdirect-devmem"
    }

    fn id(&self) -> u32 {
        uapi::P2PDIRECT_CLIENT_DEVMEM
    }

    fn acquire(&self, range: UserRange) -> Result<Option<KBox<dyn Context>>> {
        // The allocation's own mapping, or a CPU mapping of a dma-buf
        // exported from it: the same memory, with the same invalidation.
        if let Some((state, _)) = crate::devmem::user_range(range.addr, range.size)? {
            return context(range, Some(state));
        }
        match crate::dmabuf::user_range(range.addr, range.size)? {
            Some(state) => context(range, Some(state)),
            None => Ok(None),
        }
    }
}

/// User mappings of other providers' P2PDMA pages.
pub(crate) struct P2pdmaUserClient;

impl Client for P2pdmaUserClient {
    fn name(&self) -> &'static str {
        "p2pdma-user"
    }

    fn id(&self) -> u32 {
        uapi::P2PDIRECT_CLIENT_P2PDMA_USER
    }

    fn acquire(&self, range: UserRange) -> Result<Option<KBox<dyn Context>>> {
        if !ffi::user_addr_is_p2pdma(range.addr)? {
            return Ok(None);
        }
        // As for p2pdirect's own mappings: a range that runs out of its
        // mapping (into other memory, or into another mapping of P2PDMA
        // pages) is refused, whatever the pages beyond are.
        if !crate::sys::vma::in_one_mapping(range.addr, range.size) {
            refuse!(
                EFAULT,
                "{:#x}+{:#x} runs out of its P2PDMA mapping (into other memory or another \
                 mapping)\n",
                range.addr,
                range.size
            );
        }
        context(range, None)
    }
}

/// A watcher's place in [`Watchers::subs`]: the PCI function whose BAR holds
/// its pages (as `PciFunction::id` names it: a pinned page keeps its
/// function), then its consumer id.
type WatchKey = (usize, u64);

/// Who keeps claims on other providers' P2PDMA pages.
struct Watchers {
    /// Each consumer by [`WatchKey`] (made at the first watch: a tree is not
    /// `const`-constructible). One joins and leaves in logarithmic time and
    /// a node of its own, so any number of registrations costs what they
    /// hold: no list grows into one allocation too large to make.
    subs: Option<RBTree<WatchKey, Arc<dyn Consumer>>>,
    /// Functions whose driver is unbinding: nobody starts watching them.
    dying: KVec<usize>,
}

crate::sys::global::global_mutex! {
    static WATCHERS: Watchers = Watchers {
        subs: None,
        dying: KVec::new(),
    };
    /// The watcher list's global.
    pub(crate) struct WatchersGlobal;
    /// Consumers of other providers' memory (a leaf lock).
    fn watchers;
}

/// Tells `consumer` before the driver of the function `provider` (a
/// [`Claim::foreign_provider`](crate::peer_mem::Claim)) is removed;
/// `EFAULT` if that driver is being removed already (the memory is going
/// away under the caller).
pub(crate) fn watch(provider: usize, consumer: Arc<dyn Consumer>) -> Result {
    // The node lives as long as the watch: charged to its maker, as the
    // registration's record is.
    let key = (provider, consumer.consumer_id());
    let node = RBTreeNode::new(key, consumer, GFP_KERNEL_ACCOUNT)?;
    let mut w = watchers();
    if w.dying.contains(&provider) {
        return Err(EFAULT);
    }
    // Consumer ids are unique, so nothing is replaced.
    let replaced = w.subs.get_or_insert_with(RBTree::new).insert(node);
    drop(w);
    drop(replaced);
    Ok(())
}

/// Ends the watch of consumer `id` on `provider`'s memory.
pub(crate) fn unwatch(provider: usize, id: u64) {
    let gone = watchers()
        .subs
        .as_mut()
        .and_then(|subs| subs.remove_node(&(provider, id)));
    // Outside the lock: a consumer's last reference may sleep.
    drop(gone);
}

/// Invalidates the claims consumers keep on a provider's memory before its
/// driver unbinds (its removal would wait for their pins). Runs in the
/// PCI bus notifier, under the device's lock.
pub(crate) struct ForeignUnbind;

impl crate::sys::pci_notify::PciUnbind for ForeignUnbind {
    fn unbinding(id: usize, addr: u32) {
        {
            let mut w = watchers();
            if !w.dying.contains(&id) {
                // If the mark cannot be kept, a consumer that pins the
                // memory meanwhile holds the removal up until it puts.
                let _ = w.dying.push(id, GFP_KERNEL);
            }
        }
        let mut told = 0u32;
        loop {
            let sub = {
                let mut w = watchers();
                w.subs.as_mut().and_then(|subs| {
                    // The provider's first watcher, if it has one left.
                    let key = *subs.cursor_lower_bound(&(id, 0))?.current().0;
                    (key.0 == id).then(|| subs.remove(&key)).flatten()
                })
            };
            let Some(consumer) = sub else { break };
            // With no lock held: the consumer stops, unmaps and unpins.
            consumer.invalidate();
            told += 1;
        }
        if told > 0 {
            crate::devmem::reap();
            pr_info!(
                "{}: its driver is unbinding; {} registrations and consumers of its P2PDMA \
                 memory invalidated\n",
                Bdf(addr),
                told
            );
        }
    }

    fn unbound(id: usize, _addr: u32) {
        watchers().dying.retain(|d| *d != id);
    }
}

/// The built-in clients' registration, held by the module.
pub(crate) struct Builtins(WatchersGlobal);

impl Builtins {
    /// Registers both clients, in the order they are asked.
    pub(crate) fn register() -> Result<Self> {
        let devmem: Arc<dyn Client> = Arc::new(DevmemClient, GFP_KERNEL)?;
        let user: Arc<dyn Client> = Arc::new(P2pdmaUserClient, GFP_KERNEL)?;
        let mut reg = crate::peer_mem::clients();
        let watchers = WatchersGlobal::init()?;
        reg.register(devmem)?;
        reg.register(user)?;
        Ok(Self(watchers))
    }
}

impl Drop for Builtins {
    fn drop(&mut self) {
        // No context can be alive: every file is closed before module exit.
        let mut reg = crate::peer_mem::clients();
        for name in ["p2pdma-user", "p2pdirect-devmem"] {
            if let Err(e) = reg.unregister(name) {
                pr_err!(
                    "peer-memory client {} not unregistered ({:?}, {} contexts alive)\n",
                    name,
                    e,
                    reg.live(name).unwrap_or(0)
                );
            }
        }
    }
}
