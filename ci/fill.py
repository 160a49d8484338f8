#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The "fill" pattern the test disks and the storage tests share. Byte at
offset o for seed s (64-bit wrapping arithmetic):

    x = (o >> 3) * 0x9E3779B97F4A7C15 + s
    x ^= x >> 29;  x *= 0xBF58476D1CE4E5B9;  x ^= x >> 32
    byte = (x >> (8 * (o & 7))) & 0xff

so each aligned 8-byte word is x in little-endian order. The guest's copy is
fill_byte()/fill_buf() in userspace-test/c/nvme_util.h.

Usage: fill.py FILE SEED LEN [OFFSET]
    writes fill(o, SEED) for o in [OFFSET, OFFSET + LEN) at offset OFFSET of
    FILE (created if missing, never truncated)."""
import array
import os
import sys

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX = 0xBF58476D1CE4E5B9
CHUNK = 1 << 22


def fill_word(w, seed):
    """The 64-bit value of word w (bytes 8w .. 8w+7)."""
    x = (w * GOLDEN + seed) & MASK
    x ^= x >> 29
    x = (x * MIX) & MASK
    return x ^ (x >> 32)


def fill_byte(o, seed):
    return (fill_word(o >> 3, seed) >> (8 * (o & 7))) & 0xff


def fill_bytes(pos, length, seed):
    """fill(o, seed) for o in [pos, pos + length), as bytes (about 30 MB/s)."""
    if length <= 0:
        return b''
    w0 = pos >> 3
    w1 = (pos + length + 7) >> 3
    seed &= MASK

    def word(w):
        x = (w * GOLDEN + seed) & MASK
        x ^= x >> 29
        x = (x * MIX) & MASK
        return x ^ (x >> 32)

    words = array.array('Q', map(word, range(w0, w1)))
    if sys.byteorder != 'little':
        words.byteswap()
    skip = pos - (w0 << 3)
    return words.tobytes()[skip:skip + length]


def write_fill(path, seed, length, offset=0):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        done = 0
        while done < length:
            n = min(CHUNK, length - done)
            os.pwrite(fd, fill_bytes(offset + done, n, seed), offset + done)
            done += n
    finally:
        os.close(fd)


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    path, seed, length = argv[1], int(argv[2], 0), int(argv[3], 0)
    offset = int(argv[4], 0) if len(argv) == 5 else 0
    write_fill(path, seed, length, offset)


if __name__ == '__main__':
    main(sys.argv)
