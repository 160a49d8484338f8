# SPDX-License-Identifier: GPL-2.0
# Shared settings for the ci/ scripts. Sourced, never run.

# Cache outside the repo: kernel source, kernel builds, bindgen, VM scratch.
P2P_CACHE=${P2PDIRECT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2pdirect}
mkdir -p "$P2P_CACHE"

# The kernel and the module must be built by the same toolchain: Debian's rustc
# (it ships the core/alloc sources the kernel needs) and clang 19 (KASAN with
# Rust requires a clang-built kernel). Only kernel makes get KRUSTC, on their
# command line: userspace cargo builds keep the rustup toolchain (whose clippy
# must match the rustc that built the crate's dependencies).
KRUSTC=/usr/bin/rustc
export LIBCLANG_PATH=/usr/lib/llvm-19/lib
export LLVM=/usr/lib/llvm-19/bin/
export BINDGEN="$P2P_CACHE/cargo/bin/bindgen"
export PATH="$P2P_CACHE/cargo/bin:$PATH"

log() { printf '[p2pdirect] %s\n' "$*" >&2; }
die() { printf '[p2pdirect] error: %s\n' "$*" >&2; exit 1; }

# prune_runs DIR KEEP: removes all but the KEEP newest subdirectories of DIR.
prune_runs() {
	[ -d "$1" ] || return 0
	find "$1" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn |
		tail -n +"$(($2 + 1))" | cut -d' ' -f2- | xargs -r rm -rf
}
