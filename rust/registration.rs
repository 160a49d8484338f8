// SPDX-License-Identifier: GPL-2.0

//! Buffer registrations (cuFileBufRegister's role): a range pinned once,
//! through the peer-memory client that owns it, and kept for reuse by I/O
//! until the file deregisters it, closes, or the memory goes away.
//!
//! Invalidation: a registration on p2pdirect's own memory subscribes to its
//! allocation as a peer-memory [`Consumer`]; when the memory goes away it
//! drops its pins and reports itself dead from then on, whichever file made it.
//!
//! Lock order: `OpenFile::regs` -> subscriber list (peer_mem) -> `RegEntry::claim`
//! -> statistics (a leaf: `Pinned` takes it when a claim goes).

use crate::{
    ffi,
    peer_mem::{self, Claim, Consumer, UserRange},
    stats::Pinned,
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
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
    /// The p2pdirect allocation the range lies in, if it is p2pdirect's memory.
    handle: Option<u64>,
    /// The pinned claim and its share of the provider's pinned bytes;
    /// `None` once invalidated.
    #[pin]
    claim: Mutex<Option<(Claim, Pinned)>>,
}

impl RegEntry {
    pub(crate) fn is_live(&self) -> bool {
        self.claim.lock().is_some()
    }

    /// The pinned pages, for I/O: `ESTALE` once invalidated. The reference
    /// keeps them pinned until the I/O is done, even if the registration is
    /// invalidated meanwhile (the memory's FREE waits for that).
    pub(crate) fn pages(&self) -> Result<ffi::PinRef> {
        match self.claim.lock().as_ref() {
            Some((claim, _)) => claim.pages(),
            None => Err(ffi::estale()),
        }
    }

    /// `P2PDIRECT_REG_LIVE` or `P2PDIRECT_REG_DEAD`.
    pub(crate) fn state(&self) -> u32 {
        if self.is_live() {
            ffi::uapi::P2PDIRECT_REG_LIVE
        } else {
            ffi::uapi::P2PDIRECT_REG_DEAD
        }
    }
}

impl Consumer for RegEntry {
    fn consumer_id(&self) -> u64 {
        self.id
    }

    fn invalidate(&self) {
        drop(self.claim.lock().take());
    }
}

static NEXT_REG: Atomic<u64> = Atomic::new(1);

/// The registrations of one open file.
pub(crate) type FileRegs = KVec<Arc<RegEntry>>;

/// REGISTER: pins `[addr, addr + size)` for the file owning `regs`, whose
/// live registrations may pin at most `cap` bytes. Returns (id, client).
pub(crate) fn register(
    regs: &mut FileRegs,
    addr: u64,
    size: u64,
    write: bool,
    cap: u64,
) -> Result<(u64, u32)> {
    let range = UserRange::new(addr, size)?;
    if regs.iter().any(|r| r.range == range) {
        return Err(EEXIST);
    }
    let pinned: u64 = regs
        .iter()
        .filter(|r| r.is_live())
        .map(|r| r.range.size)
        .sum();
    if pinned.checked_add(size).is_none_or(|total| total > cap) {
        if ffi::ratelimit() {
            pr_info!(
                "REGISTER refused: {} + {} bytes pinned would pass max_pinned_mib\n",
                pinned,
                size
            );
        }
        return Err(ffi::edquot());
    }
    let mut claim = ffi::peer_clients().acquire(range)?;
    claim.get_pages(write)?;
    let (client, handle) = (claim.client_id, claim.devmem_handle());
    let pinned = Pinned::new(claim.pages()?.provider(), size);
    let id = NEXT_REG.fetch_add(1, Relaxed);
    let entry = Arc::pin_init(
        pin_init!(RegEntry {
            id,
            range,
            client,
            write,
            handle,
            claim <- new_mutex!(Some((claim, pinned))),
        }),
        GFP_KERNEL,
    )?;
    regs.reserve(1, GFP_KERNEL)?;
    if let Some(h) = handle {
        peer_mem::subscribe(h, entry.clone())?;
    }
    regs.push_within_capacity(entry).map_err(|_| ENOMEM)?;
    Ok((id, client))
}

fn take(regs: &mut FileRegs, id: u64) -> Result<Arc<RegEntry>> {
    let i = regs.iter().position(|r| r.id == id).ok_or(ENOENT)?;
    let entry = regs.remove(i).map_err(|_| ENOENT)?;
    peer_mem::unsubscribe(id);
    Ok(entry)
}

/// DEREGISTER: drops the registration; returns the state it had.
pub(crate) fn deregister(regs: &mut FileRegs, id: u64) -> Result<u32> {
    Ok(take(regs, id)?.state())
}

/// The registration `id` of this file, for I/O.
pub(crate) fn find(regs: &FileRegs, id: u64) -> Result<Arc<RegEntry>> {
    regs.iter().find(|r| r.id == id).cloned().ok_or(ENOENT)
}

/// REG_QUERY.
pub(crate) fn query(regs: &FileRegs, id: u64) -> Result<u32> {
    regs.iter()
        .find(|r| r.id == id)
        .map(|r| r.state())
        .ok_or(ENOENT)
}

/// Drops every registration of a closing file.
pub(crate) fn drop_all(regs: &mut FileRegs) {
    while let Some(r) = regs.pop() {
        peer_mem::unsubscribe(r.id);
    }
}
