#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host-side proof of where the guest's bytes went. For every
'# HOSTCHECK gpu=BDF off=N len=N seed=N guard=N' line in the guest's TAP, the
emulated GPU's backing file must hold the pattern at that offset and zeros in
the guard bytes on each side. '# GPUMAP BDF PORT' lines say which switch
downstream port (device 1: gpu0, device 2: gpu1) each GPU hangs off.

Usage: hostcheck.py GUEST_TAP RUN_DIR    Prints a TAP suite 'host-devmem'."""
import os
import re
import sys


def pattern(length, seed):
    return bytes(((i * 7 + seed + (i >> 12)) & 0xff) for i in range(length))


def main(tap_path, run_dir):
    text = open(tap_path, errors='replace').read()
    gpumap = {}
    for bdf, port in re.findall(r'^# GPUMAP (\S+) (\S+)', text, re.M):
        dev = int(port.split(':')[2].split('.')[0], 16)
        gpumap[bdf] = os.path.join(run_dir, f'gpu{dev - 1}.mem')
    checks = re.findall(
        r'^# HOSTCHECK gpu=(\S+) off=(\d+) len=(\d+) seed=(\d+) guard=(\d+)', text, re.M)
    print('# suite: host-devmem')
    n = 0
    for bdf, off, length, seed, guard in checks:
        off, length, seed, guard = int(off), int(length), int(seed), int(guard)
        n += 1
        path = gpumap.get(bdf)
        what = f'{bdf} [{off:#x}, +{length:#x}) seed {seed:#x}'
        if not path or not os.path.exists(path):
            print(f'not ok {n} - {what}: no backing file for this GPU ({path})')
            continue
        with open(path, 'rb') as f:
            f.seek(max(0, off - guard))
            lo = f.read(min(guard, off))
            data = f.read(length)
            hi = f.read(guard)
        bad = sum(a != b for a, b in zip(data, pattern(length, seed))) + abs(len(data) - length)
        dirty = sum(1 for b in lo + hi if b)
        if bad == 0 and dirty == 0:
            print(f'ok {n} - {what} found in {os.path.basename(path)}'
                  + (f', {guard} guard bytes each side untouched' if guard else ''))
        else:
            print(f'not ok {n} - {what}: {bad} bytes differ, {dirty} guard bytes changed')
    if n == 0:
        print('not ok 1 - no HOSTCHECK records in the guest output')
        n = 1
    print(f'1..{n}')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
