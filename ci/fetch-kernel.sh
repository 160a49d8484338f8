#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Fetches Debian's newest linux-source-7.2 through a private apt list (nothing is
# installed system-wide) and unpacks it into the cache. Prints the source dir.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
"$(dirname "$0")/install-deps.sh"

series=${P2PDIRECT_KERNEL_SERIES:-7.2}
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
LIST

aptopts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
	-o Dir::State::Status=/dev/null -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root)

# Refresh the index at most once a day: versions move, but not every run.
stamp="$apt_dir/lists/.stamp"
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
	log "updating private apt index (sid, trixie-backports)"
	apt-get "${aptopts[@]}" update -qq >/dev/null || die "apt-get update of the private list failed"
	touch "$stamp"
fi

pkg="linux-source-$series"
ver=$(apt-cache "${aptopts[@]}" madison "$pkg" 2>/dev/null | awk -F'|' '{gsub(/ /,"",$2); print $2}' |
	sort -V | tail -n 1)
[ -n "$ver" ] || die "$pkg is not offered by sid or trixie-backports on $mirror"

dest="$P2P_CACHE/src/$pkg-$ver"
if [ ! -f "$dest/.unpacked" ]; then
	log "downloading $pkg $ver"
	tmp=$(mktemp -d "$P2P_CACHE/src/dl.XXXXXX")
	(cd "$tmp" && apt-get "${aptopts[@]}" download -qq "$pkg=$ver" >/dev/null) ||
		die "download of $pkg=$ver failed"
	dpkg -x "$tmp"/*.deb "$tmp/x"
	tarball=$(find "$tmp/x/usr/src" -maxdepth 1 -name "linux-source-*.tar.*" | head -n 1)
	[ -n "$tarball" ] || die "no source tarball inside $pkg"
	log "unpacking $(basename "$tarball") (about 15 s)"
	rm -rf "$dest"
	mkdir -p "$dest"
	tar -xf "$tarball" -C "$dest" --strip-components=1
	rm -rf "$tmp"
	touch "$dest/.unpacked"
fi
echo "$dest"
