#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Scans a guest console log for kernel complaints. Prints each offending line
# (with its line number) and exits 1 if there is any, 0 if the log is clean.
# Usage: scan-log.sh CONSOLE_LOG
set -u
log=${1:?usage: scan-log.sh CONSOLE_LOG}
[ -r "$log" ] || { echo "scan-log: cannot read $log" >&2; exit 2; }

# One extended regex per kind of report. WARN_ON, lockdep ("WARNING: possible
# circular locking dependency", "WARNING: inconsistent lock state", ...), RCU
# splats and refcount/list corruption all print "WARNING:"; KASAN, sleeping in
# atomic context, soft lockups and NULL dereferences print "BUG:".
patterns=(
	'WARNING:'
	'BUG:'
	'Oops'
	'Kernel panic'
	'kernel BUG at'
	'general protection fault'
	'Unable to handle kernel'
	'Call Trace:'
	'UBSAN:'
	'panicked at'
	'DEBUG_LOCKS_WARN_ON'
	'INFO: possible'
	'INFO: task .* blocked for more than'
	'rcu: INFO:'
	'unreferenced object 0x'
	'kmemleak: [0-9]+ new suspected memory leak'
	'kmemleak: .*disabled'
)
re=$(IFS='|'; echo "${patterns[*]}")
# The kernel echoes its command line; never judge that line. Between the
# marker lines of fault_test's allocation-failure cases, the page allocator's
# own report of a failure they injected ("<task>: page allocation failure:"
# or "vmalloc error:", then the task and hardware lines and a call trace) is
# expected: its "Call Trace:" line is accepted when such a report opened at
# most 8 lines before. Every other pattern still counts there. Between
# harden_test's memory-cgroup markers, a test process past its cgroup's
# memory.max may be killed by that cgroup's OOM killer, whose report ("<task>
# invoked oom-killer:", a call trace, ..., "oom-kill:constraint=...") is
# expected when it is of the test's own cgroup (CONSTRAINT_MEMCG,
# oom_memcg=/p2pd-limit-*): its call trace waits for that line, and counts
# if the report ends otherwise.
awk -v re="$re" '
function flush() { if (pending != "") { printf "%s", pending; bad = 1 } pending = "" }
/p2pdirect-fault: injecting allocation failures/ { window = 1 }
/p2pdirect-fault: allocation failure injection over/ { window = 0; report = 0 }
/p2pdirect-memcg: out-of-memory kills expected/ { window = 2 }
/p2pdirect-memcg: out-of-memory window over/ { window = 0; report = 0; flush() }
window == 1 && /: (page allocation failure|vmalloc error): / { report = NR }
window == 2 && / invoked oom-killer: / { flush(); report = NR }
window == 2 && /oom-kill:constraint=CONSTRAINT_MEMCG,.*,oom_memcg=\/p2pd-limit-[0-9]+,/ { pending = "" }
$0 ~ re && !/Kernel command line:/ {
	if (window && report && NR - report <= 8 && /Call Trace:/) {
		if (window == 2)
			pending = pending NR ":" $0 "\n"
		next
	}
	print NR ":" $0
	bad = 1
}
END { flush(); exit bad }' "$log"
