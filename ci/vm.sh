#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Boots the test VM and runs the guest side of p2pdirect: `vm.sh check` runs
# the tests (TAP to $RUN/tap.log), `vm.sh demo` the demo, `vm.sh bench` the
# benchmark, `vm.sh fuzz` the ioctl fuzzer. FUZZ_SEED, FUZZ_SECONDS and
# FUZZ_THREADS, when set, go to the fuzzer (check and fuzz) through the kernel
# command line. Builds whatever is missing first. Prints the run directory on
# stdout.
#
# Topology (q35, TCG unless a KVM probe boot works):
#   pcie.0 - rp0 - switch upstream - dn0 (dev 0): NVMe "p2pnvme-sw" (CMB 16 MiB)
#                                  - dn1 (dev 1): ivshmem-plain 64 MiB (GPU 0, $shm-gpu0)
#                                  - dn2 (dev 2): ivshmem-plain 64 MiB (GPU 1, $shm-gpu1)
#                                  - dn3 (dev 3): NVMe "p2pmp-sw" controller A  } subsystem
#                                  - dn4 (dev 4): NVMe "p2pmp-sw" controller B  } p2pmp-sw
#                                  - dn5 (dev 5): NVMe "p2pmp-mix" controller C } subsystem
#                                  - dn6 (dev 6): edu, QEMU's DMA test device: the
#                                                 NIC p2pd_importer.ko drives
#          - rp2 - NVMe "p2pmp-mix" controller D (own root port)              } p2pmp-mix
#          - rp1 - NVMe "p2pnvme-rp" (own root port: not P2P-reachable)
# NVMe namespaces (NSIDs unique in the VM, 512-byte LBAs; the images are
# $RUN/nsN.img, made by make-disks.sh):
#   p2pnvme-sw: nsid 1 raw 256 MiB, nsid 2 ext4 128 MiB, nsid 3 xfs 320 MiB,
#               nsid 7 and 8 64 MiB with four partitions each (md legs)
#   p2pnvme-rp: nsid 4 raw 256 MiB, nsid 9 64 MiB with one partition
#   p2pmp-sw:   nsid 5 64 MiB, shared by A and B (a multipath head, both
#               paths behind the switch)
#   p2pmp-mix:  nsid 6 64 MiB, shared by C and D (one path on a root port)
# P2PDIRECT_IOMMU=1 adds QEMU's intel-iommu and boots the guest with
# intel_iommu=on.
# QEMU logs each NVMe command with its data pointers to $RUN/nvme-trace.log
# (events: nvme-trace.events), for hostcheck.py's DMACHECK.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/lib.sh"
# Never fail silently: say which command stopped the run.
trap 'log "vm.sh: line $LINENO failed: $BASH_COMMAND"' ERR

mode=${1:-check}
# A longer fuzzer run needs a longer limit. The guest's part of a full check
# takes 500-900 s under TCG; on an empty cache the next kernel builds beside
# it, and on a slow host that pushed a 7.2 debug guest past 900 s in its last
# suites (2026-11-25): 1500 s leaves room for that and still ends a hang.
timeout_s=${P2PDIRECT_VM_TIMEOUT:-$((1500 + ${FUZZ_SECONDS:-0}))}
# no5lvl: with 5-level paging (TCG's `-cpu max` and recent hosts have LA57),
# an interrupt that arrives while identify_boot_cpu() has cleared the boot
# CPU's feature bits makes KASAN compute its shadow bounds for 4-level paging
# and report a false "wild-memory-access" on the irq descriptor's lock
# (handle_edge_irq, at ~0.005 s, before any of the module runs). Seen on about
# 2 in 40 bare boots of the 7.3 debug kernel and 1 in 40 of 7.2; none in 40
# with no5lvl.
append="console=ttyS0 loglevel=7 panic=-1 oops=panic no5lvl p2p_mode=$mode${P2PDIRECT_ONLY:+ p2p_only=$P2PDIRECT_ONLY}"
case "${P2PDIRECT_ACCEL:-auto}" in
auto | kvm | tcg) ;;
*) die "P2PDIRECT_ACCEL=$P2PDIRECT_ACCEL: auto, kvm or tcg" ;;
esac
for v in FUZZ_SEED FUZZ_SECONDS FUZZ_THREADS; do
	val=${!v:-}
	[ -n "$val" ] || continue
	[[ "$val" =~ ^[0-9]+$ ]] || die "$v=$val: not a number"
	append+=" p2p_$(echo "$v" | tr 'A-Z' 'a-z')=$val"
done

# `make bench` and `make profile`: the rounds of each run, the io_uring
# queue depths, the seconds of each run.
for v in P2PDIRECT_BENCH_ROUNDS P2PDIRECT_BENCH_QD P2PDIRECT_BENCH_SECONDS; do
	val=${!v:-}
	[ -n "$val" ] || continue
	[[ "$val" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "$v=$val: not a number or a comma-separated list of numbers"
	append+=" p2p_$(echo "${v#P2PDIRECT_}" | tr 'A-Z' 'a-z')=$val"
done

"$here/install-deps.sh"
kdir=$("$here/build-kernel.sh")
ksrc=$("$here/fetch-kernel.sh")
# The guest checks that it runs the series it was built for.
series=$(basename "$ksrc" | sed -n 's/^linux-source-\([0-9]*\.[0-9]*\)-.*/\1/p')
append+=" p2p_kver=$series"
# The long scale tests (P2PDIRECT_SCALE=0 leaves them out).
case "${P2PDIRECT_SCALE:-1}" in
1) append+=" p2p_scale=1" ;;
0) ;;
*) die "P2PDIRECT_SCALE=$P2PDIRECT_SCALE: 0 or 1" ;;
esac
env -u KDIR "$here/build-module.sh" >&2
log "building userspace tests"
make -s -C "$repo/userspace-test/c" KSRC="$ksrc" >&2
rust_tests=$(cd "$repo/userspace-test/rust" &&
	cargo build --quiet --release --bin p2pd >&2 &&
	cargo test --quiet --release --no-run --message-format=json |
	python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])')
[ -n "$rust_tests" ] || die "no Rust test binaries were built"

# Keep the last 10 runs (this one included) for inspection.
mkdir -p "$P2P_CACHE/runs"
prune_runs "$P2P_CACHE/runs" 9
# A run's disks, images and logs: about 0.75 GiB.
need_space "$P2P_CACHE/runs" 1024 "a VM run"
run=$(mktemp -d "$P2P_CACHE/runs/$(date +%Y%m%d-%H%M%S)-$mode-XXXX" 2>/dev/null ||
	{ mkdir -p "$P2P_CACHE/runs" && mktemp -d "$P2P_CACHE/runs/$(date +%Y%m%d-%H%M%S)-$mode-XXXX"; })
shm_prefix="/dev/shm/p2pdirect-$(basename "$run")"
# The GPUs' memory is kept in the run dir after the VM stops, for the host checks.
cleanup() {
	for g in "$shm_prefix"-gpu*; do
		[ -f "$g" ] && mv "$g" "$run/${g##*-}.mem"
	done
	rm -f "$shm_prefix"-gpu*
}
trap cleanup EXIT

# --- initramfs ---------------------------------------------------------------
root="$run/initramfs"
mkdir -p "$root"/{bin,lib,lib64,tests,proc,sys,dev,tmp,etc}
cp /bin/busybox "$root/bin/busybox"
cp "$here/guest/init" "$root/init"
cp "$here/guest/guest-lib.sh" "$root/tests/"
cp "$repo/p2pdirect.ko" "$repo/testmod/p2pd_importer.ko" "$repo/testmod/p2pd_client.ko" "$root/"
# Every C test program the Makefile builds.
for t in $(make -s --no-print-directory -C "$repo/userspace-test/c" KSRC="$ksrc" \
	--eval 'print-tests: ; @echo $(TESTS)' print-tests); do
	cp "$repo/userspace-test/c/$t" "$root/tests/"
done
cp "$repo/userspace-test/rust/target/release/p2pd" "$root/tests/"
# `make profile`: the host's perf (its libraries follow below).
if [ "$mode" = profile ]; then
	perf=$(command -v perf) || die "perf not found (Debian's linux-perf)"
	# The guest has busybox only: a wrapper script (other distributions'
	# perf) would not run there.
	head -c 4 "$perf" | grep -q ELF || die "$perf is not an ELF program (a wrapper script?)"
	cp "$perf" "$root/tests/perf"
fi
tools=$("$here/guest-tools.sh")
cp "$tools/mdadm" "$tools/dmsetup" "$root/tests/"
for t in $rust_tests; do
	cp "$t" "$root/tests/rust-$(basename "$t" | sed 's/-[0-9a-f]*$//')"
done
echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
echo 'nobody:x:65534:65534:nobody:/:/bin/false' >>"$root/etc/passwd"
# Shared libraries of the dynamically linked test programs.
for f in "$root"/tests/*; do
	{ ldd "$f" 2>/dev/null || true; } | awk '/=>/ { print $3 } /^\t\/lib/ { print $1 }'
done | sort -u | while read -r lib; do
	[ -f "$lib" ] || continue
	cp -L "$lib" "$root/lib/"
	case "$lib" in /lib64/*) cp -L "$lib" "$root/lib64/" ;; esac
done
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet) >"$run/initramfs.cpio"

# --- disks and device memory -------------------------------------------------
disks=$("$here/make-disks.sh")
for ns in 1 2 3 4 5 6 7 8 9; do cp --sparse=always "$disks/ns$ns.img" "$run/ns$ns.img"; done
for g in 0 1; do truncate -s 64M "$shm_prefix-gpu$g"; done

# --- accelerator ---------------------------------------------------------------
accel=${P2PDIRECT_ACCEL:-auto}
if [ "$accel" = auto ]; then
	accel=tcg
	probe="$P2P_CACHE/kvm-probe-$(basename "$kdir")"
	if [ -w /dev/kvm ]; then
		if [ ! -f "$probe" ]; then
			log "probing KVM with a short boot (once per kernel build)"
			# KVM counts only if the guest got to its init and said so.
			probe_run=$(P2PDIRECT_ACCEL=kvm P2PDIRECT_VM_TIMEOUT=40 "$0" probe 2>/dev/null || true)
			if [ -n "$probe_run" ] && grep -q probe-ok "$probe_run/tap.log" 2>/dev/null; then
				echo kvm >"$probe"
			else
				echo tcg >"$probe"
			fi
		fi
		accel=$(cat "$probe")
	fi
fi
case "$accel" in
kvm) cpu=(-accel kvm -cpu host) ;;
# One TCG thread for both vCPUs: with a thread per vCPU, a vCPU can run a
# stale translation of kernel text another vCPU just patched (static keys,
# int3-based text_poke), which oopses at random ("Oops: int3" in
# sched_clock_cpu at boot was seen).
*) cpu=(-accel tcg,thread=single -cpu max) ;;
esac

machine=q35
iommu=()
if [ "${P2PDIRECT_IOMMU:-0}" = 1 ]; then
	# Interrupt remapping needs the split irqchip; caching mode makes QEMU's
	# emulated devices follow the guest's IOMMU mappings. The guest's DMA
	# domains are identity (iommu=pt): QEMU sends every DMA of a device
	# through the IOMMU, also a peer-to-peer write that a real switch routes
	# by itself, so with translating domains the bus addresses the kernel's
	# P2PDMA code hands out behind the switch fault (README, "Kernels and
	# configurations").
	machine+=,kernel-irqchip=split
	iommu=(-device intel-iommu,intremap=on,caching-mode=on)
	append+=" intel_iommu=on iommu=pt p2p_iommu=1"
fi
qemu=(qemu-system-x86_64 -machine "$machine" "${cpu[@]}" "${iommu[@]}" -smp 2 -m 3G
	-nodefaults -display none -vga none -no-reboot
	-kernel "$kdir/arch/x86/boot/bzImage" -initrd "$run/initramfs.cpio"
	-append "$append"
	-serial "file:$run/console.log" -serial "file:$run/tap.log"
	-device pcie-root-port,id=rp0,bus=pcie.0,chassis=1
	-device x3130-upstream,id=up0,bus=rp0
	-device xio3130-downstream,id=dn0,bus=up0,chassis=2,slot=0,addr=0x0
	-device xio3130-downstream,id=dn1,bus=up0,chassis=3,slot=1,addr=0x1
	-device xio3130-downstream,id=dn2,bus=up0,chassis=4,slot=2,addr=0x2
	-device nvme,id=nvmsw,serial=p2pnvme-sw,bus=dn0,cmb_size_mb=16
	-drive "file=$run/ns1.img,if=none,id=ns1,format=raw"
	-device nvme-ns,drive=ns1,bus=nvmsw,nsid=1,logical_block_size=512
	-drive "file=$run/ns2.img,if=none,id=ns2,format=raw"
	-device nvme-ns,drive=ns2,bus=nvmsw,nsid=2,logical_block_size=512
	-drive "file=$run/ns3.img,if=none,id=ns3,format=raw"
	-device nvme-ns,drive=ns3,bus=nvmsw,nsid=3,logical_block_size=512
	-object "memory-backend-file,id=gpumem0,size=64M,share=on,mem-path=$shm_prefix-gpu0"
	-device ivshmem-plain,memdev=gpumem0,bus=dn1
	-object "memory-backend-file,id=gpumem1,size=64M,share=on,mem-path=$shm_prefix-gpu1"
	-device ivshmem-plain,memdev=gpumem1,bus=dn2
	-drive "file=$run/ns7.img,if=none,id=ns7,format=raw"
	-device nvme-ns,drive=ns7,bus=nvmsw,nsid=7,logical_block_size=512
	-drive "file=$run/ns8.img,if=none,id=ns8,format=raw"
	-device nvme-ns,drive=ns8,bus=nvmsw,nsid=8,logical_block_size=512
	-device pcie-root-port,id=rp1,bus=pcie.0,chassis=5
	-device nvme,id=nvmrp,serial=p2pnvme-rp,bus=rp1
	-drive "file=$run/ns4.img,if=none,id=ns4,format=raw"
	-device nvme-ns,drive=ns4,bus=nvmrp,nsid=4,logical_block_size=512
	-drive "file=$run/ns9.img,if=none,id=ns9,format=raw"
	-device nvme-ns,drive=ns9,bus=nvmrp,nsid=9,logical_block_size=512
	-device xio3130-downstream,id=dn3,bus=up0,chassis=6,slot=3,addr=0x3
	-device xio3130-downstream,id=dn4,bus=up0,chassis=7,slot=4,addr=0x4
	-device xio3130-downstream,id=dn5,bus=up0,chassis=8,slot=5,addr=0x5
	-device pcie-root-port,id=rp2,bus=pcie.0,chassis=9
	-device nvme-subsys,id=mpsw,nqn=p2pmp-sw
	-device nvme,id=nvmmpa,serial=p2pmp-sw,subsys=mpsw,bus=dn3
	-device nvme,id=nvmmpb,serial=p2pmp-sw,subsys=mpsw,bus=dn4
	-drive "file=$run/ns5.img,if=none,id=ns5,format=raw"
	-device nvme-ns,drive=ns5,bus=nvmmpa,nsid=5,shared=on,logical_block_size=512
	-device nvme-subsys,id=mpmix,nqn=p2pmp-mix
	-device nvme,id=nvmmpc,serial=p2pmp-mix,subsys=mpmix,bus=dn5
	-device nvme,id=nvmmpd,serial=p2pmp-mix,subsys=mpmix,bus=rp2
	-drive "file=$run/ns6.img,if=none,id=ns6,format=raw"
	-device nvme-ns,drive=ns6,bus=nvmmpc,nsid=6,shared=on,logical_block_size=512
	-device xio3130-downstream,id=dn6,bus=up0,chassis=10,slot=6,addr=0x6
	-device edu,bus=dn6,dma_mask=0xffffffffffffffff)
case "$mode" in check | demo) qemu+=(-trace "events=$here/nvme-trace.events" -D "$run/nvme-trace.log") ;; esac
printf '%q ' "${qemu[@]}" >"$run/qemu.cmd"

log "booting VM ($mode, $accel); run dir $run"
start=$(date +%s)
set +e
# --foreground: QEMU stays in the terminal's process group, so Ctrl-C
# stops the guest too, not only this script.
timeout --foreground -k 10 "$timeout_s" "${qemu[@]}" </dev/null >"$run/qemu.out" 2>&1
rc=$?
set -e
echo "$rc $(($(date +%s) - start)) $timeout_s" >"$run/qemu.rc"
log "VM exited rc=$rc after $(($(date +%s) - start)) s"
echo "$run"
