// SPDX-License-Identifier: GPL-2.0

//! The kernel API of include/linux/p2pdirect.h, over the peer-memory
//! registry:
//!
//! - clients of other modules ([`External`]) join the registry after the
//!   built-in ones; their claims are named by a `core_context` id, by which
//!   the client's invalidation finds the consumer keeping the claim;
//! - consumers of other modules ([`KernelMem`]) take a range like a
//!   registration does, subscribed to its invalidation: p2pdirect's own
//!   memory through its allocation, a client's through its id.
//!
//! Unregistering a client refuses it new claims, invalidates those consumers
//! keep, and sleeps until its last context went (transient ones: DMA_PROBE).
//!
//! Lock order (see `error.rs`): `KernelMem::claim` like `RegEntry::claim`
//! (the client's callbacks for a claim run under it, one at a time), then
//! `KernelMem::st`; a client's state is a leaf. Consumers are told with no
//! lock of p2pdirect's held.

use crate::{
    devmem::{AllocState, Consumer},
    error::{estale, refuse},
    ffi::{DmaDevice, DmaSeg},
    peer_mem::{self, Claim, Client, Context, ExternalClaims, UserRange},
    stats::Pinned,
    sys::{
        peer_client::{ForeignClient, ForeignCtx, KernelApi, Notify},
        uapi,
    },
};
use kernel::{
    new_condvar, new_mutex, pci,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, CondVar, Mutex,
    },
};

crate::sys::peer_client::kernel_api!(crate::peer_api::Api);

/// Claim ids of clients of other modules (`core_context`).
static NEXT_CORE_ID: Atomic<u64> = Atomic::new(1);
/// Subscription ids of kernel consumers: disjoint from registrations' (from
/// 1) and dma-buf exports' (from 2^63).
static NEXT_MEM_ID: Atomic<u64> = Atomic::new(1 << 62);

struct ExtState {
    /// Contexts alive.
    live: u64,
    /// Unregistering: no new claim.
    dead: bool,
    /// Claims handed to the client's `get_pages` and not yet released, by
    /// `core_context`.
    pinned: RBTree<u64, ()>,
    /// Consumers keeping claims (kernel consumers), by `core_context`. Both
    /// are trees: a claim joins and leaves in logarithmic time and a node of
    /// its own, so any number of claims costs what they hold, and no list
    /// grows into one allocation too large to make.
    subs: RBTree<u64, Arc<dyn Consumer>>,
}

/// What a client and its contexts share.
#[pin_data]
struct ExtShared {
    #[pin]
    state: Mutex<ExtState>,
    /// Notified when a context goes or a consumer subscribes.
    #[pin]
    changed: CondVar,
}

impl ExtShared {
    /// Invalidates claim `core_id`: tells the consumer keeping it (which
    /// lets it go), or waits for a claim nobody keeps (a transient one, or
    /// one whose consumer subscribes next) to go. Returns once it went.
    fn invalidate(&self, core_id: u64) {
        let mut st = self.state.lock();
        loop {
            if let Some(consumer) = st.subs.remove(&core_id) {
                drop(st);
                consumer.invalidate();
                // Its last reference may sleep: not under the lock.
                drop(consumer);
                st = self.state.lock();
                continue;
            }
            if st.pinned.get(&core_id).is_none() {
                return;
            }
            self.changed.wait(&mut st);
        }
    }

    /// Keeps `consumer` told of claim `core_id`.
    fn subscribe(&self, core_id: u64, consumer: Arc<dyn Consumer>) -> Result {
        let node = RBTreeNode::new(core_id, consumer, GFP_KERNEL)?;
        let mut st = self.state.lock();
        // Claim ids are unique, so nothing is replaced.
        let replaced = st.subs.insert(node);
        self.changed.notify_all();
        drop(st);
        drop(replaced);
        Ok(())
    }

    fn unsubscribe(&self, core_id: u64) {
        let node = self.state.lock().subs.remove_node(&core_id);
        drop(node);
    }
}

/// A client another module registered.
pub(crate) struct External {
    foreign: Arc<ForeignClient>,
    shared: Arc<ExtShared>,
}

impl Client for External {
    fn name(&self) -> &str {
        // `register` refused names that are not UTF-8.
        self.foreign.name().to_str().unwrap_or("")
    }

    fn id(&self) -> u32 {
        uapi::P2PDIRECT_CLIENT_EXTERNAL
    }

    fn acquire(&self, range: UserRange) -> Result<Option<KBox<dyn Context>>> {
        {
            let mut st = self.shared.state.lock();
            if st.dead {
                return Ok(None);
            }
            st.live += 1;
        }
        // From here the count is the context's (or undone by `Gone`).
        let gone = Gone(self.shared.clone());
        let Some(fc) = self.foreign.acquire(range.addr, range.size)? else {
            return Ok(None);
        };
        Ok(Some(KBox::new(
            ExternalCtx {
                fc: Some(fc),
                core_id: NEXT_CORE_ID.fetch_add(1, Relaxed),
                gone,
            },
            GFP_KERNEL_ACCOUNT,
        )?))
    }
}

/// Counts a context of a client down when dropped.
struct Gone(Arc<ExtShared>);

impl Drop for Gone {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.live -= 1;
        self.0.changed.notify_all();
    }
}

/// A claim of a client of another module.
struct ExternalCtx {
    /// Released before `gone` counts it down.
    fc: Option<ForeignCtx>,
    core_id: u64,
    gone: Gone,
}

impl ExternalCtx {
    fn fc(&mut self) -> Result<&mut ForeignCtx> {
        self.fc.as_mut().ok_or(EINVAL)
    }
}

impl Drop for ExternalCtx {
    fn drop(&mut self) {
        drop(self.fc.take());
        let shared = &self.gone.0;
        let mut st = shared.state.lock();
        let node = st.pinned.remove_node(&self.core_id);
        shared.changed.notify_all();
        drop(st);
        drop(node);
    }
}

impl Context for ExternalCtx {
    fn get_pages(&mut self, write: bool) -> Result {
        let id = self.core_id;
        // Known before the client is: its invalidation may come at once.
        // (The client's list, shared by all its users: charged to none.)
        let node = RBTreeNode::new(id, (), GFP_KERNEL)?;
        drop(self.gone.0.state.lock().pinned.insert(node));
        self.fc()?.get_pages(write, id)
    }

    fn page_size(&self) -> u64 {
        self.fc.as_ref().map_or(0, |f| f.page_size())
    }

    fn dma_map(&mut self, dev: &DmaDevice) -> Result<KVVec<DmaSeg>> {
        let pci = dev.pci().ok_or(ENODEV)?;
        let fc = self.fc()?;
        let list = fc.dma_map(pci.as_pci())?;
        let Ok(mut out) = KVVec::with_capacity(list.len(), GFP_KERNEL) else {
            // Not reported as mapped: the client's mapping goes too.
            fc.dma_unmap();
            return Err(ENOMEM);
        };
        for (addr, len) in list {
            // Within the capacity reserved above.
            let _ = out.push_within_capacity(DmaSeg { addr, len });
        }
        Ok(out)
    }

    fn dma_unmap(&mut self) {
        if let Ok(f) = self.fc() {
            f.dma_unmap();
        }
    }

    fn put_pages(&mut self) {
        if let Ok(f) = self.fc() {
            f.put_pages();
        }
    }

    fn pages(&self) -> Option<crate::ffi::Pages> {
        None
    }

    fn external(&self) -> Option<(Arc<dyn ExternalClaims>, u64)> {
        Some((self.gone.0.clone(), self.core_id))
    }

    fn has_pages(&self) -> bool {
        false
    }
}

impl ExternalClaims for ExtShared {
    fn subscribe(&self, core_id: u64, consumer: Arc<dyn Consumer>) -> Result {
        ExtShared::subscribe(self, core_id, consumer)
    }

    fn unsubscribe(&self, core_id: u64) {
        ExtShared::unsubscribe(self, core_id)
    }
}

struct MemState {
    /// The consumer put the range: never tell it again.
    released: bool,
    /// An invalidation is telling the consumer or dropping the claim.
    busy: bool,
    /// The thread running the consumer's callback while it runs (its
    /// pid): a `put` from inside the callback must not wait for itself.
    telling: Option<kernel::task::Pid>,
}

/// A range a consumer of another module took.
#[pin_data]
pub(crate) struct KernelMem {
    id: u64,
    notify: Notify,
    /// p2pdirect's own memory: the allocation it is subscribed to.
    state: Option<Arc<AllocState>>,
    /// A client of another module: its claims and this claim's id.
    external: Option<(Arc<dyn ExternalClaims>, u64)>,
    /// Another provider's P2PDMA pages: that provider (`PciFunction::id`),
    /// whose driver's removal it watches.
    foreign: Option<usize>,
    /// The claim and its share of the provider's pinned bytes, until
    /// invalidated or put. Held across the client's callbacks for it (one
    /// at a time), never across the consumer's.
    #[pin]
    claim: Mutex<Option<(Claim, Option<Pinned>)>>,
    #[pin]
    st: Mutex<MemState>,
    /// Notified when an invalidation is done.
    #[pin]
    done: CondVar,
}

impl Consumer for KernelMem {
    fn consumer_id(&self) -> u64 {
        self.id
    }

    fn invalidate(&self) {
        let (claim, tell) = {
            let mut guard = self.claim.lock();
            let Some(claim) = guard.take() else {
                return;
            };
            // Under the claim's lock: a `put` that then finds no claim
            // waits for this invalidation to end.
            let mut st = self.st.lock();
            st.busy = true;
            if !st.released {
                st.telling = Some(kernel::current!().pid());
            }
            (claim, !st.released)
        };
        // The consumer stops its DMA first; the claim then unmaps and
        // unpins. No lock of p2pdirect's is held meanwhile.
        if tell {
            self.notify.call();
        }
        self.st.lock().telling = None;
        drop(claim);
        crate::devmem::reap();
        let mut st = self.st.lock();
        st.busy = false;
        self.done.notify_all();
    }
}

/// The implementation of the kernel API.
pub(crate) struct Api;

impl KernelApi for Api {
    type Client = External;
    type Mem = KernelMem;

    fn register(foreign: Arc<ForeignClient>) -> Result<Arc<External>> {
        let shared = Arc::pin_init(
            pin_init!(ExtShared {
                state <- new_mutex!(ExtState {
                    live: 0,
                    dead: false,
                    pinned: RBTree::new(),
                    subs: RBTree::new(),
                }),
                changed <- new_condvar!(),
            }),
            GFP_KERNEL,
        )?;
        let ext = Arc::new(External { foreign, shared }, GFP_KERNEL)?;
        if ext.foreign.name().to_str().is_err() {
            refuse!(
                EINVAL,
                "peer-memory client refused: its name is not UTF-8\n"
            );
        }
        peer_mem::clients().register(ext.clone()).inspect_err(|e| {
            if *e == EEXIST {
                pr_warn!(
                    "peer-memory client {} refused: the name is in use\n",
                    ext.name()
                );
            }
        })?;
        pr_info!("peer-memory client {} registered\n", ext.name());
        Ok(ext)
    }

    fn unregister(ext: Arc<External>) {
        let shared = &ext.shared;
        let mut st = shared.state.lock();
        st.dead = true;
        // Claims consumers keep are invalidated as if the client asked (also
        // one subscribed while this waits); transient ones (DMA_PROBE) end
        // by themselves.
        loop {
            let first = st.subs.cursor_front_mut().map(|c| c.remove_current().1);
            if let Some(node) = first {
                let (_, consumer) = node.to_key_value();
                drop(st);
                consumer.invalidate();
                drop(consumer);
                st = shared.state.lock();
                continue;
            }
            if st.live == 0 {
                break;
            }
            shared.changed.wait(&mut st);
        }
        drop(st);
        if peer_mem::clients().unregister(ext.name()).is_err() {
            pr_warn!("peer-memory client {} was not registered\n", ext.name());
        }
        pr_info!("peer-memory client {} unregistered\n", ext.name());
    }

    fn invalidate(ext: &External, core_id: u64) -> Result {
        ext.shared.invalidate(core_id);
        Ok(())
    }

    fn get(addr: u64, size: u64, write: bool, notify: Notify) -> Result<Arc<KernelMem>> {
        if kernel::current!().mm().is_none() {
            return Err(EFAULT);
        }
        let range = UserRange::new(addr, size)?;
        let mut claim = peer_mem::acquire(range)?;
        claim.get_pages(write)?;
        let state = claim.devmem_state();
        let subscribed = state.clone();
        let external = claim.external();
        let ext = external.clone();
        let foreign = claim.foreign_provider();
        // Counted in the provider's pinned bytes like a registration.
        let pinned = match external {
            None => claim
                .pages()
                .ok()
                .map(|p| Pinned::new(p.provider(), range.pinned_bytes())),
            Some(_) => None,
        };
        let mem = Arc::pin_init(
            pin_init!(KernelMem {
                id: NEXT_MEM_ID.fetch_add(1, Relaxed),
                notify,
                state,
                external,
                foreign,
                claim <- new_mutex!(Some((claim, pinned))),
                st <- new_mutex!(MemState {
                    released: false,
                    busy: false,
                    telling: None,
                }),
                done <- new_condvar!(),
            }),
            GFP_KERNEL_ACCOUNT,
        );
        let mem = match mem {
            Ok(m) => m,
            Err(e) => {
                crate::devmem::reap();
                return Err(e);
            }
        };
        // Memory that went away under the caller (freed, or its driver
        // unbinding) is stale, as it would be a moment later.
        let subscribed = match (&subscribed, &ext, foreign) {
            (Some(st), _, _) => st.subscribe(mem.clone()),
            (None, Some((claims, core_id)), _) => claims.subscribe(*core_id, mem.clone()),
            (None, None, Some(provider)) => crate::peer_clients::watch(provider, mem.clone()),
            (None, None, None) => Ok(()),
        }
        .map_err(|e| if e == EFAULT { estale() } else { e });
        if let Err(e) = subscribed {
            Self::put(mem);
            return Err(e);
        }
        Ok(mem)
    }

    fn dma_map(mem: &KernelMem, dev: &pci::Device, max: usize) -> Result<KVVec<(u64, u64)>> {
        let mut guard = mem.claim.lock();
        let (claim, _) = Option::as_mut(&mut *guard).ok_or_else(estale)?;
        if claim.is_mapped() {
            return Err(EBUSY);
        }
        let segs = claim.dma_map(&DmaDevice::of_pci(dev))?;
        // More segments than the caller has room for: unmapped under the
        // lock, so that no other caller's map or unmap comes between.
        if segs.len() > max {
            claim.dma_unmap();
            return Err(E2BIG);
        }
        let Ok(mut out) = KVVec::with_capacity(segs.len(), GFP_KERNEL) else {
            // The caller is told the map failed: it must not stay mapped.
            claim.dma_unmap();
            return Err(ENOMEM);
        };
        for s in segs.iter() {
            // Within the capacity reserved above.
            let _ = out.push_within_capacity((s.addr, s.len));
        }
        Ok(out)
    }

    fn dma_unmap(mem: &KernelMem) {
        if let Some((c, _)) = Option::as_mut(&mut *mem.claim.lock()) {
            c.dma_unmap();
        }
    }

    fn page_size(mem: &KernelMem) -> u64 {
        mem.claim.lock().as_ref().map_or(0, |(c, _)| c.page_size())
    }

    fn put(mem: Arc<KernelMem>) {
        mem.st.lock().released = true;
        if let Some(st) = &mem.state {
            st.unsubscribe(mem.id);
        }
        if let Some((claims, core_id)) = &mem.external {
            claims.unsubscribe(*core_id);
        }
        if let Some(provider) = mem.foreign {
            crate::peer_clients::unwatch(provider, mem.id);
        }
        // Taking the claim waits for an invalidation that took it first to
        // mark itself busy; then wait for it to end.
        let claim = mem.claim.lock().take();
        let mut st = mem.st.lock();
        // From inside the consumer's own callback (which the header
        // forbids, but an RDMA driver may well do): waiting would wait for
        // this very call. The invalidation holds the claim and lets it go
        // once the callback returns; the range is released already.
        if st.busy && st.telling == Some(kernel::current!().pid()) {
            return;
        }
        while st.busy {
            mem.done.wait(&mut st);
        }
        drop(st);
        drop(claim);
        crate::devmem::reap();
    }
}
