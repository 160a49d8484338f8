#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# `make demo`: boots the VM, loads the module and reports what it found.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
run=$("$here/vm.sh" demo) || die "building or booting the VM failed"
echo "== p2pdirect demo (guest report) =="
tr -d '\r' <"$run/tap.log"
echo "== host-side verdict =="
"$here/vm-verdict.sh" "$run" | grep -v '^1\.\.'
"$here/vm-verdict.sh" "$run" | grep -q '^not ok' && exit 1
exit 0
