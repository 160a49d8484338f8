// SPDX-License-Identifier: GPL-2.0

//! A map from `u64` to `Arc<T>` whose lookups take no lock: an xarray read
//! under RCU, as the kernel's own lookup-mostly tables are (the kernel
//! crate's `XArray` locks for every access).
//!
//! A lookup borrows the value inside the RCU read section it runs in; a
//! removal hands the map's reference out as [`Retired`], which waits for a
//! grace period before it lets go of it, so a lookup that found an entry
//! always finds it alive. Removals are rare (they end a registration) and so pay
//! for the lookups, which are per I/O; a caller can wait with its own
//! locks let go (see `Retired`).

use super::opaque_ptr;
use core::{ffi::c_void, marker::PhantomData};
use kernel::{
    bindings,
    prelude::*,
    sync::{rcu, Arc},
    types::Opaque,
};

/// Entries [`RcuMap::clear`] takes out of the xarray per pass.
const CLEAR_BATCH: usize = 64;

/// Waits until no RCU reader that started before the call is still running.
/// Sleeps: callers hold no spinlock and are in no RCU read section.
fn grace_period() {
    // SAFETY: an FFI call with no requirement but a context that may sleep
    // (the callers': see above).
    unsafe { bindings::synchronize_rcu_expedited() };
}

/// A value taken out of an [`RcuMap`]: lookups that found it before may
/// still be borrowing it, so its drop waits for a grace period before it
/// lets go of it.
///
/// INVARIANT: `value` is taken only after a grace period that started
/// after it left the map.
pub(crate) struct Retired<T: Send + Sync> {
    value: Option<Arc<T>>,
}

impl<T: Send + Sync> Retired<T> {
    /// The value, once a grace period that started after it left the map
    /// has passed (the caller waited for it).
    fn passed(mut self) -> Option<Arc<T>> {
        self.value.take()
    }
}

impl<T: Send + Sync> Drop for Retired<T> {
    fn drop(&mut self) {
        if self.value.is_some() {
            grace_period();
            self.value = None;
        }
    }
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
// SAFETY: shared access only lends `&T`s (`T: Send + Sync`);
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
        // (GFP_KERNEL_ACCOUNT: a user's entries, charged to their memory
        // cgroup), as `xa_insert` does.
        let r = unsafe {
            bindings::xa_lock(self.xa.get());
            let r = bindings::__xa_insert(self.xa.get(), i, p, bindings::GFP_KERNEL_ACCOUNT);
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

    /// Runs `f` on the value under `key`, if any, without taking a
    /// reference: `f` runs inside the RCU read section that keeps the value
    /// alive, so it must not sleep (atomic context, as under the kernel
    /// crate's `rcu::Guard`, whose borrows such as
    /// `Revocable::try_access_with_guard` rest on the same rule). Takes no
    /// lock.
    pub(crate) fn with<R>(&self, key: u64, f: impl FnOnce(&T) -> R) -> Option<R> {
        let i = index(key)?;
        let _rcu = rcu::read_lock();
        // SAFETY: `xa` is valid (type invariant).
        let p = unsafe { bindings::xa_load(opaque_ptr(&self.xa), i) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is an `Arc::into_raw` pointer (type invariant) whose
        // reference the map drops only after a grace period that this RCU
        // read section delays: the `T` is alive while `f` borrows it, which
        // ends inside the section.
        Some(f(unsafe { &*p.cast::<T>() }))
    }

    /// Takes the value under `key` out: no lookup finds it any more, and
    /// the [`Retired`] lets go of it once none can still be taking a
    /// reference.
    pub(crate) fn remove(&self, key: u64) -> Option<Retired<T>> {
        let i = index(key)?;
        // SAFETY: `xa` is valid (type invariant).
        let p = unsafe { bindings::xa_erase(self.xa.get(), i) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` was an entry (an `Arc::into_raw` pointer the map
        // owned); erased, its reference is ours.
        let value = unsafe { Arc::from_raw(p.cast::<T>()) };
        // INVARIANT: the grace period `Retired` waits for starts later.
        Some(Retired { value: Some(value) })
    }

    /// Removes every value and lets go of them after one grace period
    /// (after one per [`CLEAR_BATCH`] if there is no memory to hold them
    /// all). Sleeps.
    pub(crate) fn clear(&self) {
        let mut all = KVec::new();
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
            for p in &batch[..n] {
                // SAFETY: erased above by this call, which owns the map's
                // reference now.
                let value = unsafe { Arc::from_raw(p.cast::<T>()) };
                let r = Retired { value: Some(value) };
                // Without memory to keep it, it waited for its own grace
                // period as it dropped.
                let _ = all.push(r, GFP_KERNEL);
            }
            if n < CLEAR_BATCH {
                break;
            }
        }
        if all.is_empty() {
            return;
        }
        grace_period();
        for r in all {
            // The grace period just passed started after every one of them
            // left the map.
            drop(r.passed());
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
