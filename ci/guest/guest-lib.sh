# SPDX-License-Identifier: GPL-2.0
# Functions of the guest init: device discovery, the guest suite, the demo.
# Sourced by /init. Output for the host goes to $out (ttyS1).

# pci_devs VENDOR CLASS-PREFIX: the sysfs dirs of matching PCI functions.
pci_devs() {
	for d in /sys/bus/pci/devices/*; do
		v=$(cat "$d/vendor")
		c=$(cat "$d/class")
		case "$v:$c" in
		$1:$2*) echo "$d" ;;
		esac
	done
}
gpus() { pci_devs 0x1af4 0x0500; }     # ivshmem-plain: RAM controller class
nvmes() { pci_devs '*' 0x010802; }

# The chain of PCI addresses from the root complex down to a device.
pci_path() {
	readlink -f "$1" | tr '/' '\n' | grep -E '^[0-9a-f]{4}:[0-9a-f]{2}:' | tr '\n' ' '
}
# The upstream switch port above a device behind a switch, or nothing.
upstream_port() {
	set -- $(pci_path "$1")
	[ $# -ge 4 ] && eval echo "\${$(($# - 2))}"
}
nvme_serial() { cat "$1"/nvme/nvme*/serial 2>/dev/null | tr -d ' '; }
# Every NVMe namespace as "NSID NODE SERIAL", by NSID (unique in the test VM;
# the nvmeXnY names follow the order of an async scan, not the NSID).
namespaces() {
	for b in /sys/block/nvme*n*; do
		[ -f "$b/nsid" ] || continue
		# A path of a multipath head (nvmeXcYnZ, no device node): the head stands for it.
		case "${b##*/}" in nvme*c*n*) continue ;; esac
		echo "$(cat "$b/nsid") ${b##*/} $(tr -d ' ' <"$b/device/serial")"
	done | sort -n
}
ns_dev() { # ns_dev NSID: /dev/NODE of that namespace
	namespaces | while read -r id node serial; do
		[ "$id" = "$1" ] && echo "/dev/$node"
	done | grep .
}

describe_pci() {
	for d in $(gpus) $(nvmes); do
		bdf=${d##*/}
		kind=gpu
		[ "$(cat "$d/class")" = 0x010802 ] && kind="nvme $(nvme_serial "$d")"
		bar=$(sed -n 3p "$d/resource" | { read -r s e f; printf '0x%x-0x%x (%d MiB)' $s $e $(((e - s + 1) >> 20)); })
		echo "  $bdf $(cat "$d/vendor"):$(cat "$d/device") $kind"
		echo "      path: $(pci_path "$d")"
		[ "$kind" = gpu ] && echo "      BAR2: $bar"
	done
	namespaces | while read -r id node serial; do
		echo "  nsid $id: /dev/$node on $serial, $(($(cat "/sys/block/$node/size") / 2048)) MiB"
	done
}
# Lines for hostcheck.py: each GPU's BAR2 window (no IOMMU in the guest: bus
# address = CPU physical address) and each namespace's device node.
host_records() {
	for g in $(gpus); do
		sed -n 3p "$g/resource" | {
			read -r s e _
			printf '# GPUBAR %s 0x%x 0x%x\n' "${g##*/}" $((s)) $((e - s + 1))
		}
	done
	namespaces | while read -r id node serial; do echo "# NSDEV $id /dev/$node $serial"; done
}

# --- TAP for the guest suite -------------------------------------------------
n=0
fails=0
ok() { n=$((n + 1)); say "ok $n - $*"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); say "not ok $n - $*"; }
check() { # check DESCRIPTION COMMAND...
	desc=$1
	shift
	if "$@" >/tmp/check.out 2>&1; then ok "$desc"; else
		notok "$desc"
		sed 's/^/# /' /tmp/check.out >"$out"
	fi
}

config_has() { zcat /proc/config.gz | grep -qx "CONFIG_$1=y"; }
# The kernel is of the series the host built (p2p_kver on the command line).
kernel_series() { case "$(uname -r)" in "${p2p_kver:-none}".*) ;; *) return 1 ;; esac; }
# With p2p_iommu=1 the host added QEMU's intel-iommu: it must be on, and
# every PCI function in an IOMMU group.
iommu_on() {
	ls /sys/class/iommu
	[ -n "$(ls /sys/class/iommu 2>/dev/null)" ] || return 1
	for d in $(gpus) $(nvmes); do
		[ -e "$d/iommu_group" ] || { echo "${d##*/} is in no IOMMU group"; return 1; }
		g=$(readlink -f "$d/iommu_group")
		echo "${d##*/}: group ${g##*/}, domain $(cat "$g/type")"
		[ "$(cat "$g/type")" = identity ] || return 1
	done
}
iommu_off() { [ -z "$(ls /sys/class/iommu 2>/dev/null)" ]; }
iommu_checks() {
	if [ "${p2p_iommu:-0}" = 1 ]; then
		check "IOMMU on (intel-iommu), every GPU and NVMe in an IOMMU group, identity domains (iommu=pt)" iommu_on
	else
		check "no IOMMU" iommu_off
	fi
}
count_is() { [ "$(echo $2 | wc -w)" -eq "$1" ]; }
# Both GPUs and the NVMe with serial "sw" hang below one upstream switch port;
# the NVMe with serial "rp" does not.
switch_topology() {
	sw=$(for d in $(nvmes); do [ "$(nvme_serial "$d")" = p2pnvme-sw ] && echo "$d"; done)
	rp=$(for d in $(nvmes); do [ "$(nvme_serial "$d")" = p2pnvme-rp ] && echo "$d"; done)
	[ -n "$sw" ] && [ -n "$rp" ] || { echo "nvme serials not found"; return 1; }
	up=$(upstream_port "$sw")
	[ -n "$up" ] || { echo "nvme sw not behind a switch: $(pci_path "$sw")"; return 1; }
	for g in $(gpus); do
		[ "$(upstream_port "$g")" = "$up" ] || { echo "gpu $g not below $up"; return 1; }
	done
	[ "$(upstream_port "$rp")" != "$up" ] || { echo "nvme rp is below the switch"; return 1; }
	echo "switch upstream port: $up"
}
# NSIDs 1-3, 7, 8 on the controller behind the switch, 4 and 9 on the one on
# the root port, 5 and 6 on the two multipath subsystems (one head each).
namespace_layout() {
	namespaces
	[ "$(namespaces | awk '{ printf "%s:%s ", $1, $3 }')" = \
		"1:p2pnvme-sw 2:p2pnvme-sw 3:p2pnvme-sw 4:p2pnvme-rp 5:p2pmp-sw 6:p2pmp-mix 7:p2pnvme-sw 8:p2pnvme-sw 9:p2pnvme-rp " ]
}
# mount_ns NSID FSTYPE DIR: mounts the namespace, opens it to everyone (tests
# run as nobody too) and finds /data.bin of 8 MiB, by stat only: reading it
# here would leave its blocks in the page cache.
mount_ns() {
	dev=$(ns_dev "$1") || { echo "no namespace with nsid $1"; return 1; }
	mkdir -p "$3" && mount -t "$2" ${4:+-o "$4"} "$dev" "$3" && chmod 1777 "$3" || return 1
	stat -c '%n: %s bytes, mode %a' "$3/data.bin" &&
		[ "$(stat -c %s "$3/data.bin")" = 8388608 ]
}
devnode_root_only() {
	ls -l /dev/p2pdirect
	[ -c /dev/p2pdirect ] && [ "$(stat -c '%a %u' /dev/p2pdirect)" = "600 0" ]
}
# Binding a device whose BAR2 is no usable memory (the NVMe on the root port,
# through new_id) is refused at probe with a message naming the reason.
refused_probe() {
	rp=$(for d in $(nvmes); do [ "$(nvme_serial "$d")" = p2pnvme-rp ] && echo "$d"; done)
	bdf=${rp##*/}
	id="$(cat "$rp/vendor" | sed 's/0x//') $(cat "$rp/device" | sed 's/0x//')"
	echo "$bdf" >/sys/bus/pci/drivers/nvme/unbind || return 1
	echo "$id" >/sys/bus/pci/drivers/p2pdirect/new_id
	echo "$id" >/sys/bus/pci/drivers/p2pdirect/remove_id
	echo "$bdf" >/sys/bus/pci/drivers/nvme/bind || return 1
	dmesg | grep "p2pdirect $bdf: " || return 1
	dmesg | grep -q "p2pdirect $bdf: BAR2 .*not a provider\|p2pdirect $bdf: BAR2 is .* less than" &&
		[ ! -e /sys/bus/pci/drivers/p2pdirect/$bdf ] && [ -e "$rp/nvme" ]
}
module_gone() { ! grep -q '^p2pdirect ' /proc/modules && [ ! -e /dev/p2pdirect ]; }
kmemleak_clean() {
	[ -w /sys/kernel/debug/kmemleak ] || { echo "kmemleak is not active"; return 1; }
	# Objects younger than 5 s are never reported: scan, wait, scan again.
	echo scan >/sys/kernel/debug/kmemleak
	sleep 6
	echo scan >/sys/kernel/debug/kmemleak
	leaks=$(cat /sys/kernel/debug/kmemleak)
	[ -z "$leaks" ] && return 0
	# Onto the console too, where the host's log scanner sees it.
	echo "$leaks" >/dev/console
	echo "$leaks"
	return 1
}

# libtest output -> TAP (plan at the end). The tests each binary announced
# ("running N tests") must all report, and the binary must exit 0 (its
# status comes last, as "p2pdirect-test-exit N"): a binary killed half-way
# (SIGBUS, abort, OOM) or one that never started is a failure.
libtest_tap() {
	awk '
	/^running [0-9]+ tests?$/  { expect += $2; print "# " $0; next }
	/^p2pdirect-test-exit [0-9]+$/ { code = $2; seen = 1; next }
	/^test .* \.\.\. ok$/      { n++; print "ok " n " - " $2; next }
	/^test .* \.\.\. ignored/  { n++; print "ok " n " - " $2 " # SKIP ignored"; next }
	/^test .* \.\.\. FAILED$/  { n++; print "not ok " n " - " $2; next }
	{ print "# " $0 }
	END {
		n += 0
		reported = n
		if (!seen) { n++; print "not ok " n " - the test binary gave no exit status" }
		else if (code != 0) { n++; print "not ok " n " - the test binary exited with status " code }
		if (reported < expect) { n++; print "not ok " n " - " expect " tests announced, " reported " reported" }
		print "1.." n + 0
	}'
}

run_suite() { # run_suite NAME COMMAND...: one TAP stream on $out
	name=$1
	shift
	# P2PDIRECT_ONLY=a,b on the host (p2p_only= here): only those suites.
	if [ -n "${p2p_only:-}" ] && ! echo ",$p2p_only," | grep -q ",$name,"; then
		return 0
	fi
	say "# suite: $name"
	"$@" >"$out" 2>&1
	rc=$?
	say "# suite-exit: $name $rc"
}

# KUnit suites of the module ran at insmod; their KTAP results (subtests
# indented) become one flat TAP suite each. The module has 8
# (kunit_tests(p2pdirect_...) in rust/): fewer is a failure.
kunit_expected=8
kunit_suites() {
	found=0
	for d in /sys/kernel/debug/kunit/p2pdirect_*; do
		[ -f "$d/results" ] || continue
		found=$((found + 1))
		say "# suite: kunit-${d##*/}"
		sed -n 's/^    \(\(not \)\{0,1\}ok .*\)$/\1/p; s/^    \(1\.\.[0-9]*\)$/\1/p' "$d/results" >"$out"
		sed -n 's/^    \(# .*\)$/\1/p' "$d/results" | head -n 40 >"$out"
	done
	[ "$found" -ge "$kunit_expected" ] ||
		printf '# suite: kunit\nnot ok 1 - %s of the %s KUnit suites of p2pdirect ran\n1..1\n' \
			"$found" "$kunit_expected" >"$out"
}
# Records of device memory (ALLOC zeroes it) go straight to the host.
rust_suite() {
	{
		P2PDIRECT_RECORDS=$out "$1" --test-threads=1 2>&1
		rc=$?
		# A crash mid-test leaves libtest's "test x ... " without its newline.
		echo
		echo "p2pdirect-test-exit $rc"
	} | libtest_tap
}

# The p2pd tool as a user runs it. verify's records go to the host checks.
# With --json, stdout is one JSON document and nothing else (one line).
p2pd_json() {
	/tests/p2pd "$@" --json >/tmp/json.out || return 1
	[ "$(wc -l </tmp/json.out)" -eq 1 ] && grep -q '^[[{].*[]}]$' /tmp/json.out || {
		head -c 600 /tmp/json.out
		return 1
	}
}
p2pd_info_matrix() {
	/tests/p2pd info >/tmp/info || return 1
	cat /tmp/info
	grep -q 'P2P reachability' /tmp/info && grep -q "$(ls /sys/block | grep -m1 nvme)" /tmp/info
}
p2pd_verify() {
	/tests/p2pd verify --size 8M --records >/tmp/verify.out
	rc=$?
	grep '^# ' /tmp/verify.out >"$out"
	grep -v '^# ' /tmp/verify.out
	return $rc
}
p2pd_info_stacked() {
	/tests/p2pd info >/tmp/info || return 1
	sed -n '/^stacked block devices/,$p' /tmp/info
	for d in md0 md1 md2 dm-0 "$(basename "$(ns_dev 5)")" "$(basename "$(ns_dev 6)")"; do
		grep -q "^  $d " /tmp/info || { echo "$d missing"; return 1; }
	done
	# The mixed devices are not reachable as a whole; the others are.
	grep -q "^  md2 .*unreachable: $(basename "$(ns_dev 9)")p1" /tmp/info &&
		grep -q "^  md1 .*reachable by all providers" /tmp/info || return 1
	# The stacks past the module's limits are said to be refused, and why;
	# those at the limits are not.
	grep -q "^  $(dm_blk p2pdeep5) .*refused by p2pdirect: more than 4 levels of stacking (ELOOP)$" /tmp/info &&
		grep -q "^  $(dm_blk p2pwide33) .*refused by p2pdirect: more than 32 legs (E2BIG)$" /tmp/info &&
		grep "^  $(dm_blk p2pdeep4) " /tmp/info | grep -qv refused &&
		grep "^  $(dm_blk p2pwide32) " /tmp/info | grep -qv refused &&
		grep -q "^  md6 .*refused by p2pdirect: more than 4 levels of stacking (ELOOP)$" /tmp/info &&
		grep "^  md5 " /tmp/info | grep -qv refused || return 1
	# Device-mapper takes no P2PDMA pages (EOPNOTSUPP): every dm device
	# says so, none is "reachable by all providers"; its kind is "dm", its
	# dm name (chosen by its creator) a name.
	lin=$(dm_blk p2plin) || return 1
	grep -q "^  $lin dm named p2plin: .*; no P2PDMA (EOPNOTSUPP; COMPAT bounces)$" /tmp/info &&
		grep -q "^  $(dm_blk p2pdeep4) dm named p2pdeep4: .*; no P2PDMA (EOPNOTSUPP; COMPAT bounces)$" /tmp/info &&
		grep -q "^  $(dm_blk p2pdeep5) dm named p2pdeep5: .*; no P2PDMA (EOPNOTSUPP; COMPAT bounces); refused by p2pdirect: " /tmp/info &&
		! grep '^  dm-[0-9]* ' /tmp/info | grep -q 'reachable by all' || { grep '^  dm-' /tmp/info; return 1; }
	/tests/p2pd info --json >/tmp/info.json || return 1
	grep -o "{\"device\":\"$(dm_blk p2pdeep5)\",\"kind\":\"dm\",\"name\":\"p2pdeep5\",\"p2pdma\":false,\"legs\":\[[^]]*\],\"unreachable_legs\":\[\],\"unreachable\":\[\],\"refused\":[^}]*}" \
		/tmp/info.json | grep -q '"refused":"more than 4 levels of stacking (ELOOP)"}$' || return 1
	grep -q "\"device\":\"$lin\",\"kind\":\"dm\",\"name\":\"p2plin\",\"p2pdma\":false,\"legs\":" /tmp/info.json &&
		grep -q '"device":"md1","kind":"md raid1","name":null,"p2pdma":true,"legs":' /tmp/info.json ||
		{ grep -o '"stacked":.\{0,600\}' /tmp/info.json; return 1; }
	# md2's JSON names its unreachable leg and the providers it cannot
	# reach, as the text does (every provider here: a root-port controller).
	p9=$(basename "$(ns_dev 9)")p1
	from=$(sed -n "s/^  md2 .*unreachable: $p9 from provider \([0-9,]*\).*/\1/p" /tmp/info)
	[ -n "$from" ] || return 1
	grep -q "\"device\":\"md2\",[^]]*\],\"unreachable_legs\":\[\"$p9\"\],\"unreachable\":\[{\"leg\":\"$p9\",\"providers\":\[$from\]}\],\"refused\":null}" \
		/tmp/info.json || { grep -o '"device":"md2".\{0,400\}' /tmp/info.json; return 1; }
}
p2pd_stats_json() {
	p2pd_json stats || return 1
	grep -q '"kind":"block","device":"[0-9]*:[0-9]*","name":"nvme[0-9]*n[0-9]*"' /tmp/json.out ||
		{ head -c 600 /tmp/json.out; return 1; }
}
# stats --reset prints the counters as they were, says so, and zeroes them:
# the next stats shows no READ or WRITE (nothing runs in between).
p2pd_stats_reset() {
	/tests/p2pd stats --reset >/tmp/reset.out 2>&1 || { cat /tmp/reset.out; return 1; }
	cat /tmp/reset.out
	tail -n 1 /tmp/reset.out | grep -qx '(counters reset)' &&
		grep -Eq '^(provider|block) +[^ ]+ +([1-9][0-9]*) ' /tmp/reset.out || return 1
	p2pd_json stats || return 1
	grep -q '"reads":0,"writes":0' /tmp/json.out &&
		! grep -Eq '"(reads|writes|errors)":[1-9]' /tmp/json.out || { head -c 600 /tmp/json.out; return 1; }
}
p2pd_info_json() {
	p2pd_json info || return 1
	grep -q '"bytes_total":[1-9][0-9]*,"bytes_free":[0-9]*,"bytes_used":[0-9]*,' /tmp/json.out ||
		{ head -c 600 /tmp/json.out; return 1; }
	# The text's provider table: total, free and used, exact (no "0 MiB"
	# for a few KiB), each BAR provider's total a whole number of a unit.
	/tests/p2pd info >/tmp/info || return 1
	sed -n '/^device-memory providers/,/^NVMe namespaces/p' /tmp/info
	grep -q '^  idx  kind .*  bar size  .*  total  *free  *used$' /tmp/info &&
		grep -q '^  *[0-9][0-9]*  bar  .* [0-9][0-9]* [KMG]iB  *[0-9][0-9]*\( [KMG]\{0,1\}i\{0,1\}B\)\{0,1\}  *[0-9][0-9]*\( [KMG]\{0,1\}i\{0,1\}B\)\{0,1\}$' /tmp/info
}
# The reachability matrix's header is as wide as its rows: the columns line
# up (the header's label was 2 characters short of the rows').
p2pd_info_aligned() {
	/tests/p2pd info >/tmp/info || return 1
	sed -n '/^P2P reachability/,$p' /tmp/info
	h=$(sed -n '/^P2P reachability/{n;p;q}' /tmp/info)
	r=$(sed -n '/^P2P reachability/{n;n;p;q}' /tmp/info)
	[ -n "$r" ] && [ ${#h} -eq ${#r} ] || { echo "header ${#h} wide, row ${#r}"; return 1; }
}
# verify --records --json: the records are inside the one JSON document,
# not printed before it. NSID 1 [60, 62) MiB: in the bench's read region,
# which no check of the NVMe trace looks at; before the recorded verify.
p2pd_verify_json() {
	p2pd_json verify --dev "$(ns_dev 1)" --offset 60M --size 1M --records || return 1
	cat /tmp/json.out
	grep -q '"ok":true' /tmp/json.out &&
		grep -q '"records":\["# HOSTCHECK gpu=[^"]* len=1048576 ' /tmp/json.out
}
# verify allocates its device memory (2 x --size) before it writes the
# namespace: 2 x 40 MiB do not fit a 64 MiB GPU, so it fails with that
# reason and NSID 1 [128, 208) MiB keeps its bytes.
p2pd_verify_no_memory() {
	dd if="$(ns_dev 1)" of=/tmp/ns1-before bs=4096 skip=$((128 << 8)) count=1 iflag=direct 2>/dev/null &&
		[ -s /tmp/ns1-before ] || { echo "cannot read NSID 1 at 128 MiB"; return 1; }
	/tests/p2pd verify --dev "$(ns_dev 1)" --gpu 0 --offset 128M --size 40M 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] && grep -q 'ALLOC 83886080 bytes (2 x --size) on provider 0' /tmp/err || return 1
	dd if="$(ns_dev 1)" of=/tmp/ns1-after bs=4096 skip=$((128 << 8)) count=1 iflag=direct 2>/dev/null &&
		cmp -s /tmp/ns1-before /tmp/ns1-after || { echo "NSID 1 at 128 MiB changed"; return 1; }
}
# bench --out to a path that cannot be written: refused before any run.
p2pd_bench_bad_out() {
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--only 'p2pdirect seq-read-4K' --json --out /nonexistent/b.json >/tmp/bench.out 2>/tmp/err
	rc=$?
	cat /tmp/bench.out /tmp/err
	[ $rc -eq 1 ] && grep -q '^p2pd: /nonexistent/b.json: No such file or directory' /tmp/err &&
		[ ! -s /tmp/bench.out ] && ! grep -q '^seq-read-4K ' /tmp/err
}
# bench --out to what is no regular file (/dev/null, a pipe as
# /proc/self/fd/3): written, not emptied first (ftruncate refuses such
# files); the JSON arrives whole through the pipe.
p2pd_bench_out_not_a_file() {
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--threads 1 --qd 1 --only 'p2pdirect seq-read-4K' --out /dev/null >/dev/null 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 0 ] || return 1
	{
		/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 \
			--rounds 1 --threads 1 --qd 1 --only 'p2pdirect seq-read-4K' \
			--out /proc/self/fd/3 3>&1 >/dev/null 2>/tmp/err
		echo $? >/tmp/bench-pipe.rc
	} | cat >/tmp/bench-pipe.out
	rc=$(cat /tmp/bench-pipe.rc)
	cat /tmp/err
	[ $rc -eq 0 ] && grep -q '"seconds_per_run":0.1,' /tmp/bench-pipe.out
}
# --threads 1: the 4 KiB runs once each, no "-t1" run, no target for one;
# --qd 8,8 --qd 8 runs QD 8 once (repeated --qd add up, duplicates drop).
p2pd_bench_one_thread() {
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--threads 1 --qd 8,8 --qd 8 --only 'p2pdirect rand-read-4K' --only 'p2pdirect-uring rand-read-4K' \
		>/tmp/bench.out 2>&1 || { cat /tmp/bench.out; return 1; }
	cat /tmp/bench.out
	[ "$(grep -c '^rand-read-4K  *p2pdirect ' /tmp/bench.out)" -eq 1 ] &&
		[ "$(grep -c '^rand-read-4K-qd8  *p2pdirect-uring ' /tmp/bench.out)" -eq 1 ] &&
		! grep -q -- '-t1' /tmp/bench.out
}
# --gpu naming published memory (the CMB) says so: verify and bench need a
# BAR provider, whose memory they allocate.
p2pd_published_gpu() {
	/tests/p2pd info --json >/tmp/info.json || return 1
	i=$(grep -o '"index":[0-9]*,"kind":"published"' /tmp/info.json | head -n 1 | tr -dc 0-9)
	[ -n "$i" ] || { echo "no published provider in: $(head -c 400 /tmp/info.json)"; return 1; }
	/tests/p2pd verify --gpu "$i" 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] && grep -q "provider $i is published memory of .*, not a BAR provider" /tmp/err
}
# An option the command does not take is refused before its value is
# looked at.
p2pd_foreign_option_value() {
	/tests/p2pd stats --qd 0 2>/tmp/err
	[ $? -eq 2 ] && grep -q 'stats does not take --qd' /tmp/err || { cat /tmp/err; return 1; }
	/tests/p2pd version --size 1T 2>/tmp/err
	[ $? -eq 2 ] && grep -q 'version does not take --size' /tmp/err
}
p2pd_bad() { ! /tests/p2pd verify --dev /dev/nonexistent 2>/tmp/err && grep -q 'not an NVMe namespace' /tmp/err; }
# The io_uring paths of the benchmark (reads only) at two queue depths: each
# run row is there, with no error, and the JSON carries the queue depth. It
# reads NSID 1 [56, 64) MiB, which no check of the NVMe trace looks at, and
# runs before p2pd verify, whose data in device memory the host checks.
p2pd_bench_uring() {
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.2 --rounds 1 --qd 1,8 \
		--only uring --json >/tmp/bench.out 2>&1 || {
		cat /tmp/bench.out
		return 1
	}
	grep -v '^[[{]' /tmp/bench.out
	! grep -q -e ' error: ' -e '"error":"' /tmp/bench.out || return 1
	for p in p2pdirect-uring upstream-uring-p2pmem upstream-uring-devmem uring-ram; do
		for w in rand-read-4K-qd1 rand-read-4K-qd8 seq-read-1M-qd1 seq-read-1M-qd8; do
			grep -q "^$w  *$p " /tmp/bench.out || { echo "no row: $w $p"; return 1; }
		done
	done
	grep -q '"queue_depth":8' /tmp/bench.out || return 1
	# Completions per io_uring_enter that waited: exactly 1 at QD 1, at
	# least 1 and at most the depth at QD 8, for each of the 8 runs.
	[ "$(grep -o '"queue_depth":1,[^}]*"completions_per_wait":1,' /tmp/bench.out | wc -l)" -eq 8 ] &&
		[ "$(grep -oE '"queue_depth":8,[^}]*"completions_per_wait":([1-7](\.[0-9]+)?|8),' \
			/tmp/bench.out | wc -l)" -eq 8 ] ||
		{ grep -o '"queue_depth":[0-9]*,[^}]*"completions_per_wait":[^,]*' /tmp/bench.out; return 1; }
}
p2pd_version_json() {
	p2pd_json version || return 1
	cat /tmp/json.out
	grep -q '"abi":"[0-9]*\.[0-9]*"' /tmp/json.out && grep -q '"module_version":"' /tmp/json.out
}
# An option the command does not take is refused, not ignored.
# Help on standard output with status 0, for the tool and a command.
p2pd_help() {
	for a in help 'help bench' 'bench --help' 'verify -h' 'bench --qd 0 -h'; do
		# shellcheck disable=SC2086 # the words of $a are the arguments
		/tests/p2pd $a >/tmp/out 2>/tmp/err || { echo "p2pd $a: exit $?"; return 1; }
		grep -q '^usage: p2pd' /tmp/out && [ ! -s /tmp/err ] || { echo "p2pd $a"; return 1; }
	done
	# The usage says what the README does: help COMMAND, the ranges, the
	# defaults, the size forms.
	for w in '^  help \[COMMAND\], COMMAND --help, COMMAND -h' '^  --seconds S .*0.001 <= S < 3600, default 1' \
		'^  --rounds R .*odd, 1-15, default 3' '^  --threads N .*1-64, default 4' \
		'^  --qd N\[,N...\] .*each 1-256, default 1,4,16,32,64' '^  --size B .*verify: default 16M' \
		'^Sizes B: bytes, decimal or 0x hex, with an optional k, M or G suffix'; do
		grep -q -- "$w" /tmp/out || { echo "usage lacks: $w"; return 1; }
	done
}
# Help and misplaced words: `help foo` is an unknown command, the word
# after --out is its value's place (never help), a word that is no option
# is unexpected, --size=16M gets a hint, a single-value option twice is
# refused; each exit 2 with nothing on stdout.
p2pd_bad_words() {
	for c in 'help foo/unknown command .foo.' 'help bench --json/help takes a command name' \
		'bench --out -h/--out needs a value' 'bench --out --help/--out needs a value' \
		'info extra/unexpected argument .extra.' 'verify --size=16M/use --size 16M' \
		'verify --dev a --dev b/--dev given twice' 'bench --seconds 1e-20/--seconds must be at least 0.001 and under 3600 (.1e-20. given)'; do
		# shellcheck disable=SC2086 # the words before the slash are the arguments
		/tests/p2pd ${c%%/*} >/tmp/out 2>/tmp/err
		rc=$?
		[ $rc -eq 2 ] && [ ! -s /tmp/out ] && grep -q -- "^p2pd: .*${c#*/}" /tmp/err ||
			{ echo "p2pd ${c%%/*}: exit $rc"; cat /tmp/out /tmp/err; return 1; }
	done
}
# A word that is not UTF-8: refused with a message, exit 2, no panic; as
# --out's FILE it is a file name like any other, and the JSON is there.
p2pd_not_utf8() {
	bad=$(printf '\377')
	/tests/p2pd info "$bad" 2>/tmp/err
	rc=$?
	[ $rc -eq 2 ] && grep -q '^p2pd: argument "\\xFF" is not valid UTF-8' /tmp/err ||
		{ echo "exit $rc"; cat /tmp/err; return 1; }
	/tests/p2pd verify --dev "/dev/$bad" 2>/tmp/err
	rc=$?
	[ $rc -eq 2 ] && grep -q -- '^p2pd: --dev: the value .* is not valid UTF-8' /tmp/err ||
		{ echo "exit $rc"; cat /tmp/err; return 1; }
	f=/tmp/p2pd-$bad.json
	rm -f "$f"
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--threads 1 --only 'p2pdirect seq-read-4K' --out "$f" >/dev/null 2>/tmp/err
	rc=$?
	[ $rc -eq 0 ] && grep -q '"path":"p2pdirect"' "$f" || { echo "exit $rc"; cat /tmp/err; return 1; }
	rm -f "$f"
}
# A standard error that cannot be written loses the message, not the exit
# status: no panic (101); bench --json still prints its JSON.
p2pd_stderr_full() {
	/tests/p2pd info >/dev/null 2>/dev/full
	rc=$?
	[ $rc -eq 0 ] || { echo "info 2>/dev/full: exit $rc"; return 1; }
	/tests/p2pd nosuch 2>/dev/full
	rc=$?
	[ $rc -eq 2 ] || { echo "nosuch 2>/dev/full: exit $rc"; return 1; }
	/tests/p2pd verify --dev /dev/nonexistent 2>/dev/full
	rc=$?
	[ $rc -eq 1 ] || { echo "verify --dev /dev/nonexistent 2>/dev/full: exit $rc"; return 1; }
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--threads 1 --only 'p2pdirect seq-read-4K' --json >/tmp/json.out 2>/dev/full
	rc=$?
	[ $rc -eq 0 ] && grep -q '"path":"p2pdirect"' /tmp/json.out ||
		{ echo "bench --json 2>/dev/full: exit $rc"; head -c 300 /tmp/json.out; return 1; }
}
# verify --dev of a namespace the provider cannot reach (NSID 4, on its own
# root port) is refused before anything is written, naming the provider,
# its PCI address and the namespace (it ALLOCed and wrote the data set,
# then failed with a bare "READ: Remote I/O error").
p2pd_verify_unreachable() {
	ns=$(ns_dev 4) || return 1
	# The data set's region (default --offset 40M) and its copy's (56M, with
	# the default --size 16M).
	for o in 40 56; do
		dd if="$ns" of="/tmp/ns4-$o-before" bs=4096 skip=$((o << 8)) count=1 iflag=direct 2>/dev/null &&
			[ -s "/tmp/ns4-$o-before" ] || { echo "cannot read NSID 4 at $o MiB"; return 1; }
	done
	/tests/p2pd verify --dev "$ns" 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] &&
		grep -q "^p2pd: provider [0-9]* ([0-9a-f:.]*) cannot reach ${ns##*/} by P2P DMA .*p2pd info.*nothing written" \
			/tmp/err || return 1
	for o in 40 56; do
		dd if="$ns" of="/tmp/ns4-$o-after" bs=4096 skip=$((o << 8)) count=1 iflag=direct 2>/dev/null &&
			cmp -s "/tmp/ns4-$o-before" "/tmp/ns4-$o-after" || { echo "NSID 4 at $o MiB changed"; return 1; }
	done
}
# bench's region errors name --offset and --size, their values or defaults,
# and the namespace's size in MiB (NSID 1: 256 MiB, so the default --size
# is 64 MiB); nothing runs.
p2pd_bench_region() {
	ns=$(ns_dev 1) || return 1
	/tests/p2pd bench --dev "$ns" --offset 248M --only nothing-runs 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] && grep -q -- "--offset 260046848 (248 MiB) and --size 67108864 (64 MiB: the default" /tmp/err &&
		grep -q '268435456 bytes (256 MiB)' /tmp/err || return 1
	/tests/p2pd bench --dev "$ns" --size 4M --only nothing-runs 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] && grep -q -- "^p2pd: --size 4194304 (4 MiB) is less than bench's minimum, 8 MiB" /tmp/err
}
# A value-taking option followed by another option has no value (exit 2),
# and a bad size names its option.
p2pd_missing_value() {
	/tests/p2pd verify --dev --json 2>/tmp/err
	[ $? -eq 2 ] && grep -q -e '--dev needs a value' /tmp/err || { cat /tmp/err; return 1; }
	/tests/p2pd bench --size abc 2>/tmp/err
	[ $? -eq 2 ] && grep -q -e "--size: 'abc' is not a size (a number of bytes" /tmp/err ||
		{ cat /tmp/err; return 1; }
	/tests/p2pd verify --size 99999999999999999999 2>/tmp/err
	[ $? -eq 2 ] && grep -q -e "--size: '99999999999999999999' is too big" /tmp/err ||
		{ cat /tmp/err; return 1; }
	/tests/p2pd verify --gpu 77 2>/tmp/err
	[ $? -eq 1 ] && grep -q -e '--gpu 77: no such device-memory provider' /tmp/err ||
		{ cat /tmp/err; return 1; }
}
# A standard output that cannot be written: exit 1 with the reason, no
# panic; bench writes its --out file first.
p2pd_stdout_full() {
	/tests/p2pd info >/dev/full 2>/tmp/err
	[ $? -eq 1 ] && grep -q 'standard output: No space left' /tmp/err &&
		! grep -q panicked /tmp/err || { cat /tmp/err; return 1; }
	rm -f /tmp/full.json
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 1 \
		--only 'p2pdirect seq-read-4K' --threads 1 --json --out /tmp/full.json >/dev/full 2>/tmp/err
	[ $? -eq 1 ] && ! grep -q panicked /tmp/err && grep -q '"path":"p2pdirect"' /tmp/full.json ||
		{ cat /tmp/err; return 1; }
}
# verify of a region not in whole logical blocks: refused before anything
# is allocated or written, naming the options and the block size.
p2pd_verify_unaligned() {
	for o in "--offset $((40 * 1048576 + 512 + 1))" '--size 1000'; do
		# shellcheck disable=SC2086 # $o is an option and its value
		/tests/p2pd verify --dev "$(ns_dev 1)" $o 2>/tmp/err
		[ $? -eq 1 ] && grep -q "logical block size (512 bytes)" /tmp/err ||
			{ cat /tmp/err; return 1; }
	done
}
p2pd_foreign_option() {
	/tests/p2pd stats --qd 4 2>/tmp/err
	[ $? -eq 2 ] && grep -q 'stats does not take --qd' /tmp/err || { cat /tmp/err; return 1; }
	/tests/p2pd version --reset 2>/tmp/err
	[ $? -eq 2 ] && grep -q 'version does not take --reset' /tmp/err
}
# bench --json: the table goes to stderr, stdout is the JSON alone; each
# run carries the IOPS of its three rounds.
p2pd_bench_json() {
	p2pd_json bench --dev "$(ns_dev 1)" --offset 56M --size 8M --seconds 0.1 --rounds 3 \
		--only 'p2pdirect seq-read-4K' 2>/tmp/err || { cat /tmp/err; return 1; }
	grep -q '"path":"p2pdirect"' /tmp/json.out && grep -q '^seq-read-4K  *p2pdirect ' /tmp/err &&
		[ "$(grep -o '"round_iops":\[[0-9.]*,[0-9.]*,[0-9.]*\]' /tmp/json.out | wc -l)" -eq 2 ] &&
		[ "$(grep -o '"completions_per_wait":null' /tmp/json.out | wc -l)" -eq 2 ] &&
		grep -q '"seconds_per_run":0.1,' /tmp/json.out
}
# A run that fails makes bench fail (exit 1) after the table: the p2pdirect
# path (one thread and four: two runs) into NSID 4, which no provider can
# reach (its controller sits on its own root port), gets EREMOTEIO.
p2pd_bench_failed_run() {
	/tests/p2pd bench --dev "$(ns_dev 4)" --seconds 0.1 --rounds 1 \
		--only 'p2pdirect seq-read-4K' >/tmp/bench.out 2>/tmp/err
	rc=$?
	cat /tmp/bench.out /tmp/err
	[ $rc -eq 1 ] && grep -q '^seq-read-4K  *p2pdirect  *error: ' /tmp/bench.out &&
		grep -q '2 of 2 runs failed' /tmp/err
}
# The upstream sysfs paths need the controller's published memory: NSID 4's
# controller has none, so they are left out and said so; the other runs
# still go (exit 0), and with only those asked for, bench says why it ran
# nothing (exit 1).
p2pd_bench_no_p2pmem() {
	/tests/p2pd bench --dev "$(ns_dev 4)" --seconds 0.1 --rounds 1 \
		--only 'upstream-p2pmem seq-read-4K' --only 'odirect-ram seq-read-4K' >/tmp/bench.out 2>&1 ||
		{ cat /tmp/bench.out; return 1; }
	cat /tmp/bench.out
	grep -q 'runs of upstream-p2pmem and upstream-uring-p2pmem left out: the controller of' \
		/tmp/bench.out && grep -q '^seq-read-4K  *odirect-ram  *[0-9]' /tmp/bench.out || return 1
	# A multipath head has no one controller: said so (nothing else to run,
	# so nothing is written).
	/tests/p2pd bench --dev "$(ns_dev 5)" --only 'upstream-p2pmem seq-read-4K' 2>/tmp/err
	[ $? -eq 1 ] && grep -q "left out: $(basename "$(ns_dev 5)") is a multipath head" /tmp/err ||
		{ cat /tmp/err; return 1; }
	/tests/p2pd bench --dev "$(ns_dev 4)" --seconds 0.1 --rounds 1 \
		--only upstream-uring-p2pmem --qd 1 2>/tmp/err
	[ $? -eq 1 ] && grep -q 'publishes no P2P memory' /tmp/err
}
# bench --only that matches no run: refused, and --out creates no file.
p2pd_bench_no_run() {
	rm -f /tmp/none.json
	/tests/p2pd bench --dev "$(ns_dev 1)" --offset 56M --size 8M --only nothing-matches \
		--out /tmp/none.json 2>/tmp/err
	rc=$?
	cat /tmp/err
	[ $rc -eq 1 ] && grep -q -- '--only matches no run' /tmp/err && [ ! -e /tmp/none.json ]
}
# A multipath head's distance is its paths' (the longest): NSID 5's paths
# all reach the GPUs, one of NSID 6's does not.
p2pd_info_heads() {
	p2pd_json info || return 1
	h5=$(basename "$(ns_dev 5)") && h6=$(basename "$(ns_dev 6)") || return 1
	grep -o '"distance":{[^}]*}' /tmp/json.out
	grep -q "\"$h5\":[0-9]" /tmp/json.out && grep -q "\"$h6\":null" /tmp/json.out || return 1
	# A head has no one controller: null, as every missing value in the JSON.
	grep -q "{\"device\":\"$h5\",\"nsid\":5,\"serial\":\"[^\"]*\",\"controller\":null," /tmp/json.out &&
		! grep -q '"controller":""' /tmp/json.out || { grep -o '"namespaces":.\{0,600\}' /tmp/json.out; return 1; }
}
# version, info and stats open the device read-only: a node made readable
# serves them to an ordinary user; stats --reset needs write access.
p2pd_read_only() {
	mode=$(stat -c %a /dev/p2pdirect) || return 1
	chmod 0644 /dev/p2pdirect || return 1
	su -s /bin/sh nobody -c '/tests/p2pd version && /tests/p2pd info && /tests/p2pd stats' \
		>/tmp/ro.out 2>&1
	rc=$?
	su -s /bin/sh nobody -c '/tests/p2pd stats --reset' >/tmp/ro2.out 2>&1
	rc2=$?
	chmod "$mode" /dev/p2pdirect
	tail -n 3 /tmp/ro.out
	cat /tmp/ro2.out
	[ $rc -eq 0 ] && [ $rc2 -eq 1 ] && grep -q '^p2pd: /dev/p2pdirect: Permission denied' /tmp/ro2.out
}
# verify and bench write over the namespace's data: a mounted one (NSID 2,
# ext4) is refused before anything is allocated or written.
p2pd_in_use() {
	ns=$(ns_dev 2) || return 1
	for c in verify bench; do
		/tests/p2pd $c --dev "$ns" 2>/tmp/err
		rc=$?
		cat /tmp/err
		[ $rc -eq 1 ] && grep -q "^p2pd: $ns: in use (mounted" /tmp/err || return 1
	done
}
p2pd_bad_qd() {
	/tests/p2pd bench --qd 0 2>/tmp/err
	[ $? -eq 2 ] && grep -q -- "--qd takes a whole number 1..256 ('0' given)" /tmp/err
}
p2pd_suite() {
	say "# suite: p2pd"
	n=0
	fails=0
	check "p2pd info: providers, namespaces, reachability matrix" p2pd_info_matrix
	check "p2pd info --json is one JSON document, providers with bytes_total, bytes_free and bytes_used; exact sizes in the text" \
		p2pd_info_json
	check "p2pd info: the reachability matrix's header lines up with its rows" p2pd_info_aligned
	check "p2pd bench --qd 1,8 --only uring: the io_uring paths at each depth" p2pd_bench_uring
	# The bench runs allocate (and zero) device memory: before verify, whose
	# data in device memory the host checks.
	check "p2pd bench --json: stdout is the JSON alone, the table on stderr, every round's IOPS" p2pd_bench_json
	check "p2pd bench with a failed run: its error row, exit 1" p2pd_bench_failed_run
	check "p2pd bench --out to a path that cannot be written: refused before any run" p2pd_bench_bad_out
	check "p2pd bench --out /dev/null and --out a pipe: written, exit 0" \
		p2pd_bench_out_not_a_file
	check "p2pd bench --threads 1 --qd 8,8: each run once, no -t1 run" p2pd_bench_one_thread
	check "p2pd with a word that is not UTF-8: refused, exit 2, no panic; --out takes any file name" \
		p2pd_not_utf8
	check "p2pd with standard error full: the exit status kept, no panic; bench --json prints its JSON" \
		p2pd_stderr_full
	# Its bench reads into device memory: before p2pd verify, whose data the host checks.
	check "p2pd with standard output full: exit 1 with the reason, --out written first" \
		p2pd_stdout_full
	check "p2pd verify --records --json: the records inside the one JSON document" p2pd_verify_json
	check "p2pd verify without device memory for it: refused before the namespace is written" \
		p2pd_verify_no_memory
	check "p2pd verify: 8 MiB NVMe -> GPU -> NVMe, every byte" p2pd_verify
	check "p2pd verify --dev the provider cannot reach: refused naming both, nothing written, exit 1" \
		p2pd_verify_unreachable
	check "p2pd bench region past the end or too small: refused naming --offset, --size, defaults, MiB" \
		p2pd_bench_region
	check "p2pd stats --json is one JSON document, block rows named" p2pd_stats_json
	check "p2pd stats --reset: the counters as they were, then \"(counters reset)\", then zero" \
		p2pd_stats_reset
	check "p2pd version --json is one JSON document with the ABI" p2pd_version_json
	check "p2pd bench on a controller without p2pmem: upstream sysfs paths left out, said so" \
		p2pd_bench_no_p2pmem
	check "p2pd with an option the command does not take: refused, exit 2" p2pd_foreign_option
	check "p2pd with an option the command does not take: refused before its value, exit 2" \
		p2pd_foreign_option_value
	check "p2pd verify --dev of no namespace: clear error, exit 1" p2pd_bad
	check "p2pd verify --gpu of published memory: says it is not a BAR provider, exit 1" \
		p2pd_published_gpu
	check "p2pd with an unknown option: usage, exit 2" sh -c '/tests/p2pd info --bogus; [ $? -eq 2 ]'
	check "p2pd bench --qd 0: clear error, exit 2" p2pd_bad_qd
	check "p2pd info: a multipath head's distance is its paths', null if one is out of reach" \
		p2pd_info_heads
	check "p2pd bench --only matching nothing: refused, no --out file left" p2pd_bench_no_run
	check "p2pd version, info, stats: read-only open, for a readable node; stats --reset needs write" \
		p2pd_read_only
	check "p2pd verify and bench of a mounted namespace: refused as in use, nothing written" \
		p2pd_in_use
	check "p2pd help, p2pd help bench, p2pd bench --help: usage on stdout, every option's range and default, exit 0" \
		p2pd_help
	check "p2pd help foo, --out -h, info extra, --size=16M, --dev twice, --seconds 1e-20: named, exit 2" \
		p2pd_bad_words
	check "p2pd --dev --json: --dev needs a value, exit 2; bad --size and --gpu named" \
		p2pd_missing_value
	check "p2pd verify of a region not in whole logical blocks: refused, block size named" \
		p2pd_verify_unaligned
	say "1..$n"
	say "# suite-exit: p2pd $fails"
}

# The ioctl fuzzer (userspace-test/c/fuzz_test.c) for $1 seconds; the kernel
# command line may fix its seed, duration and threads (p2p_fuzz_seed,
# p2p_fuzz_seconds, p2p_fuzz_threads: FUZZ_SEED, FUZZ_SECONDS, FUZZ_THREADS
# on the host). It prints its seed first, for a replay.
fuzz_suite() {
	run_suite c-fuzz /tests/fuzz_test --seconds "${p2p_fuzz_seconds:-$1}" \
		--threads "${p2p_fuzz_threads:-4}" ${p2p_fuzz_seed:+--seed "$p2p_fuzz_seed"}
}

# --- stacked block devices (stack_test.c) ---------------------------------
# mpath_paths DEV: the paths of a multipath head, as the head lists them.
mpath_paths() { ls "/sys/block/${1##*/}/multipath" 2>/dev/null; }
# Each multipath head has its two paths, one per controller of its subsystem.
mpath_heads() {
	for id in 5 6; do
		dev=$(ns_dev $id) || { echo "no head for nsid $id"; return 1; }
		echo "nsid $id: $dev, paths: $(mpath_paths "$dev" | tr '\n' ' ')"
		count_is 2 "$(mpath_paths "$dev")" || return 1
	done
}
# The md arrays (no superblock: the legs' blocks map 1:1, or by chunk) and
# the dm-linear device stack_test.c uses.
stack_build() {
	n7=$(ns_dev 7) && n8=$(ns_dev 8) && n9=$(ns_dev 9) || return 1
	mkdir -p /run/mdadm
	mdadm --build /dev/md0 --level=0 --chunk=64 --raid-devices=2 "${n7}p1" "${n8}p1" &&
		mdadm --build /dev/md1 --level=1 --raid-devices=2 --assume-clean "${n7}p2" "${n8}p2" &&
		mdadm --build /dev/md2 --level=1 --raid-devices=2 --assume-clean "${n7}p3" "${n9}p1" &&
		mdadm --build /dev/md7 --level=1 --raid-devices=1 --force --assume-clean "${n9}p2" &&
		dmsetup create p2plin --noudevsync \
			--table "0 $(cat "/sys/class/block/${n8##*/}p3/size") linear ${n8}p3 0" &&
		dmsetup mknodes p2plin || return 1
	stack_limits_build || return 1
	md_deep_build || return 1
	cat /proc/mdstat
	dmsetup table p2plin
	ls /sys/block/md2/slaves
}
# The stacks at DMA_PROBE's limits (4 levels, 32 legs), read-only and never
# read or written: p2pdeep2..p2pdeep5, each dm-linear over the one before and
# p2pdeep2 over p2plin (so p2pdeep4 is 4 dm levels above nsid 8 p3, p2pdeep5
# 5); p2pleg1..p2pleg33, 4 KiB of nsid 8 p3 each, and p2pwide32 and
# p2pwide33, dm-linear over the first 32 or all 33 of them. The tables name
# the lower dm devices by major:minor: with no udev in the guest, their
# /dev/mapper nodes exist only after dmsetup mknodes.
stack_limits_build() {
	p3=/sys/class/block/${n8##*/}p3
	lower=p2plin
	for i in 2 3 4 5; do
		dmsetup create "p2pdeep$i" --noudevsync --readonly \
			--table "0 $(cat "$p3/size") linear $(dm_dev "$lower") 0" || return 1
		lower=p2pdeep$i
	done
	for i in $(seq 1 33); do
		dmsetup create "p2pleg$i" --noudevsync --readonly \
			--table "0 8 linear ${n8}p3 $((i * 8))" || return 1
	done
	for w in 32 33; do
		for i in $(seq 1 "$w"); do
			echo "$(((i - 1) * 8)) 8 linear $(dm_dev "p2pleg$i") 0"
		done | dmsetup create "p2pwide$w" --noudevsync --readonly || return 1
	done
	dmsetup mknodes || return 1
	echo "p2pdeep5 ($(dm_blk p2pdeep5)) legs: $(ls "/sys/block/$(dm_blk p2pdeep5)/slaves")"
	echo "p2pwide33 ($(dm_blk p2pwide33)) legs: $(ls "/sys/block/$(dm_blk p2pwide33)/slaves" | wc -l)"
}
# md raid1 arrays of one leg each, stacked on md1: md3 over md1, md4 over
# md3 and so on, so that md5 is 4 md levels above nsid 7 p2 and nsid 8 p2
# and md6 5 levels; stack_test reads and writes through them.
md_deep_build() {
	lower=/dev/md1
	for i in 3 4 5 6; do
		mdadm --build "/dev/md$i" --level=1 --raid-devices=1 --force --assume-clean "$lower" ||
			return 1
		lower=/dev/md$i
	done
	echo "md6 legs: $(ls /sys/block/md6/slaves), md3 legs: $(ls /sys/block/md3/slaves)"
}
# dm_blk NAME: the block device (dm-N) of the dm device NAME; dm_dev NAME:
# its major:minor. One dmsetup each (a process is costly under TCG).
dm_blk() { dmsetup info -c --noheadings -o blkdevname "$1" | grep .; }
dm_dev() { dmsetup info -c --noheadings -o devno "$1" | grep .; }
# Removes those that exist, top down; fails if one of them stays.
stack_limits_teardown() {
	rc=0
	for d in p2pwide33 p2pwide32 $(for i in $(seq 1 33); do echo "p2pleg$i"; done) \
		p2pdeep5 p2pdeep4 p2pdeep3 p2pdeep2; do
		dmsetup info "$d" >/dev/null 2>&1 || continue
		dmsetup remove --noudevsync "$d" || rc=1
	done
	return $rc
}
# No md array lost a leg: every array shows all its members up (md1 and
# md2 [UU], md3 to md7 [U]) and none is marked faulty.
mdstat_clean() {
	cat /proc/mdstat
	! grep -q '(F)' /proc/mdstat && [ "$(grep -c '\[UU\]' /proc/mdstat)" = 2 ] &&
		[ "$(grep -c '\[U\]' /proc/mdstat)" = 5 ]
}
stack_teardown() {
	rc=0
	stack_limits_teardown || rc=1
	for i in 6 5 4 3; do
		! grep -q "^md$i " /proc/mdstat || mdadm --stop "/dev/md$i" || rc=1
	done
	dmsetup remove --noudevsync p2plin && mdadm --stop /dev/md0 /dev/md1 /dev/md2 /dev/md7 || rc=1
	return $rc
}
stack_suites() {
	# P2PDIRECT_ONLY=stack runs these suites alone.
	case ",${p2p_only:-stack}," in *,stack,*) ;; *) return 0 ;; esac
	say "# suite: stack"
	n=0
	fails=0
	check "multipath heads of nsid 5 and 6, two paths each" mpath_heads
	check "md raid0, raid1, raid1 with a root-port leg, raid1 of one root-port leg; dm-linear; dm stacks 4 and 5 deep, 32 and 33 wide; md stacks 4 and 5 deep" stack_build
	say "1..$n"
	say "# suite-exit: stack $fails"
	say "# suite: c-stack"
	P2P_MPATH_SW=$(ns_dev 5) P2P_MPATH_MIX=$(ns_dev 6) P2P_MD_RAID0=/dev/md0 \
		P2P_MD_RAID1=/dev/md1 P2P_MD_MIXED=/dev/md2 P2P_MD_ONE_RP=/dev/md7 \
		P2P_MD_ONE_LEG="$(basename "$(ns_dev 9)")p2" \
		P2P_DM_LINEAR=/dev/mapper/p2plin \
		P2P_PART="$(ns_dev 7)p4" P2P_DM_DEEP4=/dev/mapper/p2pdeep4 \
		P2P_DM_DEEP5=/dev/mapper/p2pdeep5 P2P_DM_WIDE32=/dev/mapper/p2pwide32 \
		P2P_DM_WIDE33=/dev/mapper/p2pwide33 P2P_MD_DEEP4=/dev/md5 P2P_MD_DEEP5=/dev/md6 \
		/tests/stack_test >"$out" 2>&1
	say "# suite-exit: c-stack $?"
	say "# suite: stack-after"
	n=0
	fails=0
	check "/proc/mdstat: no array lost a leg" mdstat_clean
	check "p2pd info lists the stacked devices and their legs" p2pd_info_stacked
	check "md arrays stopped, dm devices removed" stack_teardown
	say "1..$n"
	say "# suite-exit: stack-after $fails"
}

# Unmount, then (teardown_suites cmb-unbind) harden_test's unbind of the
# CMB's driver under a live allocation, which needs that controller's
# namespaces unmounted; then unload the module and scan kmemleak.
teardown_suites() {
	say "# suite: guest-teardown"
	n=0
	fails=0
	check "umount /mnt/ext4" umount /mnt/ext4
	check "umount /mnt/xfs" umount /mnt/xfs
	say "1..$n"
	say "# suite-exit: guest-teardown $fails"
	[ "$1" != cmb-unbind ] ||
		run_suite c-harden-unbind /tests/harden_test -t cmb_unbind_revokes_allocations
	say "# suite: guest-unload"
	n=0
	fails=0
	check "rmmod p2pd_importer" rmmod p2pd_importer
	check "rmmod p2pd_client" rmmod p2pd_client
	check "rmmod p2pdirect" rmmod p2pdirect
	check "module and /dev/p2pdirect gone" module_gone
	check "p2pd without the module: says to load it, exit 1" p2pd_no_module
	check "kmemleak reports nothing" kmemleak_clean
	say "1..$n"
	say "# suite-exit: guest-unload $fails"
}

p2pd_no_module() {
	/tests/p2pd version 2>/tmp/err
	[ $? -eq 1 ] && grep -q 'is p2pdirect.ko loaded' /tmp/err || { cat /tmp/err; return 1; }
}

# The file systems mounted and the module loaded, as checks of the suite
# "guest", for `make check` and `make fuzz` alike.
mount_and_load() {
	# nodelalloc: per-file data journalling (chattr +j), whose O_DIRECT goes
	# through the page cache, can then be tested (harden_test).
	check "mount nsid 2 (ext4, nodelalloc) at /mnt/ext4, data.bin 8 MiB" mount_ns 2 ext4 /mnt/ext4 nodelalloc
	check "mount nsid 3 (xfs) at /mnt/xfs, data.bin 8 MiB" mount_ns 3 xfs /mnt/xfs
	echo clear >/sys/kernel/debug/kmemleak
	# A small pin cap, so that the tests can reach it (peermem_test).
	check "insmod p2pdirect.ko max_pinned_mib=96" insmod /p2pdirect.ko max_pinned_mib=96
	check "/dev/p2pdirect is a root-only char device" devnode_root_only
	# The test modules (testmod/): a dma-buf importer and kernel-API
	# consumer playing an RDMA driver, a client playing another GPU driver.
	check "insmod p2pd_importer.ko" insmod /p2pd_importer.ko
	check "insmod p2pd_client.ko" insmod /p2pd_client.ko
}

run_checks() {
	say "# suite: guest"
	describe_pci | sed 's/^/# /' >"$out"
	# Which downstream port each GPU hangs off: the host maps that to a backing file.
	for g in $(gpus); do say "# GPUMAP ${g##*/} $(basename "$(dirname "$(readlink -f "$g")")")"; done
	host_records >"$out"
	check "kernel is ${p2p_kver:-?}.x ($(uname -r))" kernel_series
	for opt in RUST PCI_P2PDMA KASAN PROVE_LOCKING DEBUG_KMEMLEAK DEBUG_ATOMIC_SLEEP; do
		check "kernel has CONFIG_$opt" config_has $opt
	done
	check "two emulated GPUs (ivshmem-plain 1af4:1110)" count_is 2 "$(gpus)"
	check "six NVMe controllers" count_is 6 "$(nvmes)"
	iommu_checks
	check "PCIe switch: GPUs and nvme sw behind it, nvme rp outside" switch_topology
	check "NVMe namespaces: nsid 1-3, 7, 8 on p2pnvme-sw, 4, 9 on p2pnvme-rp, 5, 6 multipath" namespace_layout
	mount_and_load
	say "1..$n"
	say "# suite-exit: guest $fails"

	kunit_suites
	run_suite c-abi /tests/p2pdirect_test
	run_suite c-harden /tests/harden_test -T cmb_unbind_revokes_allocations \
		-T registrations_of_another_providers_memory_past_131072
	# Six minutes under TCG and KASAN, and about the module's lists, not
	# the kernel or the IOMMU: in one configuration (p2p_scale=1, the
	# default; make check-matrix turns it off in the others).
	if [ "${p2p_scale:-0}" = 1 ]; then
		run_suite c-harden-scale /tests/harden_test \
			-t registrations_of_another_providers_memory_past_131072
	fi
	run_suite c-devmem /tests/devmem_test
	run_suite c-peermem /tests/peermem_test
	run_suite c-storage /tests/storage_test
	run_suite c-uring /tests/uring_test
	run_suite c-dmabuf /tests/dmabuf_test
	run_suite c-kapi /tests/kapi_test
	run_suite c-fault /tests/fault_test
	stack_suites
	for t in /tests/rust-*; do
		run_suite "${t##*/}" rust_suite "$t"
	done
	p2pd_suite
	say "# suite: guest-probe"
	n=0
	fails=0
	check "new_id binding of a device without a memory BAR2 is refused with a reason" refused_probe
	say "1..$n"
	say "# suite-exit: guest-probe $fails"

	# Last before the teardown: it must not disturb what the other suites
	# left for the host checks (see the top of fuzz_test.c for how it keeps
	# out of their way).
	fuzz_suite 75
	teardown_suites cmb-unbind
}

# `make fuzz`: the module loaded and the file systems mounted as for the
# checks, the fuzzer for p2p_fuzz_seconds (600 by default), then unmount,
# unload and the kmemleak scan.
run_fuzz() {
	say "# suite: guest"
	check "kernel is ${p2p_kver:-?}.x ($(uname -r))" kernel_series
	for opt in RUST PCI_P2PDMA KASAN PROVE_LOCKING DEBUG_KMEMLEAK DEBUG_ATOMIC_SLEEP; do
		check "kernel has CONFIG_$opt" config_has $opt
	done
	check "NVMe namespaces: nsid 1-3, 7, 8 on p2pnvme-sw, 4, 9 on p2pnvme-rp, 5, 6 multipath" namespace_layout
	mount_and_load
	say "1..$n"
	say "# suite-exit: guest $fails"

	fuzz_suite 600
	teardown_suites
}

# The main job: NVMe -> emulated GPU memory -> NVMe with p2pdirect, checked
# in the guest and (through the records p2pd verify prints) by the host;
# then the paths compared in a short benchmark, and the module's statistics.
run_demo() {
	{
		echo "kernel: $(uname -r) ($(uname -v))"
		for opt in RUST PCI_P2PDMA KASAN; do
			echo "  CONFIG_$opt=$(zcat /proc/config.gz | grep "^CONFIG_$opt=" | cut -d= -f2)"
		done
		echo "PCI devices (emulated GPUs = ivshmem-plain, NVMe controllers):"
		describe_pci
		switch_topology >/tmp/topo 2>&1 && echo "topology: $(cat /tmp/topo)" ||
			echo "topology: unexpected: $(cat /tmp/topo)"
	} >"$out" 2>&1
	for g in $(gpus); do say "# GPUMAP ${g##*/} $(basename "$(dirname "$(readlink -f "$g")")")"; done
	host_records >"$out"
	if ! insmod /p2pdirect.ko; then
		say "module: insmod FAILED"
		return
	fi
	say "module: loaded; $(ls -l /dev/p2pdirect)"
	say ""
	say "== p2pd info =="
	/tests/p2pd info >"$out" 2>&1
	say ""
	# The benchmark first: it reuses device memory, the verified data must
	# be the last thing written there for the host to find it.
	say "== p2pd bench (short): the same I/O over six paths, and four io_uring paths at QD 32 =="
	/tests/p2pd bench --seconds 0.5 --rounds 1 --threads 4 --qd 32 >"$out" 2>/dev/null || say "p2pd bench: FAILED"
	say ""
	say "== p2pd verify: 16 MiB NVMe -> GPU memory -> NVMe, every byte checked =="
	/tests/p2pd verify --size 16M --records >"$out" 2>&1 || say "p2pd verify: FAILED"
	say ""
	say "== p2pd stats =="
	/tests/p2pd stats >"$out" 2>&1
	rmmod p2pdirect && say "module: unloaded"
}

# `make bench`: the full benchmark (or the part p2p_only names); its JSON goes
# to the host between markers.
# `make profile`: each workload of p2p_only (comma-separated `path/workload`,
# as p2pd bench names them) runs for p2p_bench_seconds (2 s by default) under
# `perf record` sampling every
# CPU with call chains (the cpu-clock event: TCG has no PMU); the busiest
# symbols print, by their own samples and with their callees'.
run_profile() {
	if ! insmod /p2pdirect.ko; then
		say "module: insmod FAILED"
		return
	fi
	echo 0 >/proc/sys/kernel/kptr_restrict
	echo -1 >/proc/sys/kernel/perf_event_paranoid
	list=${p2p_only:-p2pdirect/rand-read-4K,upstream-p2pmem/rand-read-4K,p2pdirect-uring/rand-read-4K-qd32,upstream-uring-p2pmem/rand-read-4K-qd32,p2pdirect-uring/seq-read-1M-qd32,p2pdirect/seq-read-1M}
	for w in $(echo "$list" | tr ',' ' '); do
		path=${w%%/*}
		wl=${w#*/}
		qd=$(echo "$wl" | sed -n 's/.*-qd\([0-9]*\)$/\1/p')
		th=$(echo "$wl" | sed -n 's/.*-t\([0-9]*\)$/\1/p')
		say "# PROFILE $path $wl"
		if ! perf record -q -g -e cpu-clock -F 4000 -a -o /tmp/perf.data -- \
			/tests/p2pd bench --only "$path $wl" ${qd:+--qd "$qd"} --threads "${th:-1}" \
			--seconds "${p2p_bench_seconds:-2}" --rounds 1 --out /tmp/profile.json >/tmp/profile.txt 2>&1; then
			say "p2pd bench under perf: FAILED"
			sed 's/^/  /' /tmp/profile.txt >"$out"
			continue
		fi
		tr '\r' '\n' </tmp/profile.txt | grep -E "^(workload|$wl )" >"$out"
		# Every call chain that entered the kernel through the benchmark's
		# syscalls or task work, one folded line each (ci/calltree.py).
		say "## folded"
		perf report -i /tmp/perf.data --stdio --no-children --sort sym \
			-g folded,0,caller,count 2>/dev/null |
			grep -E 'io_uring_enter|sys_ioctl|sys_pread|sys_pwrite|task_work' |
			grep -v '^#' >"$out"
		for view in self:--no-children:40 "with callees:--children:60"; do
			say "## ${view%%:*}"
			opt=${view#*:}
			if ! perf report -i /tmp/perf.data --stdio "${opt%:*}" --sort dso,sym -g none \
				>/tmp/report.txt 2>/tmp/report.err || ! grep -q '%' /tmp/report.txt; then
				say "perf report: FAILED"
				head -5 /tmp/report.err >"$out"
				continue
			fi
			grep -v -e '^#' -e '^$' /tmp/report.txt | head -"${opt##*:}" >"$out"
		done
	done
	rmmod p2pdirect
}

run_bench() {
	if ! insmod /p2pdirect.ko; then
		say "module: insmod FAILED"
		return
	fi
	# A focused run (see "The two commands" in README.md): P2PDIRECT_ONLY's
	# `path/workload` filters, P2PDIRECT_BENCH_ROUNDS, P2PDIRECT_BENCH_QD and
	# P2PDIRECT_BENCH_SECONDS on the host (p2p_only, p2p_bench_* here).
	set -- --out /tmp/bench.json
	for w in $(echo "${p2p_only:-}" | tr ',' ' '); do
		set -- "$@" --only "$(echo "$w" | tr '/' ' ')"
	done
	[ -z "${p2p_bench_rounds:-}" ] || set -- "$@" --rounds "$p2p_bench_rounds"
	[ -z "${p2p_bench_qd:-}" ] || set -- "$@" --qd "$p2p_bench_qd"
	[ -z "${p2p_bench_seconds:-}" ] || set -- "$@" --seconds "$p2p_bench_seconds"
	/tests/p2pd bench "$@" >"$out" 2>&1 || say "p2pd bench: FAILED"
	say "# BENCH-JSON-BEGIN"
	cat /tmp/bench.json >"$out"
	say ""
	say "# BENCH-JSON-END"
	rmmod p2pdirect
}
