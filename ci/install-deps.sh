#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Installs the host toolchain p2pdirect needs. Idempotent and quiet when all is present.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

pkgs=(rustc-web rust-web-src rust-web-clippy libclang-19-dev clang-19 lld-19 llvm-19
      qemu-system-x86 busybox-static bc bison flex libelf-dev libssl-dev
      cpio kmod xz-utils python3 gcc make librsvg2-bin e2fsprogs xfsprogs dmsetup liburing-dev)
# cargo builds bindgen-cli and the userspace crate: rustup's if it is on the
# PATH, else Debian's (cargo-web, the same release as rustc-web); rustfmt
# for the lint likewise.
command -v cargo >/dev/null || pkgs+=(cargo-web)
command -v rustfmt >/dev/null || pkgs+=(rustfmt-web)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' ||
		missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing Debian packages: ${missing[*]}"
	$SUDO apt-get update -qq
	# One retry: an interrupted dpkg run leaves work that a second pass finishes.
	for try in 1 2; do
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
			"${missing[@]}" >/dev/null && break
		[ "$try" = 2 ] && die "apt-get install failed"
		$SUDO dpkg --configure -a || true
	done
fi

# The kernel's minimum bindgen for 7.2; cargo keeps it in the cache, not in ~/.cargo.
want_bindgen=0.71.1
if ! "$BINDGEN" --version 2>/dev/null | grep -q "$want_bindgen"; then
	log "building bindgen-cli $want_bindgen (about 75 s)"
	command -v cargo >/dev/null || die "cargo not found (rustup's, or Debian's cargo-web)"
	cargo install --quiet --locked --root "$P2P_CACHE/cargo" "bindgen-cli@$want_bindgen"
fi
"$BINDGEN" --version >/dev/null || die "bindgen not usable at $BINDGEN"
