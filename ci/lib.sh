# SPDX-License-Identifier: GPL-2.0
# Shared settings for the ci/ scripts. Sourced, never run.

# Cache outside the repo: kernel source, kernel builds, bindgen, VM scratch.
# Made absolute: kernel makes run with -C elsewhere. HOME unset (a bare
# container) is an error that says so.
P2P_CACHE=${P2PDIRECT_CACHE:-${XDG_CACHE_HOME:-${HOME:?is not set: set P2PDIRECT_CACHE or HOME}/.cache}/p2pdirect}
mkdir -p "$P2P_CACHE"
P2P_CACHE=$(cd "$P2P_CACHE" && pwd)
# mkfs.*, mdadm, losetup and the like live in sbin, which a non-root user's
# PATH may lack (they run through sudo, or as root).
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
case ":$PATH:" in *:/sbin:*) ;; *) PATH="$PATH:/sbin" ;; esac
# What runs as root (apt-get update and install) goes through $SUDO.
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

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

# lock_cache NAME: an exclusive lock on the cache entry NAME (a kernel's
# source, a build), held on fd 9 until the calling script and its children
# are gone; while another run (`make demo` beside `make check`) holds it,
# says so and waits.
lock_cache() {
	mkdir -p "$P2P_CACHE/locks"
	exec 9>"$P2P_CACHE/locks/$1.lock"
	flock -n 9 || {
		log "waiting for another run that is using $1"
		flock 9
	}
}

# need_space DIR MIB WHAT: stops, saying what and where, unless DIR's file
# system has MIB MiB free (a kernel source, a build or a run that fills
# the disk half way fails later with a message that does not say why).
need_space() {
	mkdir -p "$1"
	local free
	free=$(df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print int($4 / 1024) }') || free=
	[ -n "$free" ] || die "$3: the free space in $1 cannot be measured (df -Pk $1 failed)"
	[ "$free" -ge "$2" ] ||
		die "$3 needs about $2 MiB free in $1; its file system has $free MiB (free some, or point P2PDIRECT_CACHE at another disk)"
}

# prune_runs DIR KEEP: removes all but the KEEP newest subdirectories of DIR.
prune_runs() {
	[ -d "$1" ] || return 0
	find "$1" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\0' | sort -z -rn |
		tail -z -n +"$(($2 + 1))" | cut -z -d' ' -f2- | xargs -0 -r rm -rf
}
