#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make check-matrix` (what CI runs): `make check` in every tested
# configuration, one after the other:
#   <default series> debug                  host tests, lint, the VM suite
#   <default series> debug, IOMMU on        the VM suite with QEMU's intel-iommu
#   <each other series> debug               lint and the VM suite
# (series: ci/kernel-series.txt). Prints each configuration's TAP and closing
# line, then one line per configuration and the total `N passed, N failed`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start=$(date +%s)
res=$(mktemp -d)
# The background build runs in its own session: stopping the matrix stops
# the whole build (make and its compilers), not only the loop around it.
trap 'rm -rf "$res"; [ -z "${bg:-}" ] || kill -- -"$bg" 2>/dev/null' EXIT
rc=0

mapfile -t series < <(grep -v '^#' "$here/kernel-series.txt")
configs=("${series[0]} debug|P2PDIRECT_KERNEL_SERIES=${series[0]}"
	"${series[0]} debug, IOMMU|P2PDIRECT_KERNEL_SERIES=${series[0]} P2PDIRECT_IOMMU=1 P2PDIRECT_SKIP_HOST=1 P2PDIRECT_SKIP_LINT=1")
for s in "${series[@]:1}"; do
	configs+=("$s debug|P2PDIRECT_KERNEL_SERIES=$s P2PDIRECT_SKIP_HOST=1")
done

# The default kernel first; then the other series' kernels build in the
# background, niced, while the default one's configurations run (one kernel
# build at a time; the VM runs on one host thread). A failed background build
# is retried, with its errors, when its configuration starts.
P2PDIRECT_KERNEL_SERIES=${series[0]} "$here/build-kernel.sh" >/dev/null || rc=1
bg=""
if [ ${#series[@]} -gt 1 ]; then
	log "building the kernels of ${series[*]:1} in the background (log: $P2P_CACHE/bg-build.log)"
	setsid bash -c 'b=$1; shift
		for s in "$@"; do
			P2PDIRECT_KERNEL_SERIES=$s nice -n 19 "$b" >/dev/null || true
		done' bg-build "$here/build-kernel.sh" "${series[@]:1}" \
		>"$P2P_CACHE/bg-build.log" 2>&1 &
	bg=$!
fi

i=0
for c in "${configs[@]}"; do
	name=${c%%|*}
	i=$((i + 1))
	# The other series need their kernel: wait for the background build.
	if [ -n "$bg" ] && [ "$i" -gt 2 ]; then
		wait "$bg"
		bg=""
		sed 's/^/# background kernel build: /' "$P2P_CACHE/bg-build.log"
	fi
	t=$(date +%s)
	echo "# ===== configuration $i: $name ====="
	env ${c#*|} "$here/check.sh" | tee "$res/$i.out"
	[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
	echo "$name|$(tail -n 1 "$res/$i.out")|$(($(date +%s) - t))" >>"$res/lines"
done

echo "# ===== all configurations ($(($(date +%s) - start)) s) ====="
passed=0
failed=0
while IFS='|' read -r name line secs; do
	echo "# $name: $line ($secs s)"
	p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
	f=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
	# A configuration that printed no closing line failed as a whole.
	[ -n "$p" ] || { p=0; f=1; rc=1; }
	passed=$((passed + p))
	failed=$((failed + f))
done <"$res/lines"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || rc=1
exit "$rc"
