#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# TAP suite "vm" for a finished VM run: it ran to its own power-off within the
# time limit, and its console log has no kernel complaint.
# Usage: vm-verdict.sh RUN_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
run=$1
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); echo "not ok $n - $*"; }

echo "# suite: vm"
read -r rc secs limit <"$run/qemu.rc" 2>/dev/null || { rc=255; secs=0; }
case "$rc" in
0) ok "QEMU exited by itself after ${secs} s" ;;
124) notok "guest timed out after ${secs} s (P2PDIRECT_VM_TIMEOUT)" ;;
# SIGKILL: timeout's -k at the limit (QEMU ignored SIGTERM), or another
# killer (the OOM killer) before it.
137) if [ "$secs" -ge "${limit:-0}" ]; then
	notok "guest timed out after ${secs} s (P2PDIRECT_VM_TIMEOUT), killed"
else
	notok "QEMU was killed (SIGKILL: the OOM killer?) after ${secs} s, before the ${limit} s limit"
fi ;;
*) notok "QEMU failed (rc $rc): $(tail -n 3 "$run/qemu.out" | tr '\n' ' ')" ;;
esac
if grep -q 'reboot: Power down' "$run/console.log" 2>/dev/null; then
	ok "guest powered off"
else
	notok "guest never powered off (panic, hang or crash of init)"
fi
if complaints=$("$here/scan-log.sh" "$run/console.log"); then
	ok "guest console: no oops/panic/BUG/WARNING/KASAN/lockdep/kmemleak report"
else
	notok "guest console has kernel complaints"
	echo "$complaints" | head -n 40 | sed 's/^/# /'
fi
echo "1..$n"
