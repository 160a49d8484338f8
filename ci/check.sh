#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make check`: host-side tests, then the guest tests in the VM. Prints every
# TAP stream, then `N passed, N failed`; exits non-zero on any failure.
# P2PDIRECT_KERNEL_SERIES (make's KVER) picks the kernel, P2PDIRECT_IOMMU=1
# (make's IOMMU=1) the VM with an IOMMU; P2PDIRECT_SKIP_HOST=1 and
# P2PDIRECT_SKIP_LINT=1 leave out the host tests and the lint (check-matrix.sh
# runs the host tests once and the lint once per kernel series).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start=$(date +%s)
res=$(mktemp -d)
trap 'rm -rf "$res"' EXIT

: >"$res/host.tap"
[ "${P2PDIRECT_SKIP_HOST:-0}" = 1 ] || "$here/tests/host-tests.sh" >>"$res/host.tap"
[ "${P2PDIRECT_SKIP_LINT:-0}" = 1 ] || "$here/lint.sh" >>"$res/host.tap"
if run=$("$here/vm.sh" check); then
	"$here/vm-verdict.sh" "$run" >"$res/vm.tap"
	tr -d '\r' <"$run/tap.log" >"$res/guest.tap"
	# hostcheck.py exits 0 also when its checks fail (they are its TAP); a
	# crash of its own loses them all, so it counts as a failure.
	"$here/hostcheck.py" "$res/guest.tap" "$run" >>"$res/vm.tap" || {
		hc=$?
		printf '# suite: hostcheck\nnot ok 1 - hostcheck.py itself failed (rc %s; see above)\n1..1\n' \
			"$hc" >>"$res/vm.tap"
	}
else
	printf '# suite: vm\nnot ok 1 - building or booting the VM failed (see above)\n1..1\n' >"$res/vm.tap"
	: >"$res/guest.tap"
fi

cat "$res/host.tap" "$res/guest.tap" "$res/vm.tap"
echo "# run dir: ${run:-none}; total wall time $(($(date +%s) - start)) s"
"$here/tap-summary.py" "$res/host.tap" "$res/vm.tap" "$res/guest.tap"
rc=$?
if [ "$rc" -ne 0 ] && [ -n "${run:-}" ] && [ -f "$run/console.log" ]; then
	seed=$(sed -n 's/^# fuzz seed \([0-9]*\).*/\1/p' "$res/guest.tap" | head -n 1)
	[ -z "$seed" ] || echo "# the fuzzer ran with seed $seed; replay: FUZZ_SEED=$seed make check, or FUZZ_SEED=$seed FUZZ_SECONDS=75 make fuzz"
	echo "# last lines of the guest console ($run/console.log):"
	tail -n 30 "$run/console.log" | tr -d '\r' | sed 's/^/#   /'
	"$here/tap-summary.py" "$res/host.tap" "$res/vm.tap" "$res/guest.tap" | tail -n 1
fi
exit "$rc"
