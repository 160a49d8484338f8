// SPDX-License-Identifier: GPL-2.0

//! First-fit allocator of aligned ranges within `[0, size)`: the bookkeeping
//! of a provider's device memory. Pure logic; no locking (the owner locks).

use kernel::prelude::*;

/// One allocated range and what its owner keeps with it.
pub(crate) struct Range<T> {
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) tag: T,
}

/// # Invariants
///
/// `used` is sorted by `start`, its ranges do not overlap, each lies within
/// `[0, size)` and has `len > 0`.
pub(crate) struct RangeAllocator<T> {
    size: u64,
    used: KVVec<Range<T>>,
}

impl<T> RangeAllocator<T> {
    pub(crate) fn new(size: u64) -> Self {
        // INVARIANT: no ranges yet.
        Self {
            size,
            used: KVVec::new(),
        }
    }

    /// Total bytes managed.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Bytes allocated now.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.iter().map(|r| r.len).sum()
    }

    /// Allocates `len` bytes aligned to `align` (a power of two): the lowest
    /// fitting address. `EINVAL` for a zero length or a bad alignment,
    /// `ENOMEM` when no gap is large enough.
    pub(crate) fn alloc(&mut self, len: u64, align: u64, tag: T) -> Result<u64> {
        if len == 0 || !align.is_power_of_two() {
            return Err(EINVAL);
        }
        let mut cursor = 0u64;
        let mut slot = self.used.len();
        for (i, r) in self.used.iter().enumerate() {
            let start = cursor.checked_next_multiple_of(align).ok_or(ENOMEM)?;
            if start.checked_add(len).is_some_and(|end| end <= r.start) {
                slot = i;
                cursor = start;
                break;
            }
            cursor = r.start + r.len;
        }
        if slot == self.used.len() {
            cursor = cursor.checked_next_multiple_of(align).ok_or(ENOMEM)?;
            if cursor.checked_add(len).is_none_or(|end| end > self.size) {
                return Err(ENOMEM);
            }
        }
        self.used.reserve(1, GFP_KERNEL)?;
        // INVARIANT: `[cursor, cursor + len)` lies in the gap before `slot`
        // (or after the last range, within `size`), so order and disjointness hold.
        self.used
            .insert_within_capacity(
                slot,
                Range {
                    start: cursor,
                    len,
                    tag,
                },
            )
            .map_err(|_| ENOMEM)?;
        Ok(cursor)
    }

    /// Frees the range that starts at `start`; `ENOENT` if there is none.
    pub(crate) fn free(&mut self, start: u64) -> Result<Range<T>> {
        let i = self
            .used
            .iter()
            .position(|r| r.start == start)
            .ok_or(ENOENT)?;
        self.used.remove(i).map_err(|_| ENOENT)
    }

    /// Removes every range (the memory went away).
    pub(crate) fn clear(&mut self) {
        self.used.clear();
    }
}

#[cfg(CONFIG_KUNIT)]
#[kernel::macros::kunit_tests(p2pdirect_range_alloc)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn first_fit_and_reuse() {
        let mut a = RangeAllocator::new(16 * M);
        assert_eq!(a.alloc(4 * M, 4096, 1), Ok(0));
        assert_eq!(a.alloc(4 * M, 4096, 2), Ok(4 * M));
        assert_eq!(a.alloc(4 * M, 4096, 3), Ok(8 * M));
        assert_eq!(a.used_bytes(), 12 * M);
        assert_eq!(a.free(4 * M).map(|r| r.tag), Ok(2));
        // The hole is reused first; a larger request goes after the end.
        assert_eq!(a.alloc(5 * M, 4096, 4).err(), Some(ENOMEM));
        assert_eq!(a.alloc(2 * M, 4096, 5), Ok(4 * M));
        assert_eq!(a.alloc(4 * M, 4096, 6), Ok(12 * M));
        assert_eq!(a.alloc(2 * M, 4096, 7), Ok(6 * M));
        assert_eq!(a.used_bytes(), 16 * M);
        assert_eq!(a.alloc(4096, 4096, 8).err(), Some(ENOMEM));
    }

    #[test]
    fn alignment() {
        let mut a = RangeAllocator::new(64 * M);
        assert_eq!(a.alloc(4096, 4096, ()), Ok(0));
        assert_eq!(a.alloc(4096, 8 * M, ()), Ok(8 * M));
        // The gap before 8 MiB still serves small requests.
        assert_eq!(a.alloc(4096, 4096, ()), Ok(4096));
        // An alignment past the end fails cleanly.
        assert_eq!(a.alloc(4096, 64 * M, ()).err(), Some(ENOMEM));
    }

    #[test]
    fn bad_input_and_double_free() {
        let mut a = RangeAllocator::new(M);
        assert_eq!(a.alloc(0, 4096, ()).err(), Some(EINVAL));
        assert_eq!(a.alloc(4096, 3, ()).err(), Some(EINVAL));
        assert_eq!(a.alloc(u64::MAX, 4096, ()).err(), Some(ENOMEM));
        assert_eq!(a.alloc(4096, 4096, ()), Ok(0));
        assert!(a.free(0).is_ok());
        assert_eq!(a.free(0).err(), Some(ENOENT));
        assert_eq!(a.free(123).err(), Some(ENOENT));
    }
}
