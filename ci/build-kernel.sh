#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Configures and builds the test kernel once per (kernel version, fragment,
# toolchain) and prints the build directory. A later call with the same inputs
# reuses the cached build. P2PDIRECT_KERNEL=bench builds the flavour without
# the debug options (ci/kernel-bench.config on top), for `make bench`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

"$here/install-deps.sh"
src=$("$here/fetch-kernel.sh")
toolchain="$($KRUSTC --version) | $(${LLVM}clang --version | head -n 1) | $("$BINDGEN" --version)"
flavor=${P2PDIRECT_KERNEL:-debug}
frags=("$here/kernel.config")
case "$flavor" in
debug) ;;
bench) frags+=("$here/kernel-bench.config") ;;
*) die "P2PDIRECT_KERNEL=$flavor: debug or bench" ;;
esac
# One run at a time builds a source and flavour (a changed fragment takes
# the last build of both over).
lock_cache "build-$(basename "$src")-$flavor"
key=$( { basename "$src"; cat "${frags[@]}" "$here/kernel-required.txt"; echo "$toolchain"; } |
	sha256sum | cut -c1-16)
out="$P2P_CACHE/build/$(basename "$src")-$key"

if [ -f "$out/.built" ]; then
	echo "$out"
	exit 0
fi

mkmake() { make -C "$src" O="$out" LLVM="$LLVM" RUSTC="$KRUSTC" BINDGEN="$BINDGEN" "$@"; }

log "configuring $(basename "$src") ($flavor) in $out"
# A build of these same inputs that was stopped (check-matrix's time budget
# stops a background build) goes on where it was: Kbuild is incremental.
if [ -f "$out/.config" ] && [ "$(cat "$out/.flavor" 2>/dev/null)" = "$flavor" ]; then
	log "going on with the unfinished build in $out"
	seed=""
else
	rm -rf "$out"
	# A changed fragment starts from the last build of the same source and
	# flavour, which it takes over (the cache keeps one build per source and
	# flavour): Kbuild then rebuilds only what the changed options reach.
	seed=$(ls -td "$P2P_CACHE/build/$(basename "$src")"-* 2>/dev/null |
		while read -r d; do
			[ -f "$d/.built" ] && [ "$(cat "$d/.flavor" 2>/dev/null)" = "$flavor" ] && { echo "$d"; break; }
		done || true)
	if [ -n "$seed" ]; then
		log "starting from $seed"
		rm -f "$seed/.built"
		mv "$seed" "$out"
	fi
fi
# A build from scratch takes about 0.9 GiB; one that goes on, or takes a
# seed over, holds most of that already.
[ -f "$out/.config" ] || need_space "$P2P_CACHE/build" 1500 "the kernel build $(basename "$out")"
mkdir -p "$out"
echo "$flavor" >"$out/.flavor"
mkmake -s tinyconfig >/dev/null
"$src/scripts/kconfig/merge_config.sh" -m -O "$out" "$out/.config" "${frags[@]}" >/dev/null
mkmake -s olddefconfig >/dev/null
mkmake -s rustavailable >/dev/null 2>&1 || {
	mkmake rustavailable || true
	die "the kernel does not accept this Rust toolchain (see above)"
}

missing=""
for opt in $(grep -v '^#' "$here/kernel-required.txt"); do
	# Options the flavour turns off on purpose are not required of it.
	cat "${frags[@]}" | grep -q "^$opt=n" && continue
	grep -q "^$opt=y" "$out/.config" || missing+=" $opt"
done
[ -z "$missing" ] || die "required options lost in olddefconfig:$missing (a dependency or the toolchain is missing)"

jobs=$(( $(nproc) + 1 ))
log "building kernel with $jobs jobs (about 12 min from scratch on 2 cores); log: $out/build.log"
start=$(date +%s)
set +e
mkmake -j"$jobs" bzImage modules 2>&1 | tee "$out/build.log" | {
	n=0
	while IFS= read -r line; do
		case "$line" in
		"  CC "* | "  RUSTC "* | "  LD "* | "  AR "* | "  AS "*)
			n=$((n + 1))
			[ $((n % 250)) -ne 0 ] ||
				printf '[p2pdirect]   %5d objects, %4ds: %s\n' "$n" $(($(date +%s) - start)) "$line" >&2 ;;
		*error:* | *"Error "[0-9]*) printf '%s\n' "$line" >&2 ;;
		esac
	done
}
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || die "kernel build failed (rc $rc); see $out/build.log"
log "kernel built in $(( $(date +%s) - start )) s"
touch "$out/.built"
echo "$out"
