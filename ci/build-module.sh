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
	make -C "$KDIR" M="$repo" LLVM="$LLVM" RUSTC="$KRUSTC" BINDGEN="$BINDGEN" modules
	# The test modules use p2pdirect's kernel API: its symbols' versions.
	exec make -C "$KDIR" M="$repo/testmod" KBUILD_EXTRA_SYMBOLS="$repo/Module.symvers" \
		LLVM="$LLVM" RUSTC="$KRUSTC" BINDGEN="$BINDGEN" modules
fi
make -C "$KDIR" M="$repo" modules
exec make -C "$KDIR" M="$repo/testmod" KBUILD_EXTRA_SYMBOLS="$repo/Module.symvers" modules
