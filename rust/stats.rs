// SPDX-License-Identifier: GPL-2.0

//! Statistics per device-memory provider and per block device (the role of
//! /proc/driver/nvidia-fs/stats): operations, bytes by path (P2P, bounced,
//! CPU-zeroed), errors, pinned bytes, latency. Read through
//! `P2PDIRECT_IOC_STATS` and debugfs `p2pdirect/stats`; both can reset them.
//!
//! No lock: a fixed table of rows of atomic counters, updated once per I/O
//! by every thread at once. A row's key is set once, in the first free row
//! (compare-and-exchange from 0; a row never frees), so two threads adding
//! the same new key meet in the same row. Each counter is exact; a row read
//! while I/Os finish may show one of them in some counters and not yet in
//! others. At most [`MAX_ROWS`] devices are counted; later ones are not
//! (a rate-limited message says so).

use crate::sys::ratelimit;
// The counters are core atomics: relaxed counts that order nothing else, and
// unlike `kernel::sync::atomic` (a call into a C helper per operation in
// these kernels) they compile to single instructions in the I/O path.
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use kernel::prelude::*;

/// Most rows: providers and block devices ever counted since load.
pub(crate) const MAX_ROWS: usize = crate::sys::uapi::P2PDIRECT_STATS_MAX_ENTRIES as usize;

/// What a row counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// A device-memory provider, by the PCI address of its BAR's owner.
    Provider(u32),
    /// A block device, by `dev_t` (major << 20 | minor).
    Block(u32),
}

impl Key {
    /// The row's tag: never 0 (a free row).
    fn encode(self) -> u64 {
        match self {
            Key::Provider(a) => 1 << 32 | u64::from(a),
            Key::Block(d) => 2 << 32 | u64::from(d),
        }
    }

    fn decode(v: u64) -> Option<Self> {
        // The low 32 bits are the id: truncation is the decoding.
        let id = v as u32;
        match v >> 32 {
            1 => Some(Key::Provider(id)),
            2 => Some(Key::Block(id)),
            _ => None,
        }
    }
}

/// The counters of one row, as read at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) errors: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) p2p: u64,
    pub(crate) bounced: u64,
    pub(crate) zeroed: u64,
    /// A gauge, not a counter: never reset.
    pub(crate) pinned: u64,
    lat_n: u64,
    lat_sum_ns: u64,
    lat_min_ns: u64,
    lat_max_ns: u64,
}

impl Counters {
    /// The shortest I/O so far, in nanoseconds (0: none yet).
    pub(crate) fn lat_min_ns(&self) -> u64 {
        self.lat_min_ns
    }

    /// The longest I/O so far, in nanoseconds.
    pub(crate) fn lat_max_ns(&self) -> u64 {
        self.lat_max_ns
    }

    pub(crate) fn lat_avg_ns(&self) -> u64 {
        self.lat_sum_ns.checked_div(self.lat_n).unwrap_or(0)
    }
}

/// What one I/O did, for the table.
pub(crate) struct IoRecord {
    pub(crate) write: bool,
    pub(crate) ok: bool,
    pub(crate) bytes: u64,
    pub(crate) p2p: u64,
    pub(crate) bounced: u64,
    pub(crate) zeroed: u64,
    pub(crate) ns: u64,
}

/// One row of atomic counters.
///
/// INVARIANT: the counters of a row whose key is 0 are all 0 (nothing adds
/// to a row before it has its key).
struct Row {
    key: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    p2p: AtomicU64,
    bounced: AtomicU64,
    zeroed: AtomicU64,
    pinned: AtomicU64,
    lat_n: AtomicU64,
    lat_sum_ns: AtomicU64,
    /// 0 before the first I/O (an I/O counts at least 1 ns).
    lat_min_ns: AtomicU64,
    lat_max_ns: AtomicU64,
}

/// Lowers `a` to `v` (0 in `a`: none yet).
fn lower(a: &AtomicU64, v: u64) {
    let mut cur = a.load(Relaxed);
    while cur == 0 || v < cur {
        match a.compare_exchange(cur, v, Relaxed, Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

/// Adds `v` to `a` unless it is 0 (no write to the shared line then).
#[inline]
fn add_nonzero(a: &AtomicU64, v: u64) {
    if v != 0 {
        a.fetch_add(v, Relaxed);
    }
}

/// Raises `a` to `v`.
fn raise(a: &AtomicU64, v: u64) {
    let mut cur = a.load(Relaxed);
    while v > cur {
        match a.compare_exchange(cur, v, Relaxed, Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

impl Row {
    const fn new() -> Self {
        Self {
            key: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            p2p: AtomicU64::new(0),
            bounced: AtomicU64::new(0),
            zeroed: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            lat_n: AtomicU64::new(0),
            lat_sum_ns: AtomicU64::new(0),
            lat_min_ns: AtomicU64::new(0),
            lat_max_ns: AtomicU64::new(0),
        }
    }

    /// Reads the counters (`take`: and resets all but the gauge).
    fn read(&self, take: bool) -> Counters {
        let get = |a: &AtomicU64| {
            if take {
                a.swap(0, Relaxed)
            } else {
                a.load(Relaxed)
            }
        };
        Counters {
            reads: get(&self.reads),
            writes: get(&self.writes),
            errors: get(&self.errors),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            p2p: get(&self.p2p),
            bounced: get(&self.bounced),
            zeroed: get(&self.zeroed),
            pinned: self.pinned.load(Relaxed),
            lat_n: get(&self.lat_n),
            lat_sum_ns: get(&self.lat_sum_ns),
            lat_min_ns: get(&self.lat_min_ns),
            lat_max_ns: get(&self.lat_max_ns),
        }
    }

    /// Adds `c` (all but the gauge).
    fn merge(&self, c: &Counters) {
        self.reads.fetch_add(c.reads, Relaxed);
        self.writes.fetch_add(c.writes, Relaxed);
        self.errors.fetch_add(c.errors, Relaxed);
        self.bytes_read.fetch_add(c.bytes_read, Relaxed);
        self.bytes_written.fetch_add(c.bytes_written, Relaxed);
        self.p2p.fetch_add(c.p2p, Relaxed);
        self.bounced.fetch_add(c.bounced, Relaxed);
        self.zeroed.fetch_add(c.zeroed, Relaxed);
        // Every field on its own: a concurrent I/O may have added to some
        // after the reset took others (its count 0, its sum and extremes
        // not). A minimum of 0 is none (another reset took it first), and
        // a maximum of 0 raises nothing.
        self.lat_sum_ns.fetch_add(c.lat_sum_ns, Relaxed);
        self.lat_n.fetch_add(c.lat_n, Relaxed);
        if c.lat_min_ns != 0 {
            lower(&self.lat_min_ns, c.lat_min_ns);
        }
        raise(&self.lat_max_ns, c.lat_max_ns);
    }
}

/// The rows: `N` of them, [`MAX_ROWS`] in the module's table.
pub(crate) struct Table<const N: usize> {
    rows: [Row; N],
}

impl<const N: usize> Table<N> {
    pub(crate) const fn new() -> Self {
        Self {
            rows: [const { Row::new() }; N],
        }
    }

    /// The row of `key`, given it if it had none; `None` if the table is full.
    #[inline]
    fn row(&self, key: Key) -> Option<&Row> {
        let tag = key.encode();
        for r in self.rows.iter() {
            let mut k = r.key.load(Relaxed);
            if k == 0 {
                // Taken by this thread, or by one that got there first: for
                // the same key (the same row, then) or another (look on).
                k = match r.key.compare_exchange(0, tag, Relaxed, Relaxed) {
                    Ok(_) => tag,
                    Err(now) => now,
                };
            }
            if k == tag {
                return Some(r);
            }
        }
        if ratelimit::allow() {
            pr_info!(
                "statistics: all {} rows are taken; {:?} is not counted\n",
                N,
                key
            );
        }
        None
    }

    /// The rows that have a key, in the order they got it.
    fn used(&self) -> impl Iterator<Item = (Key, &Row)> {
        self.rows
            .iter()
            .map_while(|r| Key::decode(r.key.load(Relaxed)).map(|k| (k, r)))
    }

    /// Adds one I/O to the rows of `keys` (a device the full table has no
    /// row for misses the I/O; the I/O itself is not failed for it).
    pub(crate) fn add(&self, keys: &[Option<Key>], r: &IoRecord) {
        let ns = r.ns.max(1);
        for key in keys.iter().flatten() {
            let Some(c) = self.row(*key) else { continue };
            if r.write {
                c.writes.fetch_add(1, Relaxed);
                c.bytes_written.fetch_add(r.bytes, Relaxed);
            } else {
                c.reads.fetch_add(1, Relaxed);
                c.bytes_read.fetch_add(r.bytes, Relaxed);
            }
            if !r.ok {
                c.errors.fetch_add(1, Relaxed);
            }
            // Written out, not a loop over an array of pairs: an array
            // iterated by value is an out-of-line call into `core` per step.
            add_nonzero(&c.p2p, r.p2p);
            add_nonzero(&c.bounced, r.bounced);
            add_nonzero(&c.zeroed, r.zeroed);
            lower(&c.lat_min_ns, ns);
            raise(&c.lat_max_ns, ns);
            c.lat_sum_ns.fetch_add(ns, Relaxed);
            c.lat_n.fetch_add(1, Relaxed);
        }
    }

    /// Resets every counter; the pinned gauges stay.
    pub(crate) fn reset(&self) {
        for (_, r) in self.used() {
            r.read(true);
        }
    }

    /// The rows as they are now.
    pub(crate) fn rows(&self) -> impl Iterator<Item = (Key, Counters)> + '_ {
        self.used().map(|(k, r)| (k, r.read(false)))
    }

    /// How many rows have a key.
    pub(crate) fn len(&self) -> usize {
        self.used().count()
    }

    /// Resets the counters of the first `n` rows and returns what they held
    /// (for [`Self::put_back`]); the other rows keep theirs.
    pub(crate) fn take(&self, n: usize) -> Result<KVec<(Key, Counters)>> {
        let mut out = KVec::with_capacity(self.len().min(n), GFP_KERNEL)?;
        for (k, r) in self.used() {
            // Full: `n` rows, or a row keyed since the count (its I/Os stay
            // in it, unread).
            if out.len() == out.capacity() {
                break;
            }
            out.push_within_capacity((k, r.read(true)))
                .map_err(|_| ENOMEM)?;
        }
        Ok(out)
    }

    /// Adds counters taken by [`Self::take`] back (a reset that did not
    /// reach its caller), merged with what was counted since.
    pub(crate) fn put_back(&self, taken: &[(Key, Counters)]) {
        for (key, t) in taken {
            if let Some(r) = self.row(*key) {
                r.merge(t);
            }
        }
    }

    /// Adds `bytes` to `key`'s pinned gauge (false: the table is full).
    fn pin(&self, key: Key, bytes: u64) -> bool {
        self.row(key)
            .map(|r| r.pinned.fetch_add(bytes, Relaxed))
            .is_some()
    }

    /// Takes `bytes` off `key`'s pinned gauge.
    fn unpin(&self, key: Key, bytes: u64) {
        if let Some(r) = self.row(key) {
            r.pinned.fetch_sub(bytes, Relaxed);
        }
    }
}

static TABLE: Table<MAX_ROWS> = Table::new();

/// The statistics table.
pub(crate) fn table() -> &'static Table<MAX_ROWS> {
    &TABLE
}

/// Device memory of `provider` pinned while this lives (a registration or
/// an I/O in flight), shown as the provider's `pinned_bytes`.
pub(crate) struct Pinned {
    provider: u32,
    bytes: u64,
}

impl Pinned {
    pub(crate) fn new(provider: u32, bytes: u64) -> Self {
        // No row, nothing to undo.
        let bytes = if table().pin(Key::Provider(provider), bytes) {
            bytes
        } else {
            0
        };
        Self { provider, bytes }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.bytes != 0 {
            table().unpin(Key::Provider(self.provider), self.bytes);
        }
    }
}

/// A PCI address (`P2PDIRECT_PCI_ADDR`) printed as `dddd:bb:dd.f`.
pub(crate) struct Bdf(pub(crate) u32);

impl kernel::fmt::Display for Bdf {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

impl core::fmt::Display for Bdf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let a = self.0;
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{}",
            a >> 16,
            (a >> 8) & 0xff,
            (a >> 3) & 0x1f,
            a & 7
        )
    }
}

/// The debugfs file `p2pdirect/stats`: a table; writing anything resets.
pub(crate) struct DebugfsStats;

impl DebugfsStats {
    pub(crate) fn show(_: &Self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        writeln!(
            f,
            "{:<8} {:<12} {:>8} {:>8} {:>6} {:>14} {:>14} {:>14} {:>12} {:>12} {:>12} \
             {:>10} {:>10} {:>10}",
            "kind",
            "device",
            "reads",
            "writes",
            "errors",
            "bytes_read",
            "bytes_written",
            "p2p_bytes",
            "bounce_bytes",
            "zeroed_bytes",
            "pinned_bytes",
            "lat_min_us",
            "lat_avg_us",
            "lat_max_us"
        )?;
        for (k, c) in table().rows() {
            match k {
                Key::Provider(a) => write!(f, "{:<8} {:<12} ", "provider", Bdf(a))?,
                Key::Block(d) => write!(f, "{:<8} {:>5}:{:<6} ", "block", d >> 20, d & 0xfffff)?,
            }
            writeln!(
                f,
                "{:>8} {:>8} {:>6} {:>14} {:>14} {:>14} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
                c.reads,
                c.writes,
                c.errors,
                c.bytes_read,
                c.bytes_written,
                c.p2p,
                c.bounced,
                c.zeroed,
                c.pinned,
                c.lat_min_ns / 1000,
                c.lat_avg_ns() / 1000,
                c.lat_max_ns / 1000
            )?;
        }
        Ok(())
    }

    pub(crate) fn write(_: &Self, _: &mut kernel::uaccess::UserSliceReader) -> Result {
        table().reset();
        Ok(())
    }
}

#[kunit_tests(p2pdirect_stats)]
mod tests {
    use super::*;

    fn io(write: bool, ok: bool, bytes: u64, ns: u64) -> IoRecord {
        IoRecord {
            write,
            ok,
            bytes,
            p2p: bytes,
            bounced: 0,
            zeroed: 0,
            ns,
        }
    }

    fn rows<const N: usize>(t: &Table<N>) -> KVec<(Key, Counters)> {
        let mut v = KVec::new();
        for r in t.rows() {
            v.push(r, GFP_KERNEL).unwrap();
        }
        v
    }

    #[test]
    fn counts_and_latency() {
        let t = Table::<4>::new();
        let keys = [Some(Key::Provider(1)), Some(Key::Block(2))];
        t.add(&keys, &io(false, true, 4096, 300));
        t.add(&keys, &io(true, true, 8192, 100));
        t.add(&keys[1..], &io(false, false, 0, 200));
        let rows = rows(&t);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].0, rows[1].0), (Key::Provider(1), Key::Block(2)));
        let (p, b) = (&rows[0].1, &rows[1].1);
        assert_eq!((p.reads, p.writes, p.errors), (1, 1, 0));
        assert_eq!((p.bytes_read, p.bytes_written, p.p2p), (4096, 8192, 12288));
        assert_eq!(
            (p.lat_min_ns, p.lat_avg_ns(), p.lat_max_ns),
            (100, 200, 300)
        );
        assert_eq!((b.reads, b.errors, b.lat_avg_ns()), (2, 1, 200));
    }

    #[test]
    fn take_then_put_back_loses_nothing() {
        let t = Table::<4>::new();
        let k = [Some(Key::Block(7)), None];
        t.add(&k, &io(false, true, 4096, 50));
        let taken = t.take(MAX_ROWS).unwrap();
        assert_eq!(rows(&t)[0].1.reads, 0);
        t.add(&k, &io(true, true, 512, 10));
        t.put_back(&taken);
        let c = rows(&t)[0].1;
        assert_eq!(
            (c.reads, c.writes, c.bytes_read, c.bytes_written),
            (1, 1, 4096, 512)
        );
        assert_eq!((c.lat_min_ns, c.lat_max_ns, c.lat_avg_ns()), (10, 50, 30));
    }

    #[test]
    fn a_minimum_taken_by_another_reset_is_not_merged() {
        // Two resets at once: one took `lat_n`, the other the minimum.
        let t = Table::<4>::new();
        let k = [Some(Key::Block(3)), None];
        t.add(&k, &io(false, true, 4096, 30));
        let half = Counters {
            lat_n: 1,
            lat_sum_ns: 30,
            lat_min_ns: 0,
            lat_max_ns: 30,
            ..Counters::default()
        };
        t.put_back(&[(Key::Block(3), half)]);
        assert_eq!(rows(&t)[0].1.lat_min_ns, 30);
    }

    #[test]
    fn a_reset_between_an_ios_fields_loses_none_of_them() {
        // A reset took the count before an I/O added to it, and the sum
        // and extremes after: put back, all of that I/O is there.
        let t = Table::<4>::new();
        let k = [Some(Key::Block(5)), None];
        t.add(&k, &io(false, true, 4096, 40));
        let torn = Counters {
            lat_n: 0,
            lat_sum_ns: 40,
            lat_min_ns: 40,
            lat_max_ns: 40,
            ..Counters::default()
        };
        t.put_back(&[(Key::Block(5), torn)]);
        let c = rows(&t)[0].1;
        assert_eq!((c.lat_min_ns, c.lat_max_ns), (40, 40));
        assert_eq!(c.lat_sum_ns, 80);
    }

    #[test]
    fn reset_keeps_the_pinned_gauge() {
        let t = Table::<4>::new();
        t.add(&[Some(Key::Provider(7)), None], &io(false, true, 4096, 5));
        assert!(t.pin(Key::Provider(7), 1 << 20));
        t.reset();
        let c = rows(&t)[0].1;
        assert_eq!((c.reads, c.bytes_read, c.lat_max_ns), (0, 0, 0));
        assert_eq!(c.pinned, 1 << 20);
        t.unpin(Key::Provider(7), 1 << 20);
        assert_eq!(rows(&t)[0].1.pinned, 0);
    }

    #[test]
    fn a_full_table_counts_the_devices_it_has() {
        let t = Table::<2>::new();
        let io4k = io(false, true, 4096, 5);
        t.add(&[Some(Key::Block(1)), Some(Key::Provider(1))], &io4k);
        t.add(&[Some(Key::Block(2)), Some(Key::Provider(1))], &io4k);
        assert!(!t.pin(Key::Provider(2), 4096));
        let rows = rows(&t);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].0, rows[0].1.reads), (Key::Block(1), 1));
        assert_eq!((rows[1].0, rows[1].1.reads), (Key::Provider(1), 2));
    }

    #[test]
    fn keys_round_trip() {
        for k in [Key::Provider(0), Key::Block(0), Key::Block(u32::MAX)] {
            assert_ne!(k.encode(), 0);
            assert_eq!(Key::decode(k.encode()), Some(k));
        }
        assert_eq!(Key::decode(0), None);
    }
}
