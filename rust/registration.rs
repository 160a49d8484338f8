// SPDX-License-Identifier: GPL-2.0

//! Buffer registrations (cuFileBufRegister's role): a range pinned once,
//! through the peer-memory client that owns it, and kept for reuse by I/O
//! until the file deregisters it, closes, or the memory goes away.
//!
//! Invalidation: a registration on p2pdirect's own memory subscribes to its
//! allocation as a peer-memory [`Consumer`], one on another provider's
//! P2PDMA pages watches that provider's driver (`peer_clients::watch`);
//! when the memory goes away it drops its pins and reports itself dead from
//! then on, whichever file made it.
//!
//! Lock order: see `error.rs` (`OpenFile::regs` -> mmap lock -> an
//! allocation's lock -> `RegEntry::claim`).
//!
//! I/O finds a registration with no lock: a file's registrations are also
//! in an [`RcuMap`] by id, which REGISTER fills and DEREGISTER and close
//! empty (under `OpenFile::regs`, like the list). DEREGISTER waits for an
//! expedited RCU grace period after it let go of `OpenFile::regs`; close
//! waits for one for all of the file's. Inside that read section the I/O
//! takes a reference to the registration's pages under `RegEntry::io`, a
//! spinlock that is a leaf of the lock order.

use crate::{
    devmem::AllocState,
    error::{edquot, estale, refuse},
    ffi,
    peer_mem::{self, Claim, Consumer, UserRange},
    stats::Pinned,
    sys::rcu_map::{RcuMap, Retired},
};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex, SpinLock,
    },
};

/// One registration.
#[pin_data]
pub(crate) struct RegEntry {
    pub(crate) id: u64,
    pub(crate) range: UserRange,
    pub(crate) client: u32,
    /// Pinned for devices to write into (`P2PDIRECT_REG_WRITE`).
    pub(crate) write: bool,
    /// Taken out of its file by DEREGISTER: an I/O that found it just
    /// before and finds its pins gone gets `ENOENT`, as if it came later.
    deregistered: AtomicBool,
    /// The p2pdirect allocation the range lies in, if it is p2pdirect's memory.
    state: Option<Arc<AllocState>>,
    /// Another provider's driver it watches (its memory's; `PciFunction::id`).
    foreign: Option<usize>,
    /// The pinned claim, its share of the provider's pinned bytes and of
    /// its file's quota; `None` once invalidated.
    #[pin]
    claim: Mutex<Option<(Claim, Pinned, Charge)>>,
    /// A reference to the claim's pinned pages for I/O to share, under a
    /// spinlock (taking a reference does not sleep, and an I/O then needs
    /// neither the claim's mutex nor its client); `None` once invalidated,
    /// which takes it before the claim.
    #[pin]
    io: SpinLock<Option<ffi::Pages>>,
}

impl RegEntry {
    pub(crate) fn is_live(&self) -> bool {
        self.claim.lock().is_some()
    }

    /// The pinned pages, for I/O: `ESTALE` once invalidated. The reference
    /// keeps them pinned until the I/O is done, even if the registration is
    /// invalidated meanwhile (the memory returns to its provider only then).
    pub(crate) fn pages(&self) -> Result<ffi::Pages> {
        self.io.lock().clone().ok_or_else(estale)
    }

    /// `P2PDIRECT_REG_LIVE` or `P2PDIRECT_REG_DEAD`.
    pub(crate) fn state(&self) -> u32 {
        if self.is_live() {
            crate::sys::uapi::P2PDIRECT_REG_LIVE
        } else {
            crate::sys::uapi::P2PDIRECT_REG_DEAD
        }
    }
}

impl Consumer for RegEntry {
    fn consumer_id(&self) -> u64 {
        self.id
    }

    fn invalidate(&self) {
        // The I/O reference first, dropped outside its spinlock, so no I/O
        // starts on it any more; then the claim (its drop unpins and may
        // sleep, under the claim's mutex, which allows that).
        let io = self.io.lock().take();
        drop(io);
        drop(self.claim.lock().take());
    }
}

/// Bytes of whole pages a live registration counts against its file's
/// quota, given back when its pins go (invalidation or drop).
struct Charge {
    counter: Arc<Atomic<u64>>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Relaxed);
    }
}

impl RegEntry {
    /// Stops being told about the memory's removal.
    fn unsubscribe(&self) {
        if let Some(state) = self.state.as_ref() {
            state.unsubscribe(self.id);
        }
        if let Some(provider) = self.foreign {
            crate::peer_clients::unwatch(provider, self.id);
        }
    }
}

/// Most registrations one open file may hold, live or dead.
pub(crate) const MAX_PER_FILE: usize = 4096;

static NEXT_REG: Atomic<u64> = Atomic::new(1);

/// The registrations of one open file.
pub(crate) struct FileRegs {
    list: KVec<Arc<RegEntry>>,
    /// Bytes of whole pages its live registrations pin (made at the first
    /// REGISTER): kept as they come and go, never summed up again.
    pinned: Option<Arc<Atomic<u64>>>,
}

impl FileRegs {
    pub(crate) const fn new() -> Self {
        Self {
            list: KVec::new(),
            pinned: None,
        }
    }
}

/// The registrations of a file by id, for I/O.
pub(crate) type RegIndex = RcuMap<RegEntry>;

/// REGISTER: pins `[addr, addr + size)` for the file owning `regs` and
/// `index`, whose live registrations may pin at most `cap` bytes. Returns
/// (id, client).
///
/// The memory is looked up and pinned with no lock of the file held:
/// pinning may fault user memory in, and a fault may wait for as long as
/// whoever serves it likes (a FUSE daemon, a userfaultfd handler). Every
/// other command of a process sharing the file must not wait for that. So
/// the file's limits are checked before the memory (the header's order),
/// and again once it is pinned, under the lock that adds the registration.
pub(crate) fn register(
    regs: &Mutex<FileRegs>,
    index: &RegIndex,
    addr: u64,
    size: u64,
    write: bool,
    cap: u64,
) -> Result<(u64, u32)> {
    let range = UserRange::new(addr, size)?;
    let span = range.pinned_bytes();
    // The file's limits, and its quota taken for the range (given back if
    // the REGISTER fails), before the memory is looked up.
    let charge = {
        let mut regs = regs.lock();
        let counter = admit(&mut regs, range)?;
        reserve(counter, span, cap)?
    };
    // Memory freed meanwhile may have waited for this pin only.
    let (claim, io) = pin(range, write).inspect_err(|_| crate::devmem::reap())?;
    let (client, state) = (claim.client_id, claim.devmem_state());
    let foreign = claim.foreign_provider();
    let pinned = Pinned::new(io.provider(), span);
    let mut regs = regs.lock();
    // Again: another REGISTER of the file may have come in meanwhile.
    if let Err(e) = admit(&mut regs, range) {
        drop(regs);
        drop((claim, io, pinned, charge));
        crate::devmem::reap();
        return Err(e);
    }
    let id = NEXT_REG.fetch_add(1, Relaxed);
    let entry_state = state.clone();
    let entry = Arc::pin_init(
        pin_init!(RegEntry {
            id,
            range,
            client,
            write,
            state: entry_state,
            foreign,
            deregistered: AtomicBool::new(false),
            claim <- new_mutex!(Some((claim, pinned, charge))),
            io <- new_spinlock!(Some(io)),
        }),
        GFP_KERNEL_ACCOUNT,
    );
    // Out of memory (the caller's cgroup at its limit, say): the pin goes
    // with the entry, and memory freed meanwhile may have waited for it
    // only, as above.
    let entry = match entry {
        Ok(entry) => match regs.list.reserve(1, GFP_KERNEL_ACCOUNT) {
            Ok(()) => entry,
            Err(e) => {
                drop(regs);
                drop(entry);
                crate::devmem::reap();
                return Err(e.into());
            }
        },
        Err(e) => {
            drop(regs);
            crate::devmem::reap();
            return Err(e);
        }
    };
    // Freed, or its driver unbinding, between the lookup and now: the pin
    // goes at once.
    let subscribed = match (state, foreign) {
        (Some(state), _) => state.subscribe(entry.clone()),
        (None, Some(provider)) => crate::peer_clients::watch(provider, entry.clone()),
        (None, None) => Ok(()),
    };
    subscribed.inspect_err(|_| {
        entry.invalidate();
        crate::devmem::reap();
    })?;
    // Not in the index: the pin goes now.
    index.insert(id, entry.clone()).inspect_err(|_| {
        entry.unsubscribe();
        entry.invalidate();
        crate::devmem::reap();
    })?;
    regs.list.push_within_capacity(entry).map_err(|_| ENOMEM)?;
    Ok((id, client))
}

/// The file's limits for a new registration of `range`: no live one of the
/// same range (a dead one, whose memory was freed, does not stand in the
/// way), and a place left. Returns the file's pinned-bytes counter.
fn admit(regs: &mut FileRegs, range: UserRange) -> Result<Arc<Atomic<u64>>> {
    if regs.list.iter().any(|r| r.range == range && r.is_live()) {
        refuse!(
            EEXIST,
            "REGISTER refused: this file has a live registration of {:#x}+{:#x} already\n",
            range.addr,
            range.size
        );
    }
    if regs.list.len() >= MAX_PER_FILE {
        refuse!(
            ENOSPC,
            "REGISTER refused: the file holds {} registrations already\n",
            MAX_PER_FILE
        );
    }
    match regs.pinned.as_ref() {
        Some(c) => Ok(c.clone()),
        None => {
            let c = Arc::new(Atomic::new(0u64), GFP_KERNEL_ACCOUNT)?;
            regs.pinned = Some(c.clone());
            Ok(c)
        }
    }
}

/// Charges `span` bytes (whole pages are pinned, so whole pages count) to
/// the file's `counter` if that stays within `cap`. Called under the file's
/// registration lock, which every REGISTER of the file holds while it
/// charges: no other can pass the cap meanwhile.
fn reserve(counter: Arc<Atomic<u64>>, span: u64, cap: u64) -> Result<Charge> {
    let pinned = counter.load(Relaxed);
    if pinned.checked_add(span).is_none_or(|total| total > cap) {
        refuse!(
            edquot(),
            "REGISTER refused: {} + {} bytes pinned would pass max_pinned_mib\n",
            pinned,
            span
        );
    }
    counter.fetch_add(span, Relaxed);
    Ok(Charge {
        counter,
        bytes: span,
    })
}

/// The memory of `range`, claimed by the client that owns it, pinned (for
/// devices to write into it if `write`), and its pages. On failure the
/// claim is let go.
fn pin(range: UserRange, write: bool) -> Result<(Claim, ffi::Pages)> {
    let mut claim = peer_mem::acquire(range)?;
    claim.check_io()?;
    claim.get_pages(write)?;
    let io = claim.pages()?;
    Ok((claim, io))
}

/// A registration DEREGISTER took out of its file, still held by I/O that
/// found it just before (until an RCU grace period passes): dropped with
/// no lock held, it lets go of the pins, then waits for that.
pub(crate) struct Deregistered {
    retired: Option<Retired<RegEntry>>,
    entry: Option<Arc<RegEntry>>,
}

impl Drop for Deregistered {
    fn drop(&mut self) {
        // Its pins and its share of the quota go first, with no lock held,
        // also where a revocation under way took the subscriber list and
        // has yet to reach it (behind another subscriber's fence wait or
        // callback). An I/O that found it before gets ENOENT from here on
        // (`deregistered`).
        if let Some(entry) = self.entry.as_ref() {
            entry.invalidate();
        }
        // Then the grace period: then no lookup holds it but running I/O.
        drop(self.retired.take());
        drop(self.entry.take());
        // Memory freed while registered may wait for this pin only.
        crate::devmem::reap();
    }
}

/// DEREGISTER: takes the registration out of the file; returns the state
/// it had, and the registration to drop once the file's lock is let go.
pub(crate) fn deregister(
    regs: &mut FileRegs,
    index: &RegIndex,
    id: u64,
) -> Result<(u32, Deregistered)> {
    let i = regs.list.iter().position(|r| r.id == id).ok_or(ENOENT)?;
    let entry = regs.list.remove(i).map_err(|_| ENOENT)?;
    let retired = index.remove(id);
    entry.deregistered.store(true, Ordering::Release);
    entry.unsubscribe();
    Ok((
        entry.state(),
        Deregistered {
            retired,
            entry: Some(entry),
        },
    ))
}

/// For I/O: the pinned pages of registration `id` (`ENOENT` if the file
/// has none) once `check` accepts it, with no lock and no reference to
/// the registration taken (`check` must not sleep).
pub(crate) fn io_pages(
    index: &RegIndex,
    id: u64,
    check: &dyn Fn(&RegEntry) -> Result,
) -> Result<ffi::Pages> {
    index
        .with(id, |r| {
            check(r).and_then(|()| {
                r.pages().map_err(|e| {
                    if r.deregistered.load(Ordering::Acquire) {
                        ENOENT
                    } else {
                        e
                    }
                })
            })
        })
        .unwrap_or(Err(ENOENT))
}

/// REG_QUERY.
pub(crate) fn query(regs: &FileRegs, id: u64) -> Result<u32> {
    regs.list
        .iter()
        .find(|r| r.id == id)
        .map(|r| r.state())
        .ok_or(ENOENT)
}

/// Drops every registration of a closing file.
pub(crate) fn drop_all(regs: &mut FileRegs, index: &RegIndex) {
    index.clear();
    while let Some(r) = regs.list.pop() {
        r.unsubscribe();
        // As for DEREGISTER: the pins go now, whoever else holds it.
        r.invalidate();
    }
    // Memory freed while registered may have waited for these pins only.
    crate::devmem::reap();
}
