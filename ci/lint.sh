#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Static checks, as a TAP suite: rustfmt and clippy on the module (clippy
# through Kbuild with Debian's clippy-driver, which matches the kernel's
# rustc) and on the userspace crate, the module's layering (layering.py),
# checkpatch on the C files.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/lib.sh"
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); echo "not ok $n - $*"; }
step() { # step DESCRIPTION COMMAND...: ok if it exits 0 and prints no warning
	desc=$1
	shift
	out=$("$@" 2>&1)
	rc=$?
	if [ "$rc" -eq 0 ] && ! echo "$out" | grep -qE '^(warning|error)(\[|:)'; then ok "$desc"; else
		notok "$desc"
		echo "$out" | grep -vE '^\s*$' | head -n 40 | sed 's/^/# /'
	fi
}

echo "# suite: host-lint"
ksrc=$("$here/fetch-kernel.sh")
kdir=$("$here/build-kernel.sh")
step "rustfmt: module" rustfmt --edition 2021 --config-path "$ksrc/.rustfmt.toml" --check \
	$(cd "$repo" && git ls-files -- "rust/*.rs" | sed "s|^|$repo/|")
step "clippy: module (Kbuild CLIPPY=1)" make -s -C "$kdir" M="$repo" LLVM="$LLVM" RUSTC="$KRUSTC" \
	BINDGEN="$BINDGEN" CLIPPY=1 CLIPPY_DRIVER=/usr/bin/clippy-driver modules
# Leave a module built without clippy behind, as `make` would.
make -s -C "$kdir" M="$repo" LLVM="$LLVM" RUSTC="$KRUSTC" BINDGEN="$BINDGEN" modules >/dev/null 2>&1
step "layering: rust/sys imports no domain module, no import cycle, no unsafe outside rust/sys" \
	python3 "$here/layering.py"
step "rustfmt: userspace crate" bash -c "cd '$repo/userspace-test/rust' && cargo fmt --check"
step "clippy: userspace crate" bash -c "cd '$repo/userspace-test/rust' && cargo clippy --quiet --all-targets -- -D warnings"
# The guest fails a run with fewer KUnit suites than it expects: the
# number it expects is the number the module has.
step "KUnit: ci/guest/guest-lib.sh expects as many suites as rust/ has" bash -c \
	"[ \$(grep -rho 'kunit_tests(p2pdirect_' '$repo/rust' | wc -l) -eq \
	   \$(sed -n 's/^kunit_expected=//p' '$repo/ci/guest/guest-lib.sh') ]"
for f in "$repo"/rust/ffi/shim.c "$repo"/include/uapi/linux/p2pdirect.h "$repo"/userspace-test/c/*.[ch] \
	"$repo"/testmod/*.c "$repo"/include/linux/p2pdirect.h; do
	# The kernel API's functions are defined in Rust; only their
	# EXPORT_SYMBOL_GPL lines are C (rust/ffi/shim.c), so none can follow
	# its function.
	extra=""
	[ "$f" != "$repo/rust/ffi/shim.c" ] || extra=,EXPORT_SYMBOL
	step "checkpatch: ${f#"$repo"/}" perl "$ksrc/scripts/checkpatch.pl" --no-tree --quiet --show-types \
		--ignore SPDX_LICENSE_TAG,FILE_PATH_CHANGES,NEW_TYPEDEFS$extra -f "$f"
done
echo "1..$n"
