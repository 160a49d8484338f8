// SPDX-License-Identifier: GPL-2.0

//! Work that may sleep, handed from any context to a worker of the module's
//! own unbound workqueue, with what it needs moved into the work item:
//! [`defer`]. Unlike the kernel crate's `Queue::try_spawn`, a failed
//! allocation gives the value back instead of dropping it, so that what it
//! owns (an I/O in flight, whose end must be reported) is never lost.
//!
//! The workqueue is the module's, not a system one: the module's unload
//! destroys it ([`WorkQueue`]'s drop), which waits for every work item, also
//! one that has already reported its I/O's end and is still returning
//! through this module's code.

use core::{
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    alloc::flags::GFP_ATOMIC,
    bindings, impl_has_work, new_work,
    prelude::*,
    workqueue::{Queue, Work, WorkItem},
};

/// The workqueue [`defer`] queues on: set by [`WorkQueue::new`], null again
/// once its drop began.
static QUEUE: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(ptr::null_mut());

/// The module's workqueue, held by the module struct: set up before
/// anything that may [`defer`], destroyed at unload after everything that
/// may.
///
/// # Invariants
///
/// `QUEUE` holds a workqueue `alloc_workqueue()` made, which this token
/// destroys.
pub(crate) struct WorkQueue(());

impl WorkQueue {
    /// Allocates the workqueue; `EBUSY` if there is one already.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: a NUL-terminated name without format directives, so no
        // variadic argument is read. (`alloc_workqueue()` is this function
        // under a macro that only tags the allocation for profiling.)
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(
                c"p2pdirect".as_char_ptr(),
                bindings::wq_flags_WQ_UNBOUND,
                0,
            )
        };
        if wq.is_null() {
            return Err(ENOMEM);
        }
        if QUEUE
            .compare_exchange(ptr::null_mut(), wq, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: made above, and nobody else has seen it.
            unsafe { bindings::destroy_workqueue(wq) };
            return Err(EBUSY);
        }
        // INVARIANT: set above.
        Ok(Self(()))
    }
}

impl Drop for WorkQueue {
    fn drop(&mut self) {
        let wq = QUEUE.swap(ptr::null_mut(), Ordering::AcqRel);
        if !wq.is_null() {
            // SAFETY: the queue `new` made (type invariant), taken out of
            // `QUEUE` above, so no later `defer` queues on it. Destroying
            // it waits for every item queued before, running or not.
            unsafe { bindings::destroy_workqueue(wq) };
        }
    }
}

/// A call of `job.1(job.0)` waiting for a worker.
///
/// # Invariants
///
/// `job` is `Some` from [`defer`] until [`WorkItem::run`] takes it.
#[pin_data]
struct Deferred<T: Send + 'static> {
    #[pin]
    work: Work<Deferred<T>>,
    job: Option<(T, fn(T))>,
}

impl_has_work! {
    impl{T: Send + 'static} HasWork<Self> for Deferred<T> { self.work }
}

impl<T: Send + 'static> WorkItem for Deferred<T> {
    type Pointer = Pin<KBox<Self>>;

    fn run(mut this: Pin<KBox<Self>>) {
        if let Some((value, f)) = this.as_mut().project().job.take() {
            f(value);
        }
    }
}

/// Calls `f(value)` in a worker of the module's workqueue, where it may
/// sleep. Callable in any context (interrupts included: the work item is
/// allocated with `GFP_ATOMIC`). Where the work item cannot be allocated,
/// or the module is unloading (no workqueue), `value` comes back.
pub(crate) fn defer<T: Send + 'static>(value: T, f: fn(T)) -> Result<(), T> {
    let wq = QUEUE.load(Ordering::Acquire);
    if wq.is_null() {
        return Err(value);
    }
    let Ok(mut item) = KBox::pin_init(
        pin_init!(Deferred {
            work <- new_work!("p2pdirect::defer"),
            job: None,
        }),
        GFP_ATOMIC,
    ) else {
        return Err(value);
    };
    *item.as_mut().project().job = Some((value, f));
    // SAFETY: a queue `WorkQueue::new` made, which stays until its drop,
    // and that drop runs only when nothing may call `defer` any more (the
    // module unloads: no file of it is open, so no I/O is in flight).
    let queue = unsafe { Queue::from_raw(wq) };
    queue.enqueue(item);
    Ok(())
}
