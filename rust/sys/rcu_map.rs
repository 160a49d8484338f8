// SPDX-License-Identifier: GPL-2.0

//! A map from `u64` to `Arc<T>` whose lookups take no lock: an xarray read
//! under RCU, as the kernel's own lookup-mostly tables are (the kernel
//! crate's `XArray` locks for every access).
//!
//! A lookup takes its own reference under the RCU read lock; a removal
//! waits for a grace period before it lets go of the map's, so a lookup
//! that found an entry always finds it alive. Removals are rare (they end a
//! registration) and so pay for the lookups, which are per I/O.

use core::{ffi::c_void, marker::PhantomData};
use kernel::{
    bindings,
    prelude::*,
    sync::{rcu, Arc, ArcBorrow},
    types::Opaque,
};

/// Entries removed together before one grace period lets go of them.
const CLEAR_BATCH: usize = 64;

/// Waits until no RCU reader that started before the call is still running.
fn grace_period() {
    // SAFETY: no lock is held by the callers (it sleeps), and nothing else
    // is required.
    unsafe { bindings::synchronize_rcu_expedited() };
}

/// An xarray of `Arc<T>` read under RCU.
///
/// INVARIANT: `xa` is an initialised xarray; every entry in it is a
/// pointer from `Arc::<T>::into_raw`, whose reference the map owns; a
/// removed entry's reference is dropped only after a grace period.
#[pin_data(PinnedDrop)]
pub(crate) struct RcuMap<T: Send + Sync> {
    #[pin]
    xa: Opaque<bindings::xarray>,
    _owns: PhantomData<Arc<T>>,
}

// SAFETY: the map owns `Arc<T>`s (`Send` for `T: Send + Sync`), and the
// xarray serialises its writers itself.
unsafe impl<T: Send + Sync> Send for RcuMap<T> {}
// SAFETY: shared access only hands out new `Arc<T>`s (`T: Send + Sync`);
// the xarray serialises writers and its readers use RCU.
unsafe impl<T: Send + Sync> Sync for RcuMap<T> {}

/// The xarray's index of `key` (`None` where `unsigned long` is narrower).
fn index(key: u64) -> Option<usize> {
    usize::try_from(key).ok()
}

impl<T: Send + Sync> RcuMap<T> {
    /// An empty map.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            // SAFETY: `xa` is valid memory for an xarray; flags 0 is a
            // plain xarray.
            xa <- Opaque::ffi_init(|xa| unsafe { bindings::xa_init_flags(xa, 0) }),
            _owns: PhantomData,
        })
    }

    /// Adds `value` under `key`: `EBUSY` if the key is taken, `ENOMEM`.
    pub(crate) fn insert(&self, key: u64, value: Arc<T>) -> Result {
        let i = index(key).ok_or(EINVAL)?;
        let p = Arc::into_raw(value).cast_mut().cast::<c_void>();
        // SAFETY: `xa` is valid (type invariant); `__xa_insert` is called
        // with its lock held, which it drops and retakes only to allocate
        // (GFP_KERNEL), as `xa_insert` does.
        let r = unsafe {
            bindings::xa_lock(self.xa.get());
            let r = bindings::__xa_insert(self.xa.get(), i, p, bindings::GFP_KERNEL);
            bindings::xa_unlock(self.xa.get());
            r
        };
        if r != 0 {
            // SAFETY: not stored: the reference from `into_raw` is still ours.
            drop(unsafe { Arc::from_raw(p.cast::<T>()) });
            return Err(Error::from_errno(r));
        }
        // INVARIANT: the entry is an `Arc::into_raw` pointer the map owns.
        Ok(())
    }

    /// The value under `key`, with a reference of its own. Takes no lock.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<T>> {
        let i = index(key)?;
        let _rcu = rcu::read_lock();
        // SAFETY: `xa` is valid (type invariant).
        let p = unsafe { bindings::xa_load(self.xa.get(), i) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is an `Arc::into_raw` pointer (type invariant) whose
        // reference the map drops only after a grace period that this RCU
        // read section delays: the `T` is alive while it is borrowed here.
        let borrowed = unsafe { ArcBorrow::from_raw(p.cast::<T>()) };
        Some(borrowed.into())
    }

    /// Removes and returns the value under `key`, once no lookup can still
    /// be taking a reference to it (waits for an RCU grace period).
    pub(crate) fn remove(&self, key: u64) -> Option<Arc<T>> {
        let i = index(key)?;
        // SAFETY: `xa` is valid (type invariant).
        let p = unsafe { bindings::xa_erase(self.xa.get(), i) };
        if p.is_null() {
            return None;
        }
        grace_period();
        // SAFETY: `p` was an entry (an `Arc::into_raw` pointer the map
        // owned), no longer reachable by lookups after the grace period.
        Some(unsafe { Arc::from_raw(p.cast::<T>()) })
    }

    /// Removes every value, waiting for one grace period per
    /// [`CLEAR_BATCH`] of them before dropping them.
    pub(crate) fn clear(&self) {
        loop {
            let mut batch = [core::ptr::null_mut::<c_void>(); CLEAR_BATCH];
            let mut n = 0;
            let mut i = 0usize;
            while n < CLEAR_BATCH {
                // SAFETY: `xa` is valid (type invariant); `i` is a local.
                let p = unsafe {
                    bindings::xa_find(self.xa.get(), &mut i, usize::MAX, bindings::XA_PRESENT)
                };
                if p.is_null() {
                    break;
                }
                // SAFETY: as above. Another remover may have erased it
                // meanwhile: then it is theirs.
                let p = unsafe { bindings::xa_erase(self.xa.get(), i) };
                if !p.is_null() {
                    batch[n] = p;
                    n += 1;
                }
            }
            if n == 0 {
                return;
            }
            grace_period();
            for p in &batch[..n] {
                // SAFETY: erased above by this call (it owns the map's
                // reference now); the grace period passed.
                drop(unsafe { Arc::from_raw(p.cast::<T>()) });
            }
        }
    }
}

#[pinned_drop]
impl<T: Send + Sync> PinnedDrop for RcuMap<T> {
    fn drop(self: Pin<&mut Self>) {
        let mut i = 0usize;
        loop {
            // SAFETY: `xa` is valid (type invariant); `i` is a local.
            let p = unsafe {
                bindings::xa_find(self.xa.get(), &mut i, usize::MAX, bindings::XA_PRESENT)
            };
            if p.is_null() {
                break;
            }
            // SAFETY: as above.
            unsafe { bindings::xa_erase(self.xa.get(), i) };
            // SAFETY: `p` was an entry the map owned, now erased; with
            // `&mut self` no lookup can be running, so no grace period is
            // needed.
            drop(unsafe { Arc::from_raw(p.cast::<T>()) });
        }
        // SAFETY: `xa` is valid and empty, and not used again.
        unsafe { bindings::xa_destroy(self.xa.get()) };
    }
}
