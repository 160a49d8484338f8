// SPDX-License-Identifier: GPL-2.0

//! Statistics per device-memory provider and per block device (the role of
//! /proc/driver/nvidia-fs/stats): operations, bytes by path (P2P, bounced,
//! CPU-zeroed), errors, pinned bytes, latency. Read through
//! `P2PDIRECT_IOC_STATS` and debugfs `p2pdirect/stats`; both can reset them.
//!
//! One table under one lock, updated once per I/O: the lock is held for a
//! few additions, never across I/O.

use kernel::prelude::*;

/// What a row counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// A device-memory provider, by the PCI address of its BAR's owner.
    Provider(u32),
    /// A block device, by `dev_t` (major << 20 | minor).
    Block(u32),
}

/// The counters of one row.
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
    fn reset(&mut self) {
        *self = Self {
            pinned: self.pinned,
            ..Self::default()
        };
    }

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

/// The rows.
pub(crate) struct Table {
    rows: KVec<(Key, Counters)>,
}

impl Table {
    pub(crate) const fn new() -> Self {
        Self { rows: KVec::new() }
    }

    fn row(&mut self, key: Key) -> Result<&mut Counters> {
        let i = match self.rows.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.rows.push((key, Counters::default()), GFP_KERNEL)?;
                self.rows.len() - 1
            }
        };
        Ok(&mut self.rows[i].1)
    }

    /// Adds one I/O to the rows of `keys` (a row that cannot be allocated
    /// misses the I/O; the I/O itself is not failed for it).
    pub(crate) fn add(&mut self, keys: &[Option<Key>], r: &IoRecord) {
        for key in keys.iter().flatten() {
            let Ok(c) = self.row(*key) else { continue };
            if r.write {
                c.writes += 1;
                c.bytes_written += r.bytes;
            } else {
                c.reads += 1;
                c.bytes_read += r.bytes;
            }
            c.errors += u64::from(!r.ok);
            c.p2p += r.p2p;
            c.bounced += r.bounced;
            c.zeroed += r.zeroed;
            c.lat_min_ns = if c.lat_n == 0 {
                r.ns
            } else {
                c.lat_min_ns.min(r.ns)
            };
            c.lat_max_ns = c.lat_max_ns.max(r.ns);
            c.lat_sum_ns = c.lat_sum_ns.saturating_add(r.ns);
            c.lat_n += 1;
        }
    }

    pub(crate) fn reset(&mut self) {
        for (_, c) in self.rows.iter_mut() {
            c.reset();
        }
    }

    /// Resets the counters and returns what they held (for [`Self::put_back`]).
    pub(crate) fn take(&mut self) -> Result<KVec<(Key, Counters)>> {
        let mut out = KVec::with_capacity(self.rows.len(), GFP_KERNEL)?;
        for r in self.rows.iter() {
            out.push(*r, GFP_KERNEL)?;
        }
        self.reset();
        Ok(out)
    }

    /// Adds counters taken by [`Self::take`] back (a reset that did not
    /// reach its caller), merged with what was counted since.
    pub(crate) fn put_back(&mut self, taken: KVec<(Key, Counters)>) {
        for (key, t) in taken.iter() {
            let Ok(c) = self.row(*key) else { continue };
            c.reads += t.reads;
            c.writes += t.writes;
            c.errors += t.errors;
            c.bytes_read += t.bytes_read;
            c.bytes_written += t.bytes_written;
            c.p2p += t.p2p;
            c.bounced += t.bounced;
            c.zeroed += t.zeroed;
            if t.lat_n != 0 {
                c.lat_min_ns = if c.lat_n == 0 {
                    t.lat_min_ns
                } else {
                    c.lat_min_ns.min(t.lat_min_ns)
                };
                c.lat_max_ns = c.lat_max_ns.max(t.lat_max_ns);
            }
            c.lat_sum_ns = c.lat_sum_ns.saturating_add(t.lat_sum_ns);
            c.lat_n += t.lat_n;
        }
    }

    pub(crate) fn rows(&self) -> &[(Key, Counters)] {
        &self.rows
    }
}

/// Device memory of `provider` pinned while this lives (a registration or
/// an I/O in flight), shown as the provider's `pinned_bytes`.
pub(crate) struct Pinned {
    provider: u32,
    bytes: u64,
}

impl Pinned {
    pub(crate) fn new(provider: u32, bytes: u64) -> Self {
        if let Ok(c) = table().row(Key::Provider(provider)) {
            c.pinned += bytes;
            return Self { provider, bytes };
        }
        // No row, nothing to undo.
        Self { provider, bytes: 0 }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        if let Ok(c) = table().row(Key::Provider(self.provider)) {
            c.pinned = c.pinned.saturating_sub(self.bytes);
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
            match *k {
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

    #[test]
    fn counts_and_latency() {
        let mut t = Table::new();
        let keys = [Some(Key::Provider(1)), Some(Key::Block(2))];
        t.add(&keys, &io(false, true, 4096, 300));
        t.add(&keys, &io(true, true, 8192, 100));
        t.add(&keys[1..], &io(false, false, 0, 200));
        let rows = t.rows();
        assert_eq!(rows.len(), 2);
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
        let mut t = Table::new();
        let k = [Some(Key::Block(7)), None];
        t.add(&k, &io(false, true, 4096, 50));
        let taken = t.take().unwrap();
        t.add(&k, &io(true, true, 512, 10));
        t.put_back(taken);
        let c = t.rows()[0].1;
        assert_eq!(
            (c.reads, c.writes, c.bytes_read, c.bytes_written),
            (1, 1, 4096, 512)
        );
        assert_eq!((c.lat_min_ns, c.lat_max_ns, c.lat_avg_ns()), (10, 50, 30));
    }

    #[test]
    fn reset_keeps_the_pinned_gauge() {
        let mut t = Table::new();
        t.add(&[Some(Key::Provider(7)), None], &io(false, true, 4096, 5));
        if let Ok(c) = t.row(Key::Provider(7)) {
            c.pinned = 1 << 20;
        }
        t.reset();
        let c = &t.rows()[0].1;
        assert_eq!((c.reads, c.bytes_read, c.lat_max_ns), (0, 0, 0));
        assert_eq!(c.pinned, 1 << 20);
    }
}

crate::sys::global::global_mutex! {
    static TABLE: Table = Table::new();
    /// The table's global: set up in module init before anything that
    /// counts, emptied after.
    pub(crate) struct Globals;
    /// The statistics table (a leaf lock).
    pub(crate) fn table;
}
