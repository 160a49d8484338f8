#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make demo`, the main job: boots the VM, writes a data set to the NVMe,
# reads it into emulated GPU memory with p2pdirect, writes it back, checks it
# in the guest, then here on the host against the disk image, the GPU's
# backing file and QEMU's NVMe DMA trace; shows the paths compared.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
run=$("$here/vm.sh" demo) || die "building or booting the VM failed"
tr -d '\r' <"$run/tap.log" >"$run/demo.log"
echo "== p2pdirect demo (guest report) =="
grep -v '^# \(GPUMAP\|GPUBAR\|NSDEV\|HOSTCHECK\|NVMECHECK\|DMACHECK\)' "$run/demo.log"
echo
echo "== host-side checks =="
"$here/hostcheck.py" "$run/demo.log" "$run" >"$run/host.tap"
grep -E '^(not )?ok' "$run/host.tap" | sed 's/^/  /'
"$here/vm-verdict.sh" "$run" | grep -E '^(not )?ok' | sed 's/^/  /'
fails=$(cat "$run/host.tap" <("$here/vm-verdict.sh" "$run") | grep -c '^not ok')
# A step of the guest's report that failed fails the demo too.
guest_fails=$(grep -cE '^(module: insmod FAILED|p2pd (bench|verify): FAILED)' "$run/demo.log")
fails=$((fails + guest_fails))
# The DMACHECK lines of host.tap: "... -> gpu:BDF[ (reads only)]: N commands, N data pointers, all in BAR2 [..]".
proof=$(python3 - "$run/host.tap" <<'PY'
import re, sys
cmds = ptrs = 0
where = set()
for line in open(sys.argv[1]):
    m = re.match(r'^ok \d+ - ns\d+ .* -> gpu:(\S+?)(?: \(\w+ only\))?: (\d+) commands, (\d+) data pointers, all in BAR2 (.*)$', line)
    if m:
        cmds += int(m.group(2))
        ptrs += int(m.group(3))
        where.add(f'GPU {m.group(1)} BAR2 {m.group(4)}')
if cmds:
    print(f'proof: {cmds} NVMe commands of the P2P I/O, {ptrs} DMA data pointers, all inside '
          f'{", ".join(sorted(where))}; no pointer in guest RAM')
PY
)
echo
if [ "$fails" -eq 0 ] && [ -n "$proof" ]; then
	echo "$proof"
	echo "proof: the GPU's memory file matches the NVMe image byte for byte, and the image holds what the GPU wrote"
	echo "demo: PASSED (run dir $run)"
	exit 0
fi
echo "demo: FAILED ($fails failed checks; run dir $run)"
exit 1
