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
dma=$(sed -n 's/.*-> gpu:\([^:]*:[^ ]*\) \(.*\): \([0-9]*\) commands, \([0-9]*\) data pointers, all in BAR2 \(.*\)$/\3 \4 \1 \5/p' \
	"$run/host.tap")
echo
if [ "$fails" -eq 0 ] && [ -n "$dma" ]; then
	echo "$dma" | awk '{ c += $1; p += $2; g = $3; w = $4 " " $5 }
		END { printf "proof: %d NVMe commands of the P2P I/O, %d DMA data pointers, all inside GPU %s BAR2 %s; no pointer in guest RAM\n", c, p, g, w }'
	echo "proof: the GPU's memory file matches the NVMe image byte for byte, and the image holds what the GPU wrote"
	echo "demo: PASSED (run dir $run)"
	exit 0
fi
echo "demo: FAILED ($fails failed checks; run dir $run)"
exit 1
