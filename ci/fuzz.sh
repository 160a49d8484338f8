#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make fuzz`: boots the VM in fuzz mode (the debug kernel: KASAN, lockdep,
# kmemleak), loads the module, mounts ext4 and xfs, runs the ioctl fuzzer
# (userspace-test/c/fuzz_test.c) for FUZZ_SECONDS (default 600) with
# FUZZ_THREADS threads (default 4) and seed FUZZ_SEED (default: a new one,
# which the fuzzer prints first), then unloads the module and scans kmemleak.
# Prints the TAP and the console verdict, then `N passed, N failed`; exits
# non-zero on any failure. A failing seed replays with
#   FUZZ_SEED=N FUZZ_SECONDS=S make fuzz
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start=$(date +%s)

export FUZZ_SECONDS=${FUZZ_SECONDS:-600}
for v in FUZZ_SECONDS FUZZ_SEED FUZZ_THREADS; do
	val=${!v:-}
	[ -z "$val" ] || [[ "$val" =~ ^[0-9]+$ ]] || die "$v=$val: not a number"
done
# Boot, builds of what is missing, setup and teardown come on top of the
# fuzzing itself (whose watchdog gives up 30 s after its time).
export P2PDIRECT_VM_TIMEOUT=${P2PDIRECT_VM_TIMEOUT:-$((FUZZ_SECONDS + 600))}
[ "$P2PDIRECT_VM_TIMEOUT" -ge $((FUZZ_SECONDS + 180)) ] ||
	die "P2PDIRECT_VM_TIMEOUT=$P2PDIRECT_VM_TIMEOUT is too short for FUZZ_SECONDS=$FUZZ_SECONDS"

res=$(mktemp -d)
trap 'rm -rf "$res"' EXIT
log "fuzzing for $FUZZ_SECONDS s${FUZZ_SEED:+ with seed $FUZZ_SEED} (VM limit $P2PDIRECT_VM_TIMEOUT s)"
if run=$("$here/vm.sh" fuzz); then
	"$here/vm-verdict.sh" "$run" >"$res/vm.tap"
	tr -d '\r' <"$run/tap.log" >"$res/guest.tap"
else
	printf '# suite: vm\nnot ok 1 - building or booting the VM failed (see above)\n1..1\n' >"$res/vm.tap"
	: >"$res/guest.tap"
fi

cat "$res/guest.tap" "$res/vm.tap"
echo "# run dir: ${run:-none}; total wall time $(($(date +%s) - start)) s"
seed=$(sed -n 's/^# fuzz seed \([0-9]*\).*/\1/p' "$res/guest.tap" | head -n 1)
[ -z "$seed" ] ||
	echo "# fuzz seed $seed; replay: FUZZ_SEED=$seed FUZZ_SECONDS=$FUZZ_SECONDS${FUZZ_THREADS:+ FUZZ_THREADS=$FUZZ_THREADS} make fuzz"
"$here/tap-summary.py" "$res/guest.tap" "$res/vm.tap"
rc=$?
if [ "$rc" -ne 0 ] && [ -n "${run:-}" ] && [ -f "$run/console.log" ]; then
	echo "# last lines of the guest console ($run/console.log):"
	tail -n 30 "$run/console.log" | tr -d '\r' | sed 's/^/#   /'
	"$here/tap-summary.py" "$res/guest.tap" "$res/vm.tap" | tail -n 1
fi
exit "$rc"
