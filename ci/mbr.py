#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Writes an MBR partition table (primary Linux partitions, 512-byte sectors)
into sector 0 of an image, leaving the rest of the image as it is.

Usage: mbr.py IMAGE START_MIB:SIZE_MIB...   (at most four partitions)"""
import struct
import sys

SECTORS_PER_MIB = 2048


def entry(start_mib, size_mib):
    start, count = start_mib * SECTORS_PER_MIB, size_mib * SECTORS_PER_MIB
    # Status, CHS of first sector (unused: 0xfe 0xff 0xff), type 0x83 (Linux),
    # CHS of last sector (unused), LBA of first sector, number of sectors.
    return struct.pack('<B3sB3sII', 0, b'\xfe\xff\xff', 0x83, b'\xfe\xff\xff', start, count)


def main(image, parts):
    if not 1 <= len(parts) <= 4:
        sys.exit('mbr.py: one to four partitions')
    table = b''
    for p in parts:
        start, size = (int(x) for x in p.split(':'))
        table += entry(start, size)
    table = table.ljust(64, b'\0')
    with open(image, 'r+b') as f:
        f.seek(446)
        f.write(table + b'\x55\xaa')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2:])
