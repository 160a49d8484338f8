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
//! Lock order (see `error.rs`): `KernelMem::claim` like `RegEntry::claim`;
//! the subscription list and a client's state are leaves. Invalidation
//! calls consumers with neither held.

use crate::{
    devmem::{AllocState, Consumer},
    error::estale,
    ffi::{DmaDevice, DmaSeg},
    peer_mem::{self, Claim, Client, Context, UserRange},
    sys::{
        peer_client::{ForeignClient, ForeignCtx, KernelApi, Notify},
        uapi,
    },
};
use kernel::{
    new_condvar, new_mutex, pci,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, CondVar, Mutex,
    },
};

crate::sys::peer_client::kernel_api!(crate::peer_api::Api);

crate::sys::global::global_mutex! {
    static SUBS: KVec<Sub> = KVec::new();
    /// The subscription list's global.
    pub(crate) struct SubsGlobal;
    /// Consumers keeping claims of other modules' clients (a leaf lock).
    fn subs;
}

/// A consumer keeping a claim of client `client` (its shared state's
/// address) named `core_id`.
struct Sub {
    client: usize,
    core_id: u64,
    consumer: Arc<dyn Consumer>,
}

/// The kernel API's globals, set up after the registry's.
pub(crate) struct Globals {
    _subs: SubsGlobal,
}

impl Globals {
    pub(crate) fn init() -> Result<Self> {
        Ok(Self {
            _subs: SubsGlobal::init()?,
        })
    }
}

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
}

/// What a client and its contexts share.
#[pin_data]
struct ExtShared {
    #[pin]
    state: Mutex<ExtState>,
    /// Notified when `live` drops to 0.
    #[pin]
    idle: CondVar,
}

/// A client another module registered.
pub(crate) struct External {
    foreign: Arc<ForeignClient>,
    shared: Arc<ExtShared>,
}

impl External {
    fn key(&self) -> usize {
        key(&self.shared)
    }
}

/// Names a client in the subscription list (its shared state's address).
fn key(shared: &Arc<ExtShared>) -> usize {
    core::ptr::from_ref::<ExtShared>(shared) as usize
}

impl Client for External {
    fn name(&self) -> &str {
        self.foreign.name().to_str().unwrap_or("(unnamed)")
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
                _gone: gone,
            },
            GFP_KERNEL,
        )?))
    }
}

/// Counts a context of a client down when dropped.
struct Gone(Arc<ExtShared>);

impl Drop for Gone {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.live -= 1;
        if st.live == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// A claim of a client of another module.
struct ExternalCtx {
    /// Released before `_gone` counts it down.
    fc: Option<ForeignCtx>,
    core_id: u64,
    _gone: Gone,
}

impl ExternalCtx {
    fn fc(&mut self) -> Result<&mut ForeignCtx> {
        self.fc.as_mut().ok_or(EINVAL)
    }
}

impl Drop for ExternalCtx {
    fn drop(&mut self) {
        drop(self.fc.take());
    }
}

impl Context for ExternalCtx {
    fn get_pages(&mut self, write: bool) -> Result {
        let id = self.core_id;
        self.fc()?.get_pages(write, id)
    }

    fn page_size(&self) -> u64 {
        self.fc.as_ref().map_or(0, |f| f.page_size())
    }

    fn dma_map(&mut self, dev: &DmaDevice) -> Result<KVec<DmaSeg>> {
        let pci = dev.pci().ok_or(ENODEV)?;
        let list = self.fc()?.dma_map(pci.as_pci())?;
        let mut out = KVec::with_capacity(list.len(), GFP_KERNEL)?;
        for (addr, len) in list {
            out.push(DmaSeg { addr, len }, GFP_KERNEL)?;
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

    fn external(&self) -> Option<(usize, u64)> {
        Some((key(&self._gone.0), self.core_id))
    }
}

/// A range a consumer of another module took.
#[pin_data]
pub(crate) struct KernelMem {
    id: u64,
    notify: Option<Notify>,
    /// p2pdirect's own memory: the allocation it is subscribed to.
    state: Option<Arc<AllocState>>,
    /// A client of another module: the client and the claim's id.
    external: Option<(usize, u64)>,
    /// The claim, until invalidated or put.
    #[pin]
    claim: Mutex<Option<Claim>>,
    /// Held while the consumer is told; `true` once it put the range, after
    /// which it is never told (the header's promise).
    #[pin]
    released: Mutex<bool>,
}

impl Consumer for KernelMem {
    fn consumer_id(&self) -> u64 {
        self.id
    }

    fn invalidate(&self) {
        let claim = self.claim.lock().take();
        if claim.is_some() {
            // The consumer stops its DMA first; the claim then unmaps and
            // unpins.
            let released = self.released.lock();
            if let (false, Some(n)) = (*released, &self.notify) {
                n.call();
            }
        }
        drop(claim);
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
                state <- new_mutex!(ExtState { live: 0, dead: false }),
                idle <- new_condvar!(),
            }),
            GFP_KERNEL,
        )?;
        let ext = Arc::new(External { foreign, shared }, GFP_KERNEL)?;
        peer_mem::clients().register(ext.clone()).inspect_err(|_| {
            pr_warn!(
                "peer-memory client {} refused: the name is in use\n",
                ext.name()
            )
        })?;
        pr_info!("peer-memory client {} registered\n", ext.name());
        Ok(ext)
    }

    fn unregister(ext: Arc<External>) {
        ext.shared.state.lock().dead = true;
        // Claims consumers keep: invalidated as if the client asked, one at
        // a time, with the list unlocked while each consumer is told.
        let key = ext.key();
        loop {
            let sub = {
                let mut subs = subs();
                let Some(i) = subs.iter().position(|s| s.client == key) else {
                    break;
                };
                subs.remove(i)
            };
            if let Ok(s) = sub {
                s.consumer.invalidate();
            }
        }
        // Transient claims (DMA_PROBE) end by themselves.
        let mut st = ext.shared.state.lock();
        while st.live != 0 {
            ext.shared.idle.wait(&mut st);
        }
        drop(st);
        if peer_mem::clients().unregister(ext.name()).is_err() {
            pr_warn!("peer-memory client {} was not registered\n", ext.name());
        }
        pr_info!("peer-memory client {} unregistered\n", ext.name());
    }

    fn invalidate(ext: &External, core_id: u64) -> Result {
        let key = ext.key();
        let sub = {
            let mut subs = subs();
            let i = subs
                .iter()
                .position(|s| s.client == key && s.core_id == core_id)
                .ok_or(ENOENT)?;
            subs.remove(i).map_err(|_| ENOENT)?
        };
        sub.consumer.invalidate();
        Ok(())
    }

    fn get(addr: u64, size: u64, write: bool, notify: Option<Notify>) -> Result<Arc<KernelMem>> {
        let range = UserRange::new(addr, size)?;
        let mut claim = peer_mem::acquire(range)?;
        claim.get_pages(write)?;
        let state = claim.devmem_state();
        let subscribed = state.clone();
        let external = claim.external();
        let mem = Arc::pin_init(
            pin_init!(KernelMem {
                id: NEXT_MEM_ID.fetch_add(1, Relaxed),
                notify,
                state,
                external,
                claim <- new_mutex!(Some(claim)),
                released <- new_mutex!(false),
            }),
            GFP_KERNEL,
        )?;
        if let Some(st) = &subscribed {
            st.subscribe(mem.clone())
                .map_err(|e| if e == EFAULT { estale() } else { e })?;
        }
        if let Some((client, core_id)) = external {
            subs().push(
                Sub {
                    client,
                    core_id,
                    consumer: mem.clone(),
                },
                GFP_KERNEL,
            )?;
        }
        Ok(mem)
    }

    fn dma_map(mem: &KernelMem, dev: &pci::Device) -> Result<KVec<(u64, u64)>> {
        let mut guard = mem.claim.lock();
        let claim = Option::as_mut(&mut *guard).ok_or_else(estale)?;
        if claim.is_mapped() {
            return Err(EBUSY);
        }
        let segs = claim.dma_map(&DmaDevice::of_pci(dev))?;
        let mut out = KVec::with_capacity(segs.len(), GFP_KERNEL)?;
        for s in segs.iter() {
            out.push((s.addr, s.len), GFP_KERNEL)?;
        }
        Ok(out)
    }

    fn dma_unmap(mem: &KernelMem) {
        if let Some(c) = Option::as_mut(&mut *mem.claim.lock()) {
            c.dma_unmap();
        }
    }

    fn page_size(mem: &KernelMem) -> u64 {
        mem.claim.lock().as_ref().map_or(0, |c| c.page_size())
    }

    fn put(mem: Arc<KernelMem>) {
        // Waits for a notification under way: none runs after this.
        *mem.released.lock() = true;
        if let Some(st) = &mem.state {
            st.unsubscribe(mem.id);
        }
        if mem.external.is_some() {
            subs().retain(|s| s.consumer.consumer_id() != mem.id);
        }
        drop(mem.claim.lock().take());
    }
}
