#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Builds p2pdirect.ko and the test modules (testmod/). With KDIR unset: against the cached test kernel (built
# first if needed) with the clang/Debian-rustc toolchain it was built with.
# With KDIR set: against that tree, with whatever LLVM/RUSTC the caller sets.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

if [ -z "${KDIR:-}" ]; then
	. "$here/lib.sh"
	"$here/install-deps.sh"
	KDIR=$("$here/build-kernel.sh")
	for m in "$repo" "$repo/testmod"; do
		make -C "$KDIR" M="$m" LLVM="$LLVM" RUSTC="$KRUSTC" BINDGEN="$BINDGEN" modules
	done
	exit 0
fi
for m in "$repo" "$repo/testmod"; do
	make -C "$KDIR" M="$m" modules
done
