#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Tools of the test VM that busybox lacks, for the stacked block devices:
# mdadm (from Debian's package, unpacked into the cache: nothing is
# installed on the host) and dmsetup (installed by install-deps.sh). Prints
# a directory holding both.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

out="$P2P_CACHE/guest-tools"
if [ ! -x "$out/mdadm" ]; then
	log "fetching mdadm for the guest"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# The host's package index may be stale or empty: refresh it once if needed.
	(cd "$tmp" && apt-get download -qq mdadm 2>/dev/null) ||
		{ $SUDO apt-get update -qq && (cd "$tmp" && apt-get download -qq mdadm 2>/dev/null); } ||
		die "apt-get download mdadm failed"
	dpkg -x "$tmp"/mdadm_*.deb "$tmp/x"
	mkdir -p "$out"
	# Whole or not at all: a copy cut short (a full disk) is never taken
	# for the tool by the next run.
	cp "$tmp/x/sbin/mdadm" "$out/mdadm.tmp"
	mv -f "$out/mdadm.tmp" "$out/mdadm"
fi
cp /usr/sbin/dmsetup "$out/dmsetup"
echo "$out"
