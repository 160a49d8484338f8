// SPDX-License-Identifier: GPL-2.0

//! Pages held for I/O: the pinned pages of a user range (P2PDMA memory
//! allowed), or zeroed pages of host memory allocated here, shared by
//! reference count.
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h)
//!
//! - [`Pages::pin_user`]: `pin_user_pages_fast(FOLL_PCI_P2PDMA)` over a
//!   byte range of the calling process. Not `FOLL_LONGTERM` (GUP refuses it
//!   with `FOLL_PCI_P2PDMA`, so that a device's pgmap can always be
//!   unplugged): long-lived holders drop their pins when told to.
//! - [`Pages::alloc_zeroed`]: whole pages of host memory.
//! - [`Pages::clone`]: another reference; the last one unpins (or frees) the
//!   pages in any context, as the block layer's direct I/O unpins in bio
//!   completion.
//! - [`Pages::reachable_by`]: whether a PCI function can DMA to every page,
//!   found by a test mapping of each P2PDMA provider the range touches,
//!   remembered per function.
//!
//! The first two charge what they allocate (the record, the page array,
//! the host pages) to the calling task's memory cgroup: a user decides how
//! long they live. The pages record whether a device may write into them
//! (see `BioPages::writable`).

use core::{
    ptr::NonNull,
    sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering},
};
use kernel::{
    bindings,
    ffi::c_void,
    page::{BorrowedPage, PAGE_SIZE},
    pci,
    prelude::*,
    sync::Refcount,
};

use super::{
    bio::{to_page_end, BioPages, DropInAnyContext},
    c,
    pci_p2pdma::{bar_owner, slot_key, LocatedPci},
};

const PAGE: u64 = PAGE_SIZE as u64;

/// How the pages were taken, and so how they are given back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `pin_user_pages_fast`: unpinned.
    User,
    /// `alloc_page`: freed.
    Allocated,
}

/// The shared state behind [`Pages`].
///
/// # Invariants
///
/// - `pages[..]` holds `pages.len()` valid page pointers, each pinned
///   (`Source::User`) or allocated (`Source::Allocated`) by this value, and
///   given back only when the last reference goes.
/// - `offset < PAGE_SIZE` and `offset + len <= pages.len() * PAGE_SIZE`.
/// - `writable`: the pages were pinned for writing (`FOLL_WRITE`, which
///   breaks copy-on-write sharing and refuses read-only mappings) or
///   allocated here, so a device may write into them.
struct Inner {
    refs: Refcount,
    pages: KVVec<*mut bindings::page>,
    offset: u32,
    len: u64,
    source: Source,
    writable: bool,
    /// PCI address of the function whose BAR holds the first page, once
    /// looked up (0: not yet, or host memory).
    provider: AtomicU32,
    /// The last function known to reach every page.
    reach_ok: ReachCache,
    /// Whether the pages are one run ([`Run`]), once looked at.
    run: AtomicU8,
}

/// `Inner::run`: whether every page is P2PDMA memory of one `dev_pagemap`,
/// each `struct page` and each physical page following the one before, on a
/// kernel whose `bio_add_page` merges such pages into one multi-page vector
/// (not with KMSAN, nor under Xen).
#[repr(u8)]
enum Run {
    Unknown = 0,
    One = 1,
    Several = 2,
}

/// Remembers the last PCI function (by [`slot_key`]) known to reach a set
/// of pages, so a repeated I/O from the same device skips the test maps.
/// Racing stores keep one of the keys, each of which was verified.
pub(crate) struct ReachCache(AtomicU64);

impl ReachCache {
    /// Knows no function yet.
    pub(crate) const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Whether the function with key `key` was remembered.
    pub(crate) fn knows(&self, key: u64) -> bool {
        // The stored value is the key plus one: 0 is "none", and no key
        // equals it (a key has at most 48 bits).
        self.0.load(Ordering::Relaxed) == key.wrapping_add(1)
    }

    /// Remembers the function with key `key` (forgetting the previous one).
    pub(crate) fn remember(&self, key: u64) {
        self.0.store(key.wrapping_add(1), Ordering::Relaxed);
    }
}

/// A reference to pages held for I/O.
///
/// # Invariants
///
/// `inner` points to an [`Inner`] allocated by [`Pages::from_inner`] on
/// which this value owns one reference (`Inner::refs`); the last reference
/// frees it.
pub(crate) struct Pages {
    inner: NonNull<Inner>,
}

// SAFETY: the pages are kernel memory held by reference count; `Inner` is
// only read after construction (its atomics aside), and the last reference
// may go on any thread.
unsafe impl Send for Pages {}
// SAFETY: as above: shared access only reads or uses atomics.
unsafe impl Sync for Pages {}

impl Inner {
    /// A record with one reference, nothing looked up yet.
    fn new(
        pages: KVVec<*mut bindings::page>,
        offset: u32,
        len: u64,
        source: Source,
        writable: bool,
    ) -> Self {
        Self {
            refs: Refcount::new(1),
            pages,
            offset,
            len,
            source,
            writable,
            provider: AtomicU32::new(0),
            reach_ok: ReachCache::new(),
            run: AtomicU8::new(Run::Unknown as u8),
        }
    }
}

impl Pages {
    fn from_inner(inner: Inner) -> Result<Self> {
        let inner = KBox::new(inner, GFP_KERNEL_ACCOUNT)?;
        // INVARIANT: a new allocation with one reference, owned here.
        Ok(Self {
            inner: NonNull::from(KBox::leak(inner)),
        })
    }

    fn inner(&self) -> &Inner {
        // SAFETY: the type invariant keeps `Inner` alive while `self` is.
        unsafe { self.inner.as_ref() }
    }

    /// Pins `[addr, addr + len)` of the calling process, for writing into
    /// when `write`; P2PDMA pages are allowed. `EINVAL` for an empty or
    /// wrapping range, `EFAULT` if part of it is not mapped.
    pub(crate) fn pin_user(addr: u64, len: u64, write: bool) -> Result<Self> {
        let end = addr.checked_add(len).filter(|_| len > 0).ok_or(EINVAL)?;
        let first = addr & !(PAGE - 1);
        let npages = usize::try_from(end.div_ceil(PAGE) - first / PAGE).map_err(|_| EINVAL)?;
        let nr = i32::try_from(npages).map_err(|_| EINVAL)?;
        // The page array must stay below what kvmalloc takes without a
        // warning (`INT_MAX` bytes): a range that long cannot be pinned.
        if npages > i32::MAX as usize / core::mem::size_of::<*mut bindings::page>() {
            return Err(ENOMEM);
        }
        let mut pages = KVVec::<*mut bindings::page>::with_capacity(npages, GFP_KERNEL_ACCOUNT)?;
        let mut gup = bindings::FOLL_PCI_P2PDMA;
        if write {
            gup |= bindings::FOLL_WRITE;
        }
        // SAFETY: `pages` has room for `npages` pointers; GUP pins pages of
        // the current process's address space, which it locks itself.
        let pinned =
            unsafe { bindings::pin_user_pages_fast(first as usize, nr, gup, pages.as_mut_ptr()) };
        let taken = usize::try_from(pinned).unwrap_or(0).min(npages);
        // SAFETY: GUP filled the first `taken` entries.
        unsafe { pages.inc_len(taken) };
        if pinned < 0 || taken != npages {
            // SAFETY: the `taken` pages were pinned just above.
            unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), taken) };
            return Err(if pinned < 0 {
                Error::from_errno(pinned as i32)
            } else {
                EFAULT
            });
        }
        // INVARIANT: every page pinned; the range lies in them.
        Self::from_inner(Inner::new(
            pages,
            (addr - first) as u32,
            len,
            Source::User,
            write,
        ))
    }

    /// `len` bytes of zeroed host memory, page by page.
    pub(crate) fn alloc_zeroed(len: u64) -> Result<Self> {
        if len == 0 {
            return Err(EINVAL);
        }
        let npages = usize::try_from(len.div_ceil(PAGE)).map_err(|_| ENOMEM)?;
        let mut pages = KVVec::<*mut bindings::page>::with_capacity(npages, GFP_KERNEL_ACCOUNT)?;
        let mut this = Inner::new(KVVec::new(), 0, len, Source::Allocated, true);
        for _ in 0..npages {
            // SAFETY: plain page allocation.
            let page = unsafe {
                bindings::alloc_pages(bindings::GFP_KERNEL_ACCOUNT | bindings::__GFP_ZERO, 0)
            };
            if page.is_null() {
                this.pages = pages;
                // `Inner`'s drop frees the pages taken so far.
                return Err(ENOMEM);
            }
            if pages.push_within_capacity(page).is_err() {
                // Unreachable (the capacity was reserved); never leak.
                // SAFETY: allocated just above, not stored anywhere.
                unsafe { bindings::__free_pages(page, 0) };
                this.pages = pages;
                return Err(ENOMEM);
            }
        }
        this.pages = pages;
        Self::from_inner(this)
    }

    /// Bytes of the range.
    pub(crate) fn len(&self) -> u64 {
        self.inner().len
    }

    /// Offset of the range in its first page.
    pub(crate) fn page_offset(&self) -> u64 {
        u64::from(self.inner().offset)
    }

    /// The page holding byte `off` of the range and that byte's offset in it.
    fn page_and_offset(&self, off: u64) -> Option<(*mut bindings::page, u32)> {
        let inner = self.inner();
        if off >= inner.len {
            return None;
        }
        let abs = u64::from(inner.offset) + off;
        let page = *inner.pages.get(usize::try_from(abs / PAGE).ok()?)?;
        Some((page, (abs % PAGE) as u32))
    }

    /// [`BioPages::contiguous`] at byte `off` of the range, `in_page` bytes
    /// into its page.
    fn vector_len(&self, off: u64, in_page: u32, max: u64) -> u64 {
        if self.one_run() {
            (self.inner().len - off).min(max)
        } else {
            to_page_end(self, off, in_page, max)
        }
    }

    /// Whether the pages are one run (see [`Run`]): looked at once.
    fn one_run(&self) -> bool {
        let inner = self.inner();
        let known = inner.run.load(Ordering::Relaxed);
        if known != Run::Unknown as u8 {
            return known == Run::One as u8;
        }
        let pages = &inner.pages[..];
        // SAFETY: reads configuration only.
        let spans = unsafe { c::p2pdirect_bvec_spans_pages() };
        let one = spans
            && pages.first().is_some_and(|&first| {
                // SAFETY: each page is held (type invariant of `Inner`); a
                // P2PDMA page has a pgmap, and only those are asked for it.
                unsafe {
                    c::p2pdirect_page_is_p2pdma(first)
                        && pages.windows(2).all(|w| {
                            c::p2pdirect_page_is_p2pdma(w[1])
                                && w[1] == w[0].wrapping_add(1)
                                && c::p2pdirect_page_phys(w[1])
                                    == c::p2pdirect_page_phys(w[0]) + PAGE
                                && c::p2pdirect_page_pgmap(w[1]) == c::p2pdirect_page_pgmap(first)
                        })
                }
            });
        let run = if one { Run::One } else { Run::Several };
        inner.run.store(run as u8, Ordering::Relaxed);
        one
    }

    /// Whether every page is P2PDMA memory.
    pub(crate) fn is_p2pdma(&self) -> bool {
        // SAFETY: each page is held (type invariant of `Inner`).
        self.inner()
            .pages
            .iter()
            .all(|&p| unsafe { c::p2pdirect_page_is_p2pdma(p) })
    }

    /// The most pins any of the pages holds, counting every holder's: its
    /// reference count over `GUP_PIN_COUNTING_BIAS` (a few references that
    /// are not pins, a mapping's, count a fraction). For order-0 pages, as
    /// P2PDMA pages are: a large folio keeps its count in its head page.
    pub(crate) fn most_pins(&self) -> u32 {
        self.inner()
            .pages
            .iter()
            // SAFETY: each page is held (type invariant of `Inner`), so its
            // `struct page` stays; the count is read atomically, as
            // `page_ref_count()` reads it.
            .map(|&p| unsafe { AtomicI32::from_ptr(&raw mut (*p)._refcount.counter) })
            .map(|count| count.load(Ordering::Relaxed))
            // A negative count has overflowed already: as many as can be.
            .map(|refs| u32::try_from(refs).unwrap_or(u32::MAX) / bindings::GUP_PIN_COUNTING_BIAS)
            .max()
            .unwrap_or(0)
    }

    /// The PCI function whose BAR holds the pages, as `PciFunction::id`
    /// names it (its `struct pci_dev`), if every page is P2PDMA memory of
    /// one region (one pgmap: a driver may add its BAR in several) and that
    /// function is found; `None` otherwise. The pins keep the pgmap, so the
    /// function's driver, and the function itself.
    pub(crate) fn single_provider_id(&self) -> Option<usize> {
        let pages = &self.inner().pages[..];
        let &first = pages.first()?;
        // SAFETY: each page is held (type invariant of `Inner`); a P2PDMA
        // page has a pgmap, and only those are asked for it.
        let one = unsafe {
            c::p2pdirect_page_is_p2pdma(first)
                && pages.iter().all(|&p| {
                    c::p2pdirect_page_is_p2pdma(p)
                        && c::p2pdirect_page_pgmap(p) == c::p2pdirect_page_pgmap(first)
                })
        };
        if !one {
            return None;
        }
        // SAFETY: the page is held (type invariant of `Inner`).
        let owner = bar_owner(unsafe { c::p2pdirect_page_phys(first) })?;
        // What `provider` would look up again (the same first page).
        self.inner()
            .provider
            .store(super::pci_p2pdma::pci_addr(&owner), Ordering::Relaxed);
        Some(core::ptr::from_ref::<pci::Device>(&owner) as usize)
    }

    /// Whether every page lies in physical memory `[phys, phys + len)`
    /// (false for allocated pages).
    pub(crate) fn all_within(&self, phys: u64, len: u64) -> bool {
        let inner = self.inner();
        inner.source == Source::User
            && inner.pages.iter().all(|&p| {
                // SAFETY: the page is held (type invariant of `Inner`).
                let at = unsafe { c::p2pdirect_page_phys(p) };
                at >= phys && at - phys < len
            })
    }

    /// The PCI address (`P2PDIRECT_PCI_ADDR()`) of the function whose memory
    /// BAR holds the first page; 0 for host memory.
    pub(crate) fn provider(&self) -> u32 {
        let inner = self.inner();
        let cached = inner.provider.load(Ordering::Relaxed);
        if cached != 0 || inner.source == Source::Allocated {
            return cached;
        }
        let Some(&first) = inner.pages.first() else {
            return 0;
        };
        // SAFETY: the page is held (type invariant of `Inner`).
        let phys = unsafe { c::p2pdirect_page_phys(first) };
        let found = bar_owner(phys).map_or(0, |owner| super::pci_p2pdma::pci_addr(&owner));
        inner.provider.store(found, Ordering::Relaxed);
        found
    }

    /// `Ok` if `dev` can DMA to every page; else `Err` with the PCI address
    /// of the provider it cannot reach (0 if the page is not device memory
    /// or its owner is unknown).
    ///
    /// Each P2PDMA provider the range touches is test-mapped once for `dev`.
    /// The pages never change, so the answer is remembered for the last
    /// function that passed (by its place in the topology, not its struct).
    pub(crate) fn reachable_by(&self, dev: &pci::Device) -> core::result::Result<(), u32> {
        self.reachable_by_key(dev, slot_key(dev))
    }

    /// [`Pages::reachable_by`] for a function whose key is known already.
    pub(crate) fn reachable_by_located(&self, dev: &LocatedPci) -> core::result::Result<(), u32> {
        self.reachable_by_key(dev.pci(), dev.key())
    }

    /// `key` is `slot_key(dev)`.
    fn reachable_by_key(&self, dev: &pci::Device, key: u64) -> core::result::Result<(), u32> {
        let inner = self.inner();
        if inner.reach_ok.knows(key) {
            return Ok(());
        }
        let mut last: *const c_void = core::ptr::null();
        for &page in inner.pages.iter() {
            // SAFETY: the page is held (type invariant of `Inner`).
            if !unsafe { c::p2pdirect_page_is_p2pdma(page) } {
                return Err(0);
            }
            // SAFETY: as above; a P2PDMA page has a pgmap.
            let pgmap = unsafe { c::p2pdirect_page_pgmap(page) };
            if pgmap == last {
                continue;
            }
            last = pgmap;
            // SAFETY: the page is held while `self` lives.
            if unsafe { super::dma::test_map_page(dev.as_ref(), page) }.is_err() {
                // SAFETY: as above.
                let phys = unsafe { c::p2pdirect_page_phys(page) };
                return Err(bar_owner(phys).map_or(0, |o| super::pci_p2pdma::pci_addr(&o)));
            }
        }
        inner.reach_ok.remember(key);
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_off` to `self` at `off` with
    /// the CPU; `EINVAL` if a range is not inside its pages.
    ///
    /// The caller keeps the destination bytes from being accessed meanwhile
    /// (the I/O that owns them).
    pub(crate) fn copy_from(&self, off: u64, src: &Pages, src_off: u64, len: u64) -> Result {
        let fits = |p: &Pages, o: u64| o.checked_add(len).is_some_and(|e| e <= p.len());
        if !fits(self, off) || !fits(src, src_off) {
            return Err(EINVAL);
        }
        let mut done = 0u64;
        while done < len {
            let (dp, doff) = self.page_and_offset(off + done).ok_or(EINVAL)?;
            let (sp, soff) = src.page_and_offset(src_off + done).ok_or(EINVAL)?;
            let n = (PAGE - u64::from(doff))
                .min(PAGE - u64::from(soff))
                .min(len - done);
            // SAFETY: both pages are held; each is mapped for the copy and
            // unmapped in reverse order; `doff + n` and `soff + n` stay
            // within their pages (n is bounded by both page ends). The two
            // ranges may be the same bytes (`src` may pin the same pages):
            // `copy` allows overlap.
            unsafe {
                let d = bindings::kmap_local_page(dp).cast::<u8>();
                let s = bindings::kmap_local_page(sp).cast::<u8>();
                core::ptr::copy(s.add(soff as usize), d.add(doff as usize), n as usize);
                bindings::kunmap_local(s.cast());
                bindings::kunmap_local(d.cast());
            }
            done += n;
        }
        Ok(())
    }

    /// The page pointers (for a scatter-gather table), the offset of the
    /// range in the first page, and its length.
    pub(crate) fn raw_parts(&self) -> (&[*mut bindings::page], u32, u64) {
        let inner = self.inner();
        (&inner.pages, inner.offset, inner.len)
    }
}

impl Clone for Pages {
    /// Another reference to the same pages.
    fn clone(&self) -> Self {
        self.inner().refs.inc();
        // INVARIANT: the reference taken just above.
        Self { inner: self.inner }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if !self.inner().refs.dec_and_test() {
            return;
        }
        // SAFETY: the last reference: nothing else points to `Inner`, which
        // `from_inner` allocated as a `KBox`.
        let inner = unsafe { KBox::from_raw(self.inner.as_ptr()) };
        drop(inner);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        match self.source {
            // SAFETY: the pages were pinned by this value (type invariant).
            Source::User => unsafe {
                bindings::unpin_user_pages(self.pages.as_mut_ptr(), self.pages.len())
            },
            Source::Allocated => {
                for &p in self.pages.iter() {
                    // SAFETY: allocated with `alloc_pages(.., 0)` by this value.
                    unsafe { bindings::__free_pages(p, 0) };
                }
            }
        }
        // The array may be vmalloc'ed, and the last reference may go in a
        // bio's completion (interrupts off on NVMe's timeout path), where
        // vfree() must not run: a vmalloc'ed array goes to kvfree_rcu, which
        // frees it from a work item, its first bytes (no longer needed)
        // serving as the rcu_head. kmalloc'ed ones are freed here.
        let pages = core::mem::take(&mut self.pages);
        let (ptr, _, capacity) = pages.into_raw_parts();
        if capacity == 0 {
            return;
        }
        let ptr = ptr.cast::<c_void>();
        // SAFETY: `ptr` came from a `KVVec`, so from kmalloc or vmalloc, and
        // is freed once. A vmalloc'ed array is larger than a page, so it
        // holds the `rcu_head` placed at its start; nothing reads the array
        // any more.
        unsafe {
            if bindings::is_vmalloc_addr(ptr) {
                bindings::kvfree_call_rcu(ptr.cast(), ptr);
            } else {
                bindings::kfree(ptr);
            }
        }
    }
}

// SAFETY: the last reference unpins (`unpin_user_pages`, what direct I/O
// does in bio completion) or frees the pages and frees the array with
// `kfree`/`kvfree_call_rcu`: no sleep, only interrupt-safe locks.
unsafe impl DropInAnyContext for Pages {}

// SAFETY: the pages are pinned or owned while `self` lives; the lookups
// stay inside the range and the lengths inside its runs (`vector_len`).
unsafe impl BioPages for Pages {
    fn len(&self) -> u64 {
        Pages::len(self)
    }

    fn writable(&self) -> bool {
        self.inner().writable
    }

    fn contiguous(&self, off: u64, max: u64) -> u64 {
        self.page_and_offset(off)
            .map_or(0, |(_, in_page)| self.vector_len(off, in_page, max))
    }

    fn page_at(&self, off: u64) -> Option<(BorrowedPage<'_>, u32)> {
        let (page, in_page) = self.page_and_offset(off)?;
        // SAFETY: the page is held while `self` lives, so for as long as the
        // borrow.
        Some((
            unsafe { BorrowedPage::from_raw(NonNull::new(page)?) },
            in_page,
        ))
    }

    fn vector(&self, off: u64, max: u64) -> Option<(BorrowedPage<'_>, u32, u64)> {
        let (page, in_page) = self.page_and_offset(off)?;
        let n = self.vector_len(off, in_page, max);
        if n == 0 {
            return None;
        }
        // SAFETY: as in `page_at`.
        let page = unsafe { BorrowedPage::from_raw(NonNull::new(page)?) };
        Some((page, in_page, n))
    }
}

/// Whether the page at user address `addr` of the calling process is
/// P2PDMA memory. Only a mapping of pages is pinned to find out: nothing
/// mapped, pure PFNs or I/O memory (another driver's, which its own
/// peer-memory client may claim) and a mapping with no access are not
/// P2PDMA pages, and are not faulted in.
pub(crate) fn user_addr_is_p2pdma(addr: u64) -> Result<bool> {
    if super::vma::user_mapping(addr) != super::vma::UserMapping::Pages {
        return Ok(false);
    }
    match Pages::pin_user(addr & !(PAGE - 1), 1, false) {
        Ok(pages) => Ok(pages.is_p2pdma()),
        // Unmapped or changed since the look: not P2PDMA pages either.
        Err(e) if e == EFAULT => Ok(false),
        Err(e) => Err(e),
    }
}

#[kernel::macros::kunit_tests(p2pdirect_gup)]
mod tests {
    use super::*;
    use crate::sys::pci_p2pdma::location_key;

    #[test]
    fn host_pages_go_into_bios_page_by_page() {
        // Allocated pages are no P2PDMA run: a vector ends at its page's end.
        let p = Pages::alloc_zeroed(3 * PAGE).unwrap();
        assert!(!p.one_run());
        assert_eq!(p.contiguous(0, 3 * PAGE), PAGE);
        assert_eq!(p.contiguous(PAGE + 512, 3 * PAGE), PAGE - 512);
        assert_eq!(p.contiguous(0, 1024), 1024);
        assert_eq!(p.contiguous(3 * PAGE, PAGE), 0);
        // A vector is the page and offset `page_at` gives, as long as
        // `contiguous` says; nothing outside the range or for no bytes.
        let v = |off, max| p.vector(off, max).map(|(_, in_page, n)| (in_page, n));
        assert_eq!(v(PAGE + 512, 3 * PAGE), Some((512, PAGE - 512)));
        assert_eq!(v(0, 1024), Some((0, 1024)));
        assert_eq!(v(3 * PAGE, PAGE), None);
        assert_eq!(v(0, 0), None);
        // Never past the range's end, even inside its last page.
        let q = Pages::alloc_zeroed(PAGE + 512).unwrap();
        assert_eq!(q.contiguous(PAGE, PAGE), 512);
    }

    #[test]
    fn device_writes_only_into_pages_pinned_for_writing() {
        use crate::sys::bio::Op;
        // Host pages of its own: any way.
        let p = Pages::alloc_zeroed(PAGE).unwrap();
        assert!(Op::Read.check(&p).is_ok());
        assert!(Op::Write.check(&p).is_ok());
        // Pages not pinned for writing (no page needed to show it): out of
        // them only.
        let ro = Pages::from_inner(Inner::new(KVVec::new(), 0, 0, Source::User, false)).unwrap();
        assert_eq!(Op::Read.check(&ro).err(), Some(EFAULT));
        assert!(Op::Write.check(&ro).is_ok());
        assert!(Op::WriteFua.check(&ro).is_ok());
    }

    #[test]
    fn reach_cache_remembers_the_last_function() {
        let c = ReachCache::new();
        let a = location_key(0, 1, 0);
        let b = location_key(0, 2, 0);
        assert!(!c.knows(a));
        // Key 0 (segment 0, bus 0, devfn 0) is a real function, not "none".
        assert!(!c.knows(location_key(0, 0, 0)));
        c.remember(a);
        assert!(c.knows(a));
        assert!(!c.knows(b));
        c.remember(b);
        assert!(c.knows(b));
        assert!(!c.knows(a));
        c.remember(location_key(0, 0, 0));
        assert!(c.knows(location_key(0, 0, 0)));
    }

    #[test]
    fn keys_differ_across_segments_past_0xffff() {
        // P2PDIRECT_PCI_ADDR() keeps 16 bits of segment; the cache's key
        // keeps them all, so these two functions never share a verdict.
        let low = location_key(0x0001, 0x02, 0x08);
        let high = location_key(0x1_0001, 0x02, 0x08);
        assert!(low != high);
        assert!(location_key(0, 1, 0) != location_key(0, 0, 1));
        assert_eq!(
            location_key(0x1_0000, 0xff, 0xff),
            (0x1_0000 << 16) | 0xffff
        );
        let c = ReachCache::new();
        c.remember(low);
        assert!(!c.knows(high));
    }
}
