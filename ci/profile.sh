#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make profile`: where the guest's CPU time goes in `p2pd bench` workloads.
# Runs each workload of P2PDIRECT_ONLY (comma-separated `path/workload` as
# `p2pd bench` names them, e.g. p2pdirect-uring/rand-read-4K-qd32; a default
# set of p2pdirect's and upstream's small and large reads otherwise) in the
# bench kernel under the host's perf, sampling every vCPU 4000 times a
# second, and leaves the busiest symbols of each (Rust names demangled) in
# results/profile-<date>/profile.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/lib.sh"
if ! command -v perf >/dev/null; then
	log "installing Debian's linux-perf (the guest runs the host's perf)"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends linux-perf \
		>/dev/null || die "apt-get install linux-perf failed"
fi
export P2PDIRECT_KERNEL=bench
run=$("$here/vm.sh" profile) || die "building or booting the VM failed"
out="$repo/results/profile-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
tr -d '\r' <"$run/tap.log" | "$here/demangle.py" >"$out/profile.txt"
"$here/calltree.py" "$out/profile.txt" >"$out/calltree.txt"
grep -v '^[0-9 ]*[0-9] ' "$out/profile.txt"
log "call trees under the syscalls: $out/calltree.txt"
"$here/vm-verdict.sh" "$run" | grep '^not ok' && die "the VM run had problems (see $run)"
grep -q 'FAILED' "$out/profile.txt" && die "a profile run failed (see $out/profile.txt)"
grep -q '^# PROFILE' "$out/profile.txt" || die "no profile in the guest output ($run/tap.log)"
log "results in $out"
