#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Host-side tests of the CI's own judges, in TAP: the log scanner against
# recorded guest logs (pass-*.log must pass, fail-*.log must fail) and the TAP
# aggregator against crafted streams.
set -u
here=$(cd "$(dirname "$0")" && pwd)
ci=$(dirname "$here")
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $*"; }

echo "# suite: host-scan-log"
for f in "$here"/logs/*.log; do
	name=$(basename "$f" .log)
	"$ci/scan-log.sh" "$f" >/dev/null
	rc=$?
	case "$name" in
	pass-*) [ "$rc" -eq 0 ] && ok "scanner accepts $name" || notok "scanner accepts $name (rc $rc)" ;;
	fail-*) [ "$rc" -eq 1 ] && ok "scanner rejects $name" || notok "scanner rejects $name (rc $rc)" ;;
	esac
done
"$ci/scan-log.sh" /nonexistent >/dev/null 2>&1
[ $? -eq 2 ] && ok "scanner fails on an unreadable log" || notok "scanner fails on an unreadable log"
echo "1..$n"

echo "# suite: host-tap-summary"
n=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
summary() { # summary EXPECTED_RC EXPECTED_LINE DESCRIPTION < stream
	cat >"$tmp/tap"
	out=$("$ci/tap-summary.py" "$tmp/tap")
	rc=$?
	last=$(echo "$out" | tail -n 1)
	if [ "$rc" -eq "$1" ] && [ "$last" = "$2" ]; then ok "$3"; else
		notok "$3 (rc $rc, '$last')"
	fi
}
summary 0 "3 passed, 0 failed" "all ok, plans first and last" < <(printf '# suite: a\n1..2\nok 1 x\nok 2 - y\n# suite: b\nok 1 - z\n1..1\n')
summary 1 "1 passed, 1 failed" "a failed test fails the run" < <(printf '# suite: a\n1..2\nok 1 x\nnot ok 2 - y\n')
summary 1 "1 passed, 1 failed" "a suite that stops early fails" < <(printf '# suite: a\n1..3\nok 1 x\n')
summary 1 "1 passed, 1 failed" "a suite without a plan fails" < <(printf '# suite: a\nok 1 x\n')
summary 1 "1 passed, 1 failed" "a suite that exits non-zero with all ok fails" < <(printf '# suite: a\n1..1\nok 1 x\n# suite-exit: a 139\n')
summary 1 "0 passed, 0 failed" "no tests at all is not a pass" </dev/null
echo "1..$n"

echo "# suite: host-prune-runs"
n=0
. "$ci/lib.sh" 2>/dev/null
runs="$tmp/runs"
mkdir -p "$runs"
(set -euo pipefail; prune_runs "$runs" 9) && ok "pruning an empty run dir succeeds under set -e and pipefail" ||
	notok "pruning an empty run dir succeeds under set -e and pipefail"
for i in $(seq 1 12); do mkdir "$runs/r$i" && touch -d "@$((1000000 + i))" "$runs/r$i"; done
(set -euo pipefail; prune_runs "$runs" 9)
left=$(ls "$runs" | sort -V | tr '\n' ' ')
[ "$left" = "r4 r5 r6 r7 r8 r9 r10 r11 r12 " ] && ok "pruning keeps the 9 newest runs" ||
	notok "pruning keeps the 9 newest runs (left: $left)"
(set -euo pipefail; prune_runs "$tmp/missing" 9) && ok "pruning a missing dir is a no-op" ||
	notok "pruning a missing dir is a no-op"
echo "1..$n"

echo "# suite: host-hostcheck"
n=0
# A 1 MiB "GPU" with seed-7 pattern at 64 KiB, 4 KiB long, zero guards around.
python3 - "$tmp/gpu0.mem" <<'PY'
import sys
buf = bytearray(1 << 20)
buf[65536:65536 + 4096] = bytes(((i * 7 + 7 + (i >> 12)) & 0xff) for i in range(4096))
open(sys.argv[1], 'wb').write(buf)
PY
printf '# GPUMAP 0000:04:00.0 0000:02:01.0\n# HOSTCHECK gpu=0000:04:00.0 off=65536 len=4096 seed=7 guard=4096\n' >"$tmp/tap"
hostcheck() { "$ci/hostcheck.py" "$tmp/tap" "$tmp" | grep -c '^not ok'; }
[ "$(hostcheck)" = 0 ] && ok "hostcheck finds a recorded pattern" || notok "hostcheck finds a recorded pattern"
printf '\x01' | dd of="$tmp/gpu0.mem" bs=1 seek=$((65536 - 1)) conv=notrunc status=none
[ "$(hostcheck)" = 1 ] && ok "hostcheck sees a changed guard byte" || notok "hostcheck sees a changed guard byte"
printf '\x00' | dd of="$tmp/gpu0.mem" bs=1 seek=$((65536 - 1)) conv=notrunc status=none
printf '\x00' | dd of="$tmp/gpu0.mem" bs=1 seek=$((65536 + 100)) conv=notrunc status=none
[ "$(hostcheck)" = 1 ] && ok "hostcheck sees a wrong data byte" || notok "hostcheck sees a wrong data byte"
printf '# GPUMAP 0000:04:00.0 0000:02:01.0\n' >"$tmp/tap"
[ "$(hostcheck)" = 1 ] && ok "hostcheck fails when nothing was recorded" || notok "hostcheck fails when nothing was recorded"
echo "1..$n"
exit 0
