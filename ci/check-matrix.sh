#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make check-matrix` (what CI runs): `make check` in every tested
# configuration, one after the other:
#   <default series> debug                  host tests, lint, the VM suite
#   <default series> debug, IOMMU on        the VM suite with QEMU's intel-iommu
#   <each other series> debug               lint and the VM suite
# (series: ci/kernel-series.txt). Prints each configuration's TAP and closing
# line, then one line per configuration and the total `N passed, N failed`.
#
# Time budget: P2PDIRECT_CI_BUDGET seconds (default 5100 under CI=true, whose
# run is stopped at 90 min; none otherwise). Each guest's time limit is at
# most what is left of it when its configuration starts, less 2 minutes, and
# a configuration that cannot finish in what is left (its kernel still
# building, or less time than the first configuration took) is skipped with
# the reason and counted as skipped, not run into the limit (on a slow host
# with an empty cache the two kernel builds alone can take most of it).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start=$(date +%s)
budget=${P2PDIRECT_CI_BUDGET:-}
[ -n "$budget" ] || [ "${CI:-}" != true ] || budget=5100
case "$budget" in '' | *[!0-9]*) budget="" ;; *) budget=$((10#$budget)) ;; esac
# Seconds of the budget left (a large number without one).
left() { if [ -n "$budget" ]; then echo $((budget - ($(date +%s) - start))); else echo 999999; fi; }
res=$(mktemp -d)
# The background build runs in its own session: stopping the matrix stops
# the whole build (make and its compilers), not only the loop around it.
trap 'rm -rf "$res"; [ -z "${bg:-}" ] || kill -- -"$bg" 2>/dev/null' EXIT
rc=0

mapfile -t series < <(grep -v '^#' "$here/kernel-series.txt")
configs=("${series[0]} debug|P2PDIRECT_KERNEL_SERIES=${series[0]}"
	"${series[0]} debug, IOMMU|P2PDIRECT_KERNEL_SERIES=${series[0]} P2PDIRECT_IOMMU=1 P2PDIRECT_SKIP_HOST=1 P2PDIRECT_SKIP_LINT=1 P2PDIRECT_SCALE=0")
for s in "${series[@]:1}"; do
	configs+=("$s debug|P2PDIRECT_KERNEL_SERIES=$s P2PDIRECT_SKIP_HOST=1 P2PDIRECT_SCALE=0")
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
first_secs=0
for c in "${configs[@]}"; do
	name=${c%%|*}
	i=$((i + 1))
	# What a configuration needs of the budget: as long as the first took.
	need=$first_secs
	# The other series need their kernel: wait for the background build,
	# while the budget leaves time to run after it.
	if [ -n "$bg" ] && [ "$i" -gt 2 ]; then
		while kill -0 "$bg" 2>/dev/null && [ "$(left)" -gt "$need" ]; do
			sleep 10
		done
		if kill -0 "$bg" 2>/dev/null; then
			kill -- -"$bg" 2>/dev/null
			wait "$bg" 2>/dev/null
			bg=""
			sed 's/^/# background kernel build: /' "$P2P_CACHE/bg-build.log"
			why="its kernel was still building with $(left) s of the ${budget} s budget left"
			echo "# ===== configuration $i: $name: SKIPPED: $why ====="
			# The build's tree stays: the next run goes on from it.
			log "warning: configuration $i ($name) skipped: $why"
			echo "$name|SKIPPED: $why|0" >>"$res/lines"
			continue
		fi
		wait "$bg"
		bg=""
		sed 's/^/# background kernel build: /' "$P2P_CACHE/bg-build.log"
	fi
	if [ "$(left)" -le "$need" ]; then
		why="$(left) s of the ${budget} s budget left, the first configuration took $first_secs s"
		echo "# ===== configuration $i: $name: SKIPPED: $why ====="
		log "warning: configuration $i ($name) skipped: $why"
		echo "$name|SKIPPED: $why|0" >>"$res/lines"
		continue
	fi
	t=$(date +%s)
	echo "# ===== configuration $i: $name ====="
	# The guest's own limit is at most what is left of the budget now,
	# less 2 minutes (the builds and lint before the guest come out of
	# those; what they take beyond is not accounted for).
	vmt=()
	if [ -n "$budget" ]; then
		lim=$(($(left) - 120))
		[ "$lim" -lt "${P2PDIRECT_VM_TIMEOUT:-$((1500 + ${FUZZ_SECONDS:-0}))}" ] &&
			vmt=(P2PDIRECT_VM_TIMEOUT="$((lim > 60 ? lim : 60))")
	fi
	env ${c#*|} "${vmt[@]}" "$here/check.sh" | tee "$res/$i.out"
	[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
	secs=$(($(date +%s) - t))
	[ "$i" -gt 1 ] || first_secs=$secs
	echo "$name|$(tail -n 1 "$res/$i.out")|$secs" >>"$res/lines"
done

echo "# ===== all configurations ($(($(date +%s) - start)) s) ====="
passed=0
failed=0
skipped=0
while IFS='|' read -r name line secs; do
	echo "# $name: $line ($secs s)"
	case "$line" in SKIPPED:*)
		skipped=$((skipped + 1))
		continue ;;
	esac
	p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
	f=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
	# A configuration that printed no closing line failed as a whole.
	[ -n "$p" ] || { p=0; f=1; rc=1; }
	passed=$((passed + p))
	failed=$((failed + f))
done <"$res/lines"
# A skipped configuration counts once among the skipped (its tests are
# not counted: they did not run).
if [ "$skipped" -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ] || rc=1
exit "$rc"
