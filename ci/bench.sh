#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make bench`: runs `p2pd bench` in the VM and leaves bench.json, bench.txt,
# bench.svg and bench.png in results/bench-<date>/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/lib.sh"
# The benchmark kernel: the test kernel without KASAN, lockdep and kmemleak.
export P2PDIRECT_KERNEL=bench
run=$("$here/vm.sh" bench) || die "building or booting the VM failed"
out="$repo/results/bench-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
tr -d '\r' <"$run/tap.log" >"$out/guest.log"
sed -n '/^# BENCH-JSON-BEGIN$/,/^# BENCH-JSON-END$/p' "$out/guest.log" | sed '1d;$d' >"$out/bench.json"
sed '/^# BENCH-JSON-BEGIN$/,$d' "$out/guest.log" | grep -v '^\[' >"$out/bench.txt"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out/bench.json" 2>/dev/null || {
	grep -v '^#' "$out/bench.txt" | tail -20 >&2
	die "no benchmark results in the guest output ($run/tap.log)"
}
"$here/chart.py" "$out/bench.json" "$out/bench.svg"
rsvg-convert -o "$out/bench.png" "$out/bench.svg" || log "rsvg-convert failed: no PNG"
cat "$out/bench.txt"
{ echo "machine (host): $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "accelerator: $(cat "$run/qemu.cmd" | grep -o 'accel [a-z,=]*')"; } | tee -a "$out/bench.txt"
"$here/vm-verdict.sh" "$run" | grep '^not ok' && die "the VM run had problems (see $run)"
log "results in $out"
