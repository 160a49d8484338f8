#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Builds the images of the test VM's NVMe namespaces once per (this script,
# ci/fill.py, mkfs versions) into the cache and prints that directory; vm.sh
# copies them into each run dir. "fill(o, s)" is the pattern of ci/fill.py.
#   ns1.img 256 MiB raw:  fill(o, 1) in the first 32 MiB, zeros after
#   ns2.img 128 MiB ext4 (4 KiB blocks): /data.bin, 8 MiB, fill(o, 2)
#   ns3.img 320 MiB xfs:                 /data.bin, 8 MiB, fill(o, 3)
#   ns4.img 256 MiB raw:  fill(o, 4) in the first 32 MiB, zeros after
#   ns5.img, ns6.img 64 MiB raw: fill(o, 5), fill(o, 6) (NVMe multipath)
#   ns7.img, ns8.img 64 MiB: fill(o, 7), fill(o, 8) under an MBR with four
#     partitions: p1 [1, 17) MiB, p2 [17, 33) MiB, p3 [33, 49) MiB, p4 [49, 64) MiB
#   ns9.img 64 MiB: fill(o, 9) under an MBR with two partitions p1 [1, 17) MiB,
#     p2 [17, 33) MiB
#     (md legs, partitions)
# (o: byte offset in the image, or in data.bin). Usage: make-disks.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

key=$( { cat "$here/make-disks.sh" "$here/fill.py" "$here/mbr.py"; mkfs.ext4 -V 2>&1; mkfs.xfs -V; } |
	sha256sum | cut -c1-16)
out="$P2P_CACHE/disks/$key"
if [ -f "$out/.built" ]; then
	echo "$out"
	exit 0
fi

start=$(date +%s.%N)
mkdir -p "$P2P_CACHE/disks"
tmp=$(mktemp -d "$P2P_CACHE/disks/tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fill() { python3 "$here/fill.py" "$@"; }

for ns in 1 4; do
	truncate -s 256M "$tmp/ns$ns.img"
	fill "$tmp/ns$ns.img" "$ns" $((32 << 20))
done

for ns in 5 6 7 8 9; do
	truncate -s 64M "$tmp/ns$ns.img"
	fill "$tmp/ns$ns.img" "$ns" $((64 << 20))
done
"$here/mbr.py" "$tmp/ns7.img" 1:16 17:16 33:16 49:15
"$here/mbr.py" "$tmp/ns8.img" 1:16 17:16 33:16 49:15
"$here/mbr.py" "$tmp/ns9.img" 1:16 17:16

# Inode tables and journal are written at mkfs time, so that the guest kernel
# does not zero them in the background (ext4lazyinit) during the tests.
mkdir "$tmp/ext4"
fill "$tmp/ext4/data.bin" 2 $((8 << 20))
truncate -s 128M "$tmp/ns2.img"
mkfs.ext4 -q -F -b 4096 -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 -L p2p-ext4 \
	-d "$tmp/ext4" "$tmp/ns2.img"

# mkfs.xfs refuses file systems under 300 MB.
fill "$tmp/data3.bin" 3 $((8 << 20))
cat >"$tmp/proto" <<PROTO
p2pdirect
0 0
d--755 0 0
data.bin ---644 0 0 $tmp/data3.bin
\$
PROTO
truncate -s 320M "$tmp/ns3.img"
mkfs.xfs -q -f -m reflink=1 -L p2p-xfs -p "$tmp/proto" "$tmp/ns3.img"

rm -rf "$tmp/ext4" "$tmp/data3.bin" "$tmp/proto"
touch "$tmp/.built"
# Whole or not at all, also when another run builds the same key meanwhile.
[ -f "$out/.built" ] || rm -rf "$out"
mv -T "$tmp" "$out" 2>/dev/null || [ -f "$out/.built" ] || die "cannot move the disks to $out"
log "test disks built in $(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s: $out"
echo "$out"
