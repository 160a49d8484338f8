// SPDX-License-Identifier: GPL-2.0

//! The kernel API of include/linux/p2pdirect.h: peer-memory clients of other
//! modules (OFED's `peer_memory_client` callback table) as safe types, and
//! the GPL entry points, which [`kernel_api!`] generates for the type that
//! implements [`KernelApi`].
//!
//! C header: [`include/linux/p2pdirect.h`](../../include/linux/p2pdirect.h)

use core::{
    ptr::NonNull,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};
use kernel::{
    bindings, device,
    error::to_result,
    ffi::{c_int, c_void},
    pci,
    prelude::*,
    scatterlist::SGTable,
    str::{CStr, CString},
    sync::{aref::ARef, Arc, ArcBorrow},
    types::ForeignOwnable,
};

use super::{c, pci_p2pdma::raw_device};

/// A client table another module registered.
///
/// # Invariants
///
/// `table` points to the caller's `struct p2pdirect_peer_memory_client`,
/// which its module keeps valid until its unregister call returned. That
/// call returns once every [`ForeignCtx`] is gone and no call into the
/// table runs (the implementor of [`KernelApi::unregister`] marks the
/// client dead first and waits for them). A `ForeignClient` itself may
/// outlive it (a snapshot of the registry holds one): the implementor calls
/// [`ForeignClient::acquire`] only after it found the client not dead and
/// counted the call, so that the wait covers it; nothing else reads the
/// table.
pub(crate) struct ForeignClient {
    table: NonNull<c::p2pdirect_peer_memory_client>,
    name: CString,
}

// SAFETY: the table is read-only; its callbacks may be called from any
// thread (OFED's contract).
unsafe impl Send for ForeignClient {}
// SAFETY: as above.
unsafe impl Sync for ForeignClient {}

impl ForeignClient {
    fn table(&self) -> &c::p2pdirect_peer_memory_client {
        // SAFETY: valid by the type invariant.
        unsafe { self.table.as_ref() }
    }

    /// The client's name.
    pub(crate) fn name(&self) -> &CStr {
        &self.name
    }

    /// Asks the client whether it owns `[addr, addr + size)` of the calling
    /// process.
    pub(crate) fn acquire(self: &Arc<Self>, addr: u64, size: u64) -> Result<Option<ForeignCtx>> {
        let (Ok(a), Ok(s)) = (usize::try_from(addr), usize::try_from(size)) else {
            return Ok(None);
        };
        let Some(acquire) = self.table().acquire else {
            return Ok(None);
        };
        let mut ctx: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid table's callback (type invariant), with the
        // arguments OFED defines; `ctx` is our local.
        let r = unsafe { acquire(a, s, core::ptr::null_mut(), core::ptr::null_mut(), &mut ctx) };
        match r {
            0 => Ok(None),
            // OFED's clients return 1; any other positive value claims too.
            1.. => {
                // INVARIANT: the client's context, released by `Drop` (also
                // if the table's storage cannot be had).
                let mut fc = ForeignCtx {
                    client: self.clone(),
                    ctx,
                    addr: a,
                    size: s,
                    sg: None,
                    mapped: None,
                };
                fc.sg = Some(KBox::new(
                    bindings::sg_table::default(),
                    GFP_KERNEL_ACCOUNT,
                )?);
                Ok(Some(fc))
            }
            e => Err(Error::from_errno(e)),
        }
    }
}

/// One claim of a foreign client: its `client_context` and the scatter
/// table it fills.
///
/// # Invariants
///
/// `ctx` came from the client's `acquire` and is released only by `Drop`;
/// `sg` holds what `get_pages` put there until `put_pages`.
pub(crate) struct ForeignCtx {
    client: Arc<ForeignClient>,
    ctx: *mut c_void,
    addr: usize,
    size: usize,
    /// The scatter table (`None` only while being built).
    sg: Option<KBox<bindings::sg_table>>,
    /// The device mapped for, while mapped.
    mapped: Option<ARef<pci::Device>>,
}

// SAFETY: the context is the client's, usable from any thread (OFED's
// contract); the table is ours.
unsafe impl Send for ForeignCtx {}

impl ForeignCtx {
    fn sg(&mut self) -> *mut bindings::sg_table {
        self.sg
            .as_deref_mut()
            .map_or(core::ptr::null_mut(), core::ptr::from_mut)
    }

    /// Pins the range; `core_context` names the claim in the client's
    /// invalidation call.
    pub(crate) fn get_pages(&mut self, write: bool, core_context: u64) -> Result {
        let f = self.client.table().get_pages.ok_or(EINVAL)?;
        let sg = self.sg();
        // SAFETY: the client's callback on its own context (type
        // invariants); `sg` is zeroed storage we own.
        to_result(unsafe {
            f(
                self.addr,
                self.size,
                c_int::from(write),
                1,
                sg,
                self.ctx,
                core_context,
            )
        })
    }

    /// The page size of the memory.
    pub(crate) fn page_size(&self) -> u64 {
        match self.client.table().get_page_size {
            // SAFETY: the client's callback on its own context.
            Some(f) => u64::try_from(unsafe { f(self.ctx) }).unwrap_or(0),
            None => kernel::page::PAGE_SIZE as u64,
        }
    }

    /// Maps the pinned range for `dev`: its DMA segments (address, length),
    /// covering the range's bytes exactly.
    ///
    /// A client maps whole pages of its page size, from the one holding the
    /// range's first byte to the one holding its last (OFED's contract:
    /// nvidia-peermem's entries are whole 64 KiB GPU pages); OFED's core
    /// trims its entries to the range (`fix_peer_sgls`), and so does this:
    /// segments that cover exactly those pages are cut to the range, and
    /// segments of any other total length are given as the client made
    /// them (a client that maps the range's bytes only).
    pub(crate) fn dma_map(&mut self, dev: &pci::Device) -> Result<KVVec<(u64, u64)>> {
        if self.mapped.is_some() {
            return Err(EBUSY);
        }
        let f = self.client.table().dma_map.ok_or(EINVAL)?;
        let raw_dev = raw_device(dev);
        let sg = self.sg();
        let mut nmap: c_int = 0;
        // SAFETY: the client's callback on its own context and table; the
        // device is valid (a reference is held by the caller).
        to_result(unsafe { f(sg, self.ctx, raw_dev, 0, &mut nmap) })?;
        self.mapped = Some(dev.into());
        let n = usize::try_from(nmap).unwrap_or(0);
        let (Ok(mut raw), Ok(mut out)) = (
            KVVec::with_capacity(n, GFP_KERNEL),
            KVVec::with_capacity(n, GFP_KERNEL),
        ) else {
            self.dma_unmap();
            return Err(ENOMEM);
        };
        // SAFETY: the client mapped the table; it is not changed until
        // `dma_unmap`, which needs `&mut self`.
        let table = unsafe { SGTable::from_raw(sg) };
        for e in table.iter().take(n) {
            // Within the capacity reserved above.
            let _ = raw.push_within_capacity((e.dma_address(), e.dma_len()));
        }
        let (addr, size) = (self.addr as u64, self.size as u64);
        match page_margins(addr, size, self.page_size()) {
            Some((head, tail))
                if raw.iter().fold(0u64, |t, s| t.saturating_add(s.1))
                    == size.saturating_add(head).saturating_add(tail) =>
            {
                window(&raw, head, size, &mut out);
                Ok(out)
            }
            _ => Ok(raw),
        }
    }

    /// Undoes `dma_map` (nothing if not mapped).
    pub(crate) fn dma_unmap(&mut self) {
        let Some(dev) = self.mapped.take() else {
            return;
        };
        if let Some(f) = self.client.table().dma_unmap {
            let sg = self.sg();
            // SAFETY: mapped for `dev` by `dma_map`.
            unsafe { f(sg, self.ctx, raw_device(&dev)) };
        }
    }

    /// Unpins what `get_pages` pinned.
    pub(crate) fn put_pages(&mut self) {
        self.dma_unmap();
        if let Some(f) = self.client.table().put_pages {
            let sg = self.sg();
            // SAFETY: the client's callback on its own context and table.
            unsafe { f(sg, self.ctx) };
        }
    }
}

impl Drop for ForeignCtx {
    fn drop(&mut self) {
        self.dma_unmap();
        if let Some(f) = self.client.table().release {
            // SAFETY: the context's one release (type invariant).
            unsafe { f(self.ctx) };
        }
    }
}

/// A consumer's invalidation callback (`invalidate(priv)`).
///
/// # Invariants
///
/// The consumer module keeps `f` callable with `priv_` until it released
/// the range (its `p2pdirect_peer_put()` call).
pub(crate) struct Notify {
    f: unsafe extern "C" fn(*mut c_void),
    priv_: *mut c_void,
}

// SAFETY: the callback may be called from any thread (the header says so).
unsafe impl Send for Notify {}
// SAFETY: as above.
unsafe impl Sync for Notify {}

impl Notify {
    /// Tells the consumer its memory goes away.
    pub(crate) fn call(&self) {
        // SAFETY: callable until the range is released (type invariant).
        unsafe { (self.f)(self.priv_) }
    }
}

/// What the kernel API's entry points call.
pub(crate) trait KernelApi {
    /// A registered client, as its module names it.
    type Client: Send + Sync + 'static;
    /// A consumer's range.
    type Mem: Send + Sync + 'static;

    fn register(client: Arc<ForeignClient>) -> Result<Arc<Self::Client>>;
    /// Returns once the client's last context is gone.
    fn unregister(client: Arc<Self::Client>);
    fn invalidate(client: &Self::Client, core_context: u64) -> Result;

    fn get(addr: u64, size: u64, write: bool, notify: Notify) -> Result<Arc<Self::Mem>>;
    /// Maps the range for `dev`: its segments, at most `max` of them.
    /// `E2BIG` for more, unmapped again before any other call on the range
    /// can see the mapping (under the range's own lock).
    fn dma_map(mem: &Self::Mem, dev: &pci::Device, max: usize) -> Result<KVVec<(u64, u64)>>;
    fn dma_unmap(mem: &Self::Mem);
    fn page_size(mem: &Self::Mem) -> u64;
    fn put(mem: Arc<Self::Mem>);
}

/// `p2pdirect_register_peer_memory_client()`.
///
/// # Safety
///
/// The C caller's promises of include/linux/p2pdirect.h: `table` valid until
/// the unregister call; `invalidate` writable or NULL.
pub(crate) unsafe fn register<T: KernelApi>(
    table: *const c::p2pdirect_peer_memory_client,
    invalidate: *mut c::p2pdirect_invalidate_peer_memory,
    invalidate_fn: c::p2pdirect_invalidate_peer_memory,
) -> *mut c_void {
    let Some(table) = NonNull::new(table.cast_mut()) else {
        pr_warn!("peer-memory client refused: no table\n");
        return core::ptr::null_mut();
    };
    // SAFETY: valid (caller); the name is a fixed array.
    let bytes = chars_as_bytes(unsafe { &table.as_ref().name[..] });
    let Some(len) = bytes.iter().position(|&b| b == 0).filter(|&l| l > 0) else {
        pr_warn!("peer-memory client refused: its name is empty or not NUL-terminated\n");
        return core::ptr::null_mut();
    };
    let Some(name) = CStr::from_bytes_with_nul(&bytes[..=len])
        .ok()
        .and_then(|n| CString::try_from(n).ok())
    else {
        return core::ptr::null_mut();
    };
    // SAFETY: valid (caller).
    let t = unsafe { table.as_ref() };
    if t.acquire.is_none()
        || t.get_pages.is_none()
        || t.dma_map.is_none()
        || t.dma_unmap.is_none()
        || t.put_pages.is_none()
        || t.release.is_none()
    {
        pr_warn!(
            "peer-memory client {} refused: acquire, get_pages, dma_map, dma_unmap, \
             put_pages and release are required\n",
            name.to_str().unwrap_or("?")
        );
        return core::ptr::null_mut();
    }
    let client = match Arc::new(ForeignClient { table, name }, GFP_KERNEL) {
        Ok(c) => c,
        Err(_) => return core::ptr::null_mut(),
    };
    // Before the client can be asked: its invalidation may come at once.
    if !invalidate.is_null() {
        // SAFETY: writable (caller).
        unsafe { *invalidate = invalidate_fn };
    }
    let Ok(h) = T::register(client) else {
        return core::ptr::null_mut();
    };
    let client = h.into_foreign();
    // Never 0, never reused; far below the ERR_PTR range.
    let id = NEXT_HANDLE.fetch_add(1, Relaxed);
    if handles()
        .push(
            Handle {
                id,
                client: client as usize,
                dying: false,
            },
            GFP_KERNEL,
        )
        .is_err()
    {
        // SAFETY: `into_foreign` just above; never handed out.
        T::unregister(unsafe { <Arc<T::Client> as ForeignOwnable>::from_foreign(client) });
        return core::ptr::null_mut();
    }
    id as *mut c_void
}

/// The next handle: a number, not the client's address, so that the
/// handle of an unregistered client never names the next client that
/// happens to get the same memory.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// A handle `register` handed out.
struct Handle {
    id: usize,
    /// The reference to the client that `register` leaked with
    /// `into_foreign`.
    client: usize,
    /// Its unregister call runs.
    dying: bool,
}

super::global::global_mutex! {
    static HANDLES: KVec<Handle> = KVec::new();
    /// The handles' global: set up in module init before the kernel API can
    /// be called, emptied after (every client module, which depends on this
    /// one, is gone by then).
    pub(crate) struct Handles;
    /// The handles handed out whose unregister call has not yet returned
    /// (a leaf lock). Each holds the reference to its client that
    /// `register` leaked with `into_foreign`, released only after its entry
    /// is removed: a call that finds its handle here under the lock may
    /// take a reference of its own.
    fn handles;
}

fn chars_as_bytes(raw: &[kernel::ffi::c_char]) -> &[u8] {
    // SAFETY: `c_char` and `u8` have the same size and alignment, and every
    // bit pattern is valid for both.
    unsafe { core::slice::from_raw_parts(raw.as_ptr().cast(), raw.len()) }
}

/// `IS_ERR_OR_NULL()`: what a careless caller may pass back.
fn is_err_or_null(p: *mut c_void) -> bool {
    p.is_null() || kernel::error::from_err_ptr(p).is_err()
}

/// `p2pdirect_unregister_peer_memory_client()`. A handle that is not
/// registered (never, or unregistered already or meanwhile) is refused with
/// a warning, without being dereferenced.
pub(crate) fn unregister<T: KernelApi>(handle: *mut c_void) {
    let id = handle as usize;
    let raw = {
        let mut list = handles();
        let Some(h) = list.iter_mut().find(|h| h.id == id && !h.dying) else {
            drop(list);
            if !is_err_or_null(handle) {
                pr_warn!("peer-memory client unregister: {id:#x} is not a registered handle\n");
            }
            return;
        };
        h.dying = true;
        h.client
    };
    // SAFETY: listed, so the reference `register` leaked is alive: only this
    // call, which marked the entry dying, takes it back.
    let client = unsafe { <Arc<T::Client> as ForeignOwnable>::from_foreign(raw as *mut c_void) };
    T::unregister(client.clone());
    handles().retain(|h| h.id != id);
    // Last: an invalidation that found the handle listed holds a reference
    // of its own.
    drop(client);
}

/// The invalidation function handed to clients. A handle that is not
/// registered (any more) gives `EINVAL` without being dereferenced; one
/// whose unregister call runs is still served.
pub(crate) fn invalidate<T: KernelApi>(handle: *mut c_void, core_context: u64) -> c_int {
    let id = handle as usize;
    let client: Arc<T::Client> = {
        let list = handles();
        let Some(h) = list.iter().find(|h| h.id == id) else {
            return EINVAL.to_errno();
        };
        // SAFETY: listed, so the reference `register` leaked is alive until
        // its unregister call removes the entry under this lock, and this
        // takes a reference of its own first.
        unsafe { <Arc<T::Client> as ForeignOwnable>::borrow(h.client as *mut c_void) }.into()
    };
    match T::invalidate(&client, core_context) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// `p2pdirect_peer_get()`.
///
/// # Safety
///
/// `invalidate`, if not NULL, is callable with `priv_` until the range is
/// put (NULL is refused: `EINVAL`).
pub(crate) unsafe fn get<T: KernelApi>(
    addr: usize,
    size: usize,
    write: bool,
    invalidate: Option<unsafe extern "C" fn(*mut c_void)>,
    priv_: *mut c_void,
) -> *mut c_void {
    // A consumer that cannot be told the memory goes away could keep its
    // DMA running into memory given to someone else: refused, as a dma-buf
    // importer without `invalidate_mappings` is.
    let Some(f) = invalidate else {
        return EINVAL.to_ptr();
    };
    // INVARIANT: the caller's promise.
    let notify = Notify { f, priv_ };
    match T::get(addr as u64, size as u64, write, notify) {
        Ok(m) => m.into_foreign().cast(),
        Err(e) => e.to_ptr(),
    }
}

/// Borrows a consumer's range.
///
/// # Safety
///
/// `mem` came from [`get`] and is not yet put.
unsafe fn mem<'a, T: KernelApi>(mem: *mut c_void) -> ArcBorrow<'a, T::Mem> {
    // SAFETY: the caller's promise.
    unsafe { <Arc<T::Mem> as ForeignOwnable>::borrow(mem.cast()) }
}

/// `p2pdirect_peer_dma_map()`.
///
/// # Safety
///
/// `m` from [`get`], not yet put; `dev` a valid device; `segs` writable for
/// `max` entries.
pub(crate) unsafe fn dma_map<T: KernelApi>(
    m: *mut c_void,
    dev: *mut bindings::device,
    segs: *mut c::p2pdirect_peer_seg,
    max: u32,
) -> c_int {
    // SAFETY: the caller's promises.
    let (m, pdev) = unsafe { (mem::<T>(m), pci_of(dev)) };
    let Some(pdev) = pdev else {
        return ENODEV.to_errno();
    };
    let max = max as usize;
    let list = match T::dma_map(&m, &pdev, max) {
        Ok(l) => l,
        Err(e) => return e.to_errno(),
    };
    // `dma_map` keeps to `max` (and unmaps itself past it, before another
    // caller's map or unmap of the range can come between): the writes
    // below stay within `segs` whatever it returns, and a mapping that
    // broke that promise is not left behind.
    if list.len() > max {
        T::dma_unmap(&m);
        return E2BIG.to_errno();
    }
    for (i, (addr, len)) in list.iter().enumerate() {
        // SAFETY: `i < max`, writable (caller).
        unsafe {
            segs.add(i).write(c::p2pdirect_peer_seg {
                addr: *addr,
                len: *len,
            })
        };
    }
    c_int::try_from(list.len()).unwrap_or(c_int::MAX)
}

/// The PCI function `dev` is, with a reference.
///
/// # Safety
///
/// `dev` is NULL or a valid device.
unsafe fn pci_of(dev: *mut bindings::device) -> Option<ARef<pci::Device>> {
    if dev.is_null() {
        return None;
    }
    // SAFETY: a valid device (caller), referenced during the call.
    let dev = unsafe { device::Device::from_raw(dev) };
    <&pci::Device>::try_from(dev).ok().map(ARef::from)
}

/// `p2pdirect_peer_dma_unmap()`.
///
/// # Safety
///
/// `m` from [`get`], not yet put.
pub(crate) unsafe fn dma_unmap<T: KernelApi>(m: *mut c_void) {
    // SAFETY: the caller's promise.
    let m = unsafe { mem::<T>(m) };
    T::dma_unmap(&m);
}

/// `p2pdirect_peer_page_size()`.
///
/// # Safety
///
/// `m` from [`get`], not yet put.
pub(crate) unsafe fn page_size<T: KernelApi>(m: *mut c_void) -> kernel::ffi::c_ulong {
    // SAFETY: the caller's promise.
    let m = unsafe { mem::<T>(m) };
    let size = T::page_size(&m);
    kernel::ffi::c_ulong::try_from(size).unwrap_or(0)
}

/// `p2pdirect_peer_put()`.
///
/// # Safety
///
/// `m` from [`get`], put once.
pub(crate) unsafe fn put<T: KernelApi>(m: *mut c_void) {
    if is_err_or_null(m) {
        return;
    }
    // SAFETY: the reference `get` handed out (caller).
    T::put(unsafe { <Arc<T::Mem> as ForeignOwnable>::from_foreign(m.cast()) });
}

/// Checks that each named function, defined in the calling scope, has the
/// type of its declaration that bindgen generated in `c` (the two arms of
/// an `if` only unify when the signatures are the same).
macro_rules! declared_as_defined {
    ($($f:ident),*) => {
        $(let _ = if true { $crate::sys::c::$f } else { $f };)*
    };
}
pub(crate) use declared_as_defined;

/// Defines the GPL entry points of include/linux/p2pdirect.h for `$t`, a
/// [`KernelApi`] (their `EXPORT_SYMBOL_GPL` lines are in the C shim). The
/// bodies only forward to this file's functions, whose safety rests on the
/// header's contract with the calling module.
macro_rules! kernel_api {
    ($t:ty) => {
        const _: () = {
            use kernel::{bindings, ffi::c_void};
            use $crate::sys::{c, peer_client as api};

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_register_peer_memory_client(
                table: *const c::p2pdirect_peer_memory_client,
                invalidate: *mut c::p2pdirect_invalidate_peer_memory,
            ) -> *mut c_void {
                // SAFETY: the header's contract with the caller.
                unsafe { api::register::<$t>(table, invalidate, Some(invalidate_peer_memory)) }
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_unregister_peer_memory_client(handle: *mut c_void) {
                api::unregister::<$t>(handle)
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            unsafe extern "C" fn invalidate_peer_memory(
                handle: *mut c_void,
                core_context: u64,
            ) -> kernel::ffi::c_int {
                api::invalidate::<$t>(handle, core_context)
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_peer_get(
                addr: kernel::ffi::c_ulong,
                size: usize,
                write: bool,
                invalidate: Option<unsafe extern "C" fn(*mut c_void)>,
                priv_: *mut c_void,
            ) -> *mut c::p2pdirect_peer_mem {
                // SAFETY: as above.
                unsafe { api::get::<$t>(addr, size, write, invalidate, priv_) }.cast()
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_peer_dma_map(
                mem: *mut c::p2pdirect_peer_mem,
                dev: *mut bindings::device,
                segs: *mut c::p2pdirect_peer_seg,
                max: kernel::ffi::c_uint,
            ) -> kernel::ffi::c_int {
                // SAFETY: as above.
                unsafe { api::dma_map::<$t>(mem.cast(), dev, segs, max) }
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_peer_dma_unmap(mem: *mut c::p2pdirect_peer_mem) {
                // SAFETY: as above.
                unsafe { api::dma_unmap::<$t>(mem.cast()) }
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_peer_page_size(
                mem: *mut c::p2pdirect_peer_mem,
            ) -> kernel::ffi::c_ulong {
                // SAFETY: as above.
                unsafe { api::page_size::<$t>(mem.cast()) }
            }

            /// The kernel API entry point of this name.
            ///
            /// # Safety
            ///
            /// The contract include/linux/p2pdirect.h states for the caller.
            #[no_mangle]
            unsafe extern "C" fn p2pdirect_peer_put(mem: *mut c::p2pdirect_peer_mem) {
                // SAFETY: as above.
                unsafe { api::put::<$t>(mem.cast()) }
            }

            // Each definition has the type of its declaration in the header
            // (as bindgen generates it): the two arms only unify if the
            // signatures are the same, as in the kernel crate's `#[export]`.
            const _: () = {
                $crate::sys::peer_client::declared_as_defined!(
                    p2pdirect_register_peer_memory_client,
                    p2pdirect_unregister_peer_memory_client,
                    p2pdirect_peer_get,
                    p2pdirect_peer_dma_map,
                    p2pdirect_peer_dma_unmap,
                    p2pdirect_peer_page_size,
                    p2pdirect_peer_put
                );
                let _: c::p2pdirect_invalidate_peer_memory = Some(invalidate_peer_memory);
            };
        };
    };
}
pub(crate) use kernel_api;

/// The bytes before `addr` in its page of `page` bytes, and after the
/// range's last byte in that one's: what whole pages add to the range.
/// `None` for a page size that is no power of two.
fn page_margins(addr: u64, size: u64, page: u64) -> Option<(u64, u64)> {
    if !page.is_power_of_two() {
        return None;
    }
    let end = addr.checked_add(size)?;
    let mask = page - 1;
    Some((addr & mask, end.wrapping_neg() & mask))
}

/// Pushes to `out` the part of `segs` (laid end to end) from byte `skip` on,
/// `len` bytes long; `out` has room for as many segments as `segs`.
fn window(segs: &[(u64, u64)], skip: u64, len: u64, out: &mut KVVec<(u64, u64)>) {
    let end = skip.saturating_add(len);
    let mut at = 0u64;
    for &(addr, n) in segs {
        let (from, to) = (at.max(skip), at.saturating_add(n).min(end));
        if from < to {
            // At most one entry per segment: within the caller's capacity.
            let _ = out.push_within_capacity((addr + (from - at), to - from));
        }
        at = at.saturating_add(n);
    }
}

#[kernel::macros::kunit_tests(p2pdirect_peer_client)]
mod tests {
    use super::*;

    fn cut(segs: &[(u64, u64)], skip: u64, len: u64) -> KVVec<(u64, u64)> {
        let mut out = KVVec::with_capacity(segs.len(), GFP_KERNEL).expect("test allocation");
        window(segs, skip, len, &mut out);
        out
    }

    #[test]
    fn margins_of_whole_pages() {
        assert_eq!(page_margins(0x10000, 0x10000, 0x10000), Some((0, 0)));
        assert_eq!(
            page_margins(0x11000, 0x2000, 0x10000),
            Some((0x1000, 0xd000))
        );
        assert_eq!(page_margins(0x1064, 0x2000, 0x1000), Some((0x64, 0xf9c)));
        assert_eq!(page_margins(0, 1, 3), None);
        assert_eq!(page_margins(u64::MAX, 2, 0x1000), None);
    }

    #[test]
    fn window_cuts_the_first_and_last_segments() {
        // One 64 KiB page holding a 0x2000-byte range at 0x1000.
        assert_eq!(
            &cut(&[(0xa0000, 0x10000)], 0x1000, 0x2000)[..],
            &[(0xa1000, 0x2000)]
        );
        // Three pages, the range from 0x64 into the first to 0x9c before
        // the end of the third.
        assert_eq!(
            &cut(&[(0x1000, 0x1000), (0x5000, 0x2000)], 0x64, 0x2f38)[..],
            &[(0x1064, 0xf9c), (0x5000, 0x1f9c)]
        );
        // Leading and trailing segments the range does not reach go.
        assert_eq!(
            &cut(
                &[(0x1000, 0x1000), (0x8000, 0x1000), (0x9000, 0x1000)],
                0x1000,
                0x800
            )[..],
            &[(0x8000, 0x800)]
        );
    }
}
