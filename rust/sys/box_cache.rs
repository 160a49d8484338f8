// SPDX-License-Identifier: GPL-2.0

//! A bounded cache of spare allocations for boxes made and dropped at a
//! high rate (one per I/O), as io_uring's own `io_alloc_cache` keeps the
//! state of its commands: a box taken from the cache costs a lock and a
//! pop instead of a trip through the allocator, and its memory goes back to
//! the cache when its value is moved out ([`BoxCache::take`]).
//!
//! The cache holds at most the number of spares it was made with; more are
//! freed. It is a plain (not interrupt-safe) spinlock: it must not be used
//! from hard or soft interrupt context.

use core::mem::MaybeUninit;
use kernel::{
    alloc::{AllocError, Flags, KBox, KVec},
    new_spinlock,
    prelude::*,
    sync::SpinLock,
};

/// Spare allocations for `KBox<T>`, at most `max` of them.
///
/// # Invariants
///
/// `spare` never grows past its capacity, reserved when the cache was made
/// (so a push under the lock never allocates).
#[pin_data]
pub(crate) struct BoxCache<T> {
    #[pin]
    spare: SpinLock<KVec<KBox<MaybeUninit<T>>>>,
}

impl<T> BoxCache<T> {
    /// A cache that keeps at most `max` spares (none made yet), its own
    /// array allocated with `flags`.
    pub(crate) fn new(max: usize, flags: Flags) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            spare <- new_spinlock!(KVec::with_capacity(max, flags)?),
        }? Error)
    }

    /// `value` in a box: a spare one if there is one, else a new one.
    pub(crate) fn alloc(&self, value: T, flags: Flags) -> Result<KBox<T>, AllocError> {
        let spare = self.spare.lock().pop();
        match spare {
            Some(b) => Ok(KBox::write(b, value)),
            None => KBox::new(value, flags),
        }
    }

    /// Keeps `memory` as a spare, or frees it if the cache is full.
    pub(crate) fn keep(&self, memory: Spare<T>) {
        let full = self.spare.lock().push_within_capacity(memory.0).err();
        // A full cache: the memory is freed here, after the lock went.
        drop(full);
    }
}

/// The memory of a box whose value was moved out ([`split`]): given to a
/// [`BoxCache`] to keep, or freed when dropped.
pub(crate) struct Spare<T>(KBox<MaybeUninit<T>>);

/// The value of `b`, and its memory for a [`BoxCache`] to keep.
pub(crate) fn split<T>(b: KBox<T>) -> (T, Spare<T>) {
    let raw = KBox::into_raw(b);
    // SAFETY: `raw` came from `into_raw`: valid, aligned, initialised and
    // owned by us; the value is read out exactly once, and the allocation
    // is treated as uninitialised from here on.
    let value = unsafe { raw.read() };
    // SAFETY: the same allocation, of the same allocator; `MaybeUninit<T>`
    // has `T`'s layout, and an uninitialised one needs no drop.
    let memory = unsafe { KBox::from_raw(raw.cast::<MaybeUninit<T>>()) };
    (value, Spare(memory))
}

#[kernel::macros::kunit_tests(p2pdirect_box_cache)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// Counts its drops.
    struct Counted<'a>(&'a AtomicUsize, u64);

    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn spares_are_reused_and_bounded() {
        let drops = AtomicUsize::new(0);
        let cache =
            KBox::pin_init(BoxCache::<Counted<'_>>::new(2, GFP_KERNEL), GFP_KERNEL).unwrap();
        let boxes = [1, 2, 3].map(|i| cache.alloc(Counted(&drops, i), GFP_KERNEL).unwrap());
        let addrs = boxes.each_ref().map(|b| core::ptr::from_ref(&**b) as usize);
        for (i, b) in (1..).zip(boxes) {
            let (value, spare) = split(b);
            // The value moved out whole: nothing dropped by the split, and
            // the spare's memory holds no second copy to drop.
            assert_eq!(drops.load(Relaxed), i - 1);
            assert_eq!(value.1, i as u64);
            drop(value);
            cache.keep(spare);
            assert_eq!(drops.load(Relaxed), i);
        }
        // Each value dropped once; two spares kept, the third freed.
        assert_eq!(drops.load(Relaxed), 3);
        assert_eq!(cache.spare.lock().len(), 2);
        // The next boxes are the kept memory, then new memory.
        let a = cache.alloc(Counted(&drops, 4), GFP_KERNEL).unwrap();
        let b = cache.alloc(Counted(&drops, 5), GFP_KERNEL).unwrap();
        assert!(addrs.contains(&(core::ptr::from_ref(&*a) as usize)));
        assert!(addrs.contains(&(core::ptr::from_ref(&*b) as usize)));
        assert_eq!(cache.spare.lock().len(), 0);
        let c = cache.alloc(Counted(&drops, 6), GFP_KERNEL).unwrap();
        assert_eq!((a.1, b.1, c.1), (4, 5, 6));
        drop((a, b, c));
        assert_eq!(drops.load(Relaxed), 6);
    }
}
