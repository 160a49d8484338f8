#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Fetches Debian's newest linux-source-SERIES (SERIES: $P2PDIRECT_KERNEL_SERIES,
# default the first line of ci/kernel-series.txt) through a private apt list
# of sid, trixie-backports and experimental (nothing is installed
# system-wide), keeps the package and unpacks it into the cache. When the
# mirror no longer offers the series (or cannot be reached), the newest
# source of that series already in the cache is used. Prints the source dir.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
"$(dirname "$0")/install-deps.sh"

series_list=$(grep -v '^#' "$(dirname "$0")/kernel-series.txt" | tr '\n' ' ')
series=${P2PDIRECT_KERNEL_SERIES:-${series_list%% *}}
case " $series_list " in *" $series "*) ;; *) die "kernel series '$series' is not one of: $series_list(ci/kernel-series.txt)" ;; esac
# One run at a time refreshes the private index and unpacks a source (apt
# runs without its own locks here).
lock_cache apt
apt_dir="$P2P_CACHE/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$P2P_CACHE/src"

# Take the mirror the machine already uses; the repo names no host.
mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || die "no Debian mirror configured in /etc/apt (sources.list.d/debian.sources or sources.list)"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat > "$apt_dir/sources.list" <<LIST
deb [signed-by=$keyring] $mirror sid main
deb [signed-by=$keyring] $mirror trixie-backports main
deb [signed-by=$keyring] $mirror experimental main
LIST

aptopts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
	-o Dir::State::Status=/dev/null -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root)

# The newest source of the series already unpacked in the cache, if any.
cached() {
	find "$P2P_CACHE/src" -maxdepth 2 -name .unpacked -path "*/linux-source-$series-*" -printf '%h\n' |
		sort -V | tail -n 1
}
offline() {
	local have
	have=$(cached)
	[ -n "$have" ] || die "$1"
	log "$1; using the cached $(basename "$have")"
	echo "$have"
	exit 0
}

# Refresh the index at most once a day: versions move, but not every run.
stamp="$apt_dir/lists/.stamp"
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
	log "updating private apt index (sid, trixie-backports, experimental)"
	if apt-get "${aptopts[@]}" update -qq >/dev/null; then
		touch "$stamp"
	else
		log "apt-get update of the private list failed"
	fi
fi

pkg="linux-source-$series"
# A broken private index (apt-cache fails) is handled as no offer: the
# offline fallback below may still have the source.
ver=$({ apt-cache "${aptopts[@]}" madison "$pkg" 2>/dev/null || true; } |
	awk -F'|' '{gsub(/ /,"",$2); print $2}' | sort -V | tail -n 1)
[ -n "$ver" ] || offline "$pkg is not offered by sid, trixie-backports or experimental on $mirror"

dest="$P2P_CACHE/src/$pkg-$ver"
debs="$P2P_CACHE/src/debs"
if [ ! -f "$dest/.unpacked" ]; then
	mkdir -p "$debs"
	# apt names the package file PKG_VERSION_ARCH.deb (no epoch).
	find_deb() { find "$debs" -maxdepth 1 -name "${pkg}_${ver#*:}_*.deb" | head -n 1; }
	deb=$(find_deb)
	# The package (about 0.3 GiB), its tarball and the unpacked tree (1.8).
	need_space "$P2P_CACHE/src" 2600 "the kernel source $pkg $ver"
	if [ -z "$deb" ]; then
		log "downloading $pkg $ver"
		(cd "$debs" && apt-get "${aptopts[@]}" download -qq "$pkg=$ver" >/dev/null) ||
			offline "download of $pkg=$ver failed"
		deb=$(find_deb)
		[ -n "$deb" ] || die "apt-get download of $pkg=$ver left no package in $debs"
	fi
	tmp=$(mktemp -d "$P2P_CACHE/src/dl.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	dpkg -x "$deb" "$tmp/x"
	tarball=$(find "$tmp/x/usr/src" -maxdepth 1 -name "linux-source-*.tar.*" | head -n 1)
	[ -n "$tarball" ] || die "no source tarball inside $deb"
	log "unpacking $(basename "$tarball") (about 15 s)"
	rm -rf "$dest"
	mkdir -p "$dest"
	tar -xf "$tarball" -C "$dest" --strip-components=1
	rm -rf "$tmp"
	touch "$dest/.unpacked"
fi
echo "$dest"
