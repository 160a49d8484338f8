// SPDX-License-Identifier: GPL-2.0
/*
 * A bounded fuzzer for /dev/p2pdirect: its ioctls, its io_uring commands,
 * mmap and the lifetime of device memory (plain TAP on stdout). Run as root in the test VM, with the
 * module loaded and ext4/xfs mounted at /mnt/ext4 and /mnt/xfs.
 *
 *   fuzz_test [--seed N] [--seconds S] [--threads T] [--trace]
 *
 * Worker threads issue random operations: every command of the ABI, unknown
 * numbers of its range, known numbers with a wrong size or direction; with
 * arguments that mix real values (provider indices, handles, mmap offsets and
 * registration ids of its own, device pointers into its own mappings, O_DIRECT
 * fds of NVMe namespaces and of scratch files on ext4 and xfs) with hostile
 * ones (0, ~0, huge or unaligned sizes and offsets, non-zero pad, random flags;
 * the argument itself or an array pointer NULL, in the kernel, non-canonical,
 * PROT_NONE, read-only, straddling into a guard page, in device memory or in a
 * freed device mapping; device pointers into RAM, a file mapping, a PFN
 * mapping of a BAR, another driver's P2PDMA memory, unmapped memory; fds that
 * are closed, invalid, /dev/null, a pipe, a socket, a directory, tmpfs, procfs,
 * memfd, epoll, eventfd, O_RDONLY/O_WRONLY/O_APPEND/buffered files and
 * namespaces, /dev/p2pdirect itself). The same READ and WRITE arguments go
 * as io_uring commands through rings of the thread's own (see op_uring), which
 * stay in flight across the other operations, and some rings are torn down
 * with commands in flight. They mmap, munmap (whole, head, tail,
 * middle), madvise, mprotect and mremap device memory with random offsets,
 * lengths, protections and flags and touch it, fork children that use device
 * memory and exit or get killed, close and reopen their own device file and
 * toggle O_DIRECT on scratch files under running I/O, while a racer thread
 * keeps replacing one shared /dev/p2pdirect fd under everyone with dup2() (or
 * close, then reopen). Every operation is bounded (real I/O at most 1 MiB,
 * allocations at most 16 MiB, fixed-size tables); the run stops by itself
 * after --seconds.
 *
 * Judged here, one TAP line each:
 *  - every ioctl returns 0 or -1 with an errno of the allowed set below (an
 *    io_uring command's CQE the same, or -ECANCELED), and
 *    so do mmap, munmap, madvise, mprotect and mremap on device memory;
 *  - nothing succeeds that the ABI (the header, the README) says must fail:
 *    unknown command numbers (ENOTTY), non-zero pad, unknown flags, size 0,
 *    a device pointer into RAM, READ/WRITE on an fd of the wrong kind or
 *    access mode, ALLOC with a bad alignment; MAP_PRIVATE, PROT_EXEC, a
 *    wrong length, mremap growth; and what succeeds returns sane values
 *    (ABI major, page-rounded sizes, provider count, bytes moved <= size,
 *    registration states);
 *  - CPU access: a mapping of a live allocation of the thread's own file never
 *    faults (also after MADV_DONTNEED, after its fd was closed: a mapping
 *    keeps the file), one whose allocation was freed gets SIGBUS, and a fork
 *    child does not inherit device mappings (SIGSEGV);
 *  - fork children exit normally (or by the SIGKILL the fuzzer sent);
 *  - the run ends by itself: a watchdog reports "not ok" if it overshoots
 *    --seconds by 30 s;
 *  - after everything is closed: no device memory in use (LIST_PROVIDERS
 *    bytes_used) or pinned (STATS pinned_bytes);
 *  - the emulated GPUs' memory is as the fuzzer found it (see below).
 * Kernel-side failures (oops, KASAN, lockdep, WARN, kmemleak) are judged by
 * the host from the console. So that one can be replayed, the seed is printed
 * first, on stdout and into the kernel log:
 *   fuzz_test --seed N --seconds S --threads T
 * Each thread (and each fork child) draws from its own PRNG derived from the
 * seed, so a replay repeats every thread's sequence of operations; the
 * interleaving of the threads and the racer's timing are the scheduler's
 * (--threads 1 narrows a failure down, --trace prints every ioctl).
 *
 * Allowed errnos (the union of what the header documents and what the
 * kernel's mm and VFS return for these calls): EINVAL EFAULT ENOTTY EBADF
 * ENOENT ENOMEM ENOSPC ENODEV ENXIO EPERM EACCES EBUSY EREMOTEIO EOPNOTSUPP
 * ESTALE ERANGE EDQUOT EISDIR ESPIPE EOVERFLOW ENOTBLK ETXTBSY EIO EAGAIN
 * EINTR E2BIG EFBIG EROFS EXDEV EMFILE (EXPORT_DMABUF with no free fd),
 * ETOOMANYREFS (a page pinned P2PDIRECT_PAGE_PINS_MAX times), and
 * EEXIST (REGISTER of a range the file already registered). Anything else, or a return value other than 0 and -1,
 * is a failure.
 *
 * Data safety: the host checks what the other suites left in the namespace
 * images and the GPUs' memory, and that every traced NVMe command on their
 * ranges DMA'd where they said. So the fuzzer
 *  - READs and WRITEs raw namespaces only at NSID 1 and NSID 4, in
 *    [200 MiB, 256 MiB) or past their end (WRITE offsets never wrap), and its
 *    own scratch files on ext4 and xfs; NSID 2 and 3 (the mounted file
 *    systems) only serve DMA_PROBE; /mnt/{ext4,xfs}/data.bin are never opened;
 *    every namespace fd is opened before the threads start and stays open, so
 *    no other fd number can turn into one;
 *  - saves each GPU BAR (sysfs resourceN) before it starts and writes it back
 *    after its last device file is closed: its allocations reuse memory whose
 *    content the host checks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/p2pdirect.h>
#include <liburing.h>

#include "nvme_util.h"

#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define DEV_PATH "/dev/p2pdirect"
#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define PAGE 4096ull
#define BLK 512ull

/* Namespace bytes the fuzzer may write (and read): NSID 1 and NSID 4. */
#define SAFE_LO (200 * MiB)
#define SAFE_HI (256 * MiB)
#define IO_CAP MiB		/* largest READ/WRITE meant to move data */
#define ALLOC_CAP (16 * MiB)	/* largest ALLOC meant to succeed */
#define SCRATCH_SPAN (32 * MiB)	/* usual offsets in the scratch files */

#define MAX_THREADS 16
#define RACE_FD 800		/* the shared fd the racer replaces (never a lowest free number) */
#define CLOSED_FD 900		/* was open once, closed before the threads start */
#define MAX_PROV 16
#define MAX_ALLOCS 24
#define MAX_REGIONS 48
#define MAX_REGS 24
#define MAX_GONE 8
#define MAX_KIDS 2
#define MAX_SHARED 64
#define MAX_MSGS 40
#define GRACE_S 30		/* the watchdog's allowance over --seconds */

/* Per-thread memory zone: guard, scribble, guard, read-only page, guard, arg page, guard, RAM. */
#define Z_SCRIBBLE PAGE
#define SCRIBBLE_LEN MiB
#define Z_GUARD1 (Z_SCRIBBLE + SCRIBBLE_LEN)
#define Z_RO (Z_GUARD1 + PAGE)
#define Z_GUARD2 (Z_RO + PAGE)
#define Z_ARG (Z_GUARD2 + PAGE)
#define Z_GUARD3 (Z_ARG + PAGE)
#define Z_RAM (Z_GUARD3 + PAGE)
#define RAM_LEN MiB
#define ZONE_LEN (Z_RAM + RAM_LEN + PAGE)

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* --- what is counted ---------------------------------------------------------- */

enum op {
	OP_VERSION, OP_LIST, OP_ALLOC, OP_FREE, OP_PROBE, OP_REGISTER, OP_DEREGISTER,
	OP_REG_QUERY, OP_READ, OP_WRITE, OP_STATS, OP_EXPORT, OP_UNKNOWN, OP_WRONG, OP_URING,
	OP_MMAP, OP_MUNMAP, OP_MADVISE, OP_MPROTECT, OP_MREMAP,
	NR_OPS
};

#define FIRST_MM_OP OP_MMAP

static const char *const op_name[NR_OPS] = {
	"GET_VERSION", "LIST_PROVIDERS", "ALLOC", "FREE", "DMA_PROBE", "REGISTER",
	"DEREGISTER", "REG_QUERY", "READ", "WRITE", "STATS", "EXPORT_DMABUF", "unknown-command",
	"wrong-size-or-direction", "io_uring READ/WRITE", "mmap", "munmap", "madvise", "mprotect", "mremap",
};

/* Failure kinds, one TAP line each. */
enum fail_kind { F_ERRNO, F_MM_ERRNO, F_ORACLE, F_CPU, F_KIDS, NR_F };

#define NR_SLOTS 136		/* 0: success, 1..133: errno, 134: other errno, 135: bad return */
#define SLOT_OTHER 134
#define SLOT_BADRET 135

enum { CPU_OK, CPU_SIGBUS, CPU_SIGSEGV, NR_CPU };

/* Shared with the fork children (MAP_SHARED): counters, the stop flag, progress. */
struct shared {
	int stop;
	int reporting;		/* 1: main reports, 2: the watchdog does */
	int phase;		/* what the main thread is doing: enum phase */
	int msgs;
	__u64 calls[NR_OPS];
	__u64 res[NR_OPS][NR_SLOTS];
	__u64 fails[NR_F];
	__u64 cpu[NR_CPU];
	__u64 kids_started, kids_exited, kids_killed, kids_bad;
	__u64 ops;
	struct {
		int op;
		__u64 since;
	} cur[MAX_THREADS + 1];
};

static struct shared *sh;

enum phase { PH_FUZZ, PH_JOIN, PH_CLOSE, PH_USED, PH_RESTORE, NR_PH };

static const char *const phase_name[NR_PH] = {
	"waiting for the deadline", "joining the threads (which unmap and close their files)",
	"closing the shared files", "checking that no memory is in use",
	"restoring the GPUs' memory",
};

/* sh->cur[].op beyond the operations: */
#define CUR_CLEANUP -2		/* unmapping, reaping children, closing its file */
#define CUR_DONE -1

static const int allowed_errno[] = {
	EINVAL, EFAULT, ENOTTY, EBADF, ENOENT, ENOMEM, ENOSPC, ENODEV, ENXIO, EPERM, EACCES,
	EBUSY, EREMOTEIO, EOPNOTSUPP, ESTALE, ERANGE, EDQUOT, EISDIR, ESPIPE, EOVERFLOW,
	ENOTBLK, ETXTBSY, EIO, EAGAIN, EINTR, E2BIG, EFBIG, EROFS, EXDEV, EEXIST, EMFILE,
	ETOOMANYREFS,
};

static const struct {
	int e;
	const char *name;
} errno_names[] = {
	{ EPERM, "EPERM" }, { ENOENT, "ENOENT" }, { EINTR, "EINTR" }, { EIO, "EIO" },
	{ ENXIO, "ENXIO" }, { E2BIG, "E2BIG" }, { EBADF, "EBADF" }, { EAGAIN, "EAGAIN" },
	{ ENOMEM, "ENOMEM" }, { EACCES, "EACCES" }, { EFAULT, "EFAULT" },
	{ ENOTBLK, "ENOTBLK" }, { EBUSY, "EBUSY" }, { EEXIST, "EEXIST" }, { EXDEV, "EXDEV" },
	{ EMFILE, "EMFILE" },
	{ ENODEV, "ENODEV" }, { EISDIR, "EISDIR" }, { EINVAL, "EINVAL" },
	{ ENOTTY, "ENOTTY" }, { ETXTBSY, "ETXTBSY" }, { EFBIG, "EFBIG" },
	{ ENOSPC, "ENOSPC" }, { ESPIPE, "ESPIPE" }, { EROFS, "EROFS" }, { ERANGE, "ERANGE" },
	{ EOVERFLOW, "EOVERFLOW" }, { EOPNOTSUPP, "EOPNOTSUPP" }, { ESTALE, "ESTALE" },
	{ EDQUOT, "EDQUOT" }, { EREMOTEIO, "EREMOTEIO" }, { ECANCELED, "ECANCELED" },
	{ ETOOMANYREFS, "ETOOMANYREFS" },
};

static const char *errname(int e, char *buf, size_t len)
{
	for (size_t i = 0; i < ARRAY_SIZE(errno_names); i++)
		if (errno_names[i].e == e)
			return errno_names[i].name;
	snprintf(buf, len, "errno %d", e);
	return buf;
}

static const char *signame(int sig)
{
	return sig == 0 ? "no fault" : sig == SIGBUS ? "SIGBUS" : sig == SIGSEGV ? "SIGSEGV" :
	       "another signal";
}

static bool errno_allowed(int e)
{
	for (size_t i = 0; i < ARRAY_SIZE(allowed_errno); i++)
		if (allowed_errno[i] == e)
			return true;
	return false;
}

/* --- options, time, output ---------------------------------------------------- */

static __u64 opt_seed;
static int opt_seconds = 60, opt_threads = 4, opt_trace;
static __u64 t_start, t_deadline;

static __u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (__u64)ts.tv_sec * 1000000000ull + (__u64)ts.tv_nsec;
}

static void sleep_ns(__u64 ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000ull, .tv_nsec = ns % 1000000000ull };

	nanosleep(&ts, NULL);
}

/*
 * One line to stdout in one write(): no stdio buffer that threads or fork
 * children could share or duplicate.
 */
static void say(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(1, buf, n) < 0)
		return;
}

static void klog(const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	int fd, n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || n < 0)
		return;
	if (write(fd, buf, n) < 0)
		n = 0;
	close(fd);
}

/* --- the PRNG ----------------------------------------------------------------- */

static __u64 splitmix(__u64 *s)
{
	__u64 z = (*s += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* --- per-thread state ------------------------------------------------------------ */

enum dev_slot { DS_PRIV, DS_SHARED, DS_RACE, DS_NEW, DS_RDONLY, DS_OTHER, NR_DS };

struct dalloc {			/* an allocation this thread made */
	bool used;
	int slot;		/* enum dev_slot of the file it was made on */
	int gen;		/* DS_PRIV: generation of the thread's private file */
	bool reliable;		/* only this thread can have freed it: oracles apply */
	bool freed;		/* FREE succeeded: its mappings are certainly zapped */
	bool gone;		/* no longer FREE-able through its file slot */
	__u64 handle, size, mmap_offset;
	__u64 born;		/* the thread's operation count at ALLOC */
};

struct region {			/* a device mapping this thread owns */
	bool used;
	__u8 *addr;
	__u64 len;
	int alloc;		/* index in allocs, or -1: unknown what it maps */
	int prot;
	int shared_ix;		/* entry in the shared table, or -1 */
	unsigned int hist;	/* H_* of what was done to it, for failure messages */
};

enum { H_DONTNEED = 1, H_MADV = 2, H_SPLIT = 4, H_SHRUNK = 8, H_MPROTECT = 16, H_MOVED = 32 };

struct reg {
	bool used;
	int slot, gen;
	__u64 id, size;
};

struct worker {
	int id;			/* 0..T-1; T: the racer */
	bool child;		/* a fork child: no shared table, no forks */
	__u64 rng;
	pthread_t thread;
	int priv;		/* this thread's own /dev/p2pdirect fd */
	int gen;
	__u8 *zone;
	struct dalloc allocs[MAX_ALLOCS];
	struct region regions[MAX_REGIONS];
	struct reg regs[MAX_REGS];
	__u64 gone[MAX_GONE];	/* addresses of device mappings it unmapped */
	int ngone;
	pid_t kids[MAX_KIDS];
	bool kid_kill[MAX_KIDS];
	__u64 kid_born[MAX_KIDS], next_fork;
	__u64 nops;		/* operations so far */
	int last_pl;		/* where issue() put the last argument */
	struct region *last_region;	/* the mapping it went into, if one */
	struct io_uring ring;	/* its io_uring, set up at the first command (ring_kind) */
	int ring_kind;
	unsigned int inflight;	/* io_uring commands submitted, CQE not reaped */
	struct uq {		/* each command in flight, by user_data */
		bool used, write, bad;
		int fk, pk;
		__u64 avail;
		__u64 nops;	/* the thread's operations when it was submitted */
		struct p2pdirect_io io;
	} uq[8];
};

static __u64 rnd(struct worker *w, __u64 n)
{
	return n ? splitmix(&w->rng) % n : 0;
}

static __u64 rnd64(struct worker *w)
{
	return splitmix(&w->rng);
}

static bool chance(struct worker *w, int percent)
{
	return (int)rnd(w, 100) < percent;
}

/* --- the environment: providers, fds of every kind, shared mappings ----------- */

static struct p2pdirect_provider_info prov[MAX_PROV];
static __u32 nprov;
static __u32 abi_minor;		/* of the running module: stricter rules since 6 */
static int shared_dev;		/* one /dev/p2pdirect file all threads use */
static int second_dev;		/* another open of /dev/p2pdirect, used as a wrong fd */

enum fd_kind {
	FK_NS1_RW, FK_NS4_RW, FK_NS1_RO, FK_NS1_WO, FK_NS4_RO, FK_NS1_BUF,
	FK_NS2_RO, FK_NS3_RO,
	FK_EXT4_RW, FK_XFS_RW, FK_EXT4_RO, FK_XFS_RO, FK_EXT4_WO, FK_XFS_APPEND, FK_EXT4_BUF,
	FK_TMPFS, FK_PROC, FK_DEVNULL, FK_PIPE_R, FK_PIPE_W, FK_SOCK, FK_DIR, FK_MEMFD,
	FK_EPOLL, FK_EVENTFD, FK_DEV_SHARED, FK_DEV_SECOND, FK_DEV_RDONLY, FK_DEV_RACE, FK_CLOSED,
	FK_BAD,
	NR_FK
};

static int zoo[NR_FK];
static char scratch_path[2][64];
static __u64 ns_size[2];	/* NSID 1, NSID 4 */

static bool fk_is_ns(int fk)
{
	return fk <= FK_NS3_RO;
}

static bool fk_is_scratch(int fk)
{
	return fk >= FK_EXT4_RW && fk <= FK_EXT4_BUF;
}

/* READ/WRITE on this fd must fail, whatever else the arguments say. */
static bool fk_io_must_fail(int fk, bool write)
{
	switch (fk) {
	case FK_NS1_RW: case FK_NS4_RW: case FK_EXT4_RW: case FK_XFS_RW:
		return false;
	case FK_NS1_RO: case FK_NS4_RO: case FK_EXT4_RO: case FK_XFS_RO:
		return write;
	case FK_NS1_WO: case FK_EXT4_WO: case FK_XFS_APPEND:
		return !write;
	default:
		return true;
	}
}

/* Mappings every thread may use as device pointers (never unmapped before the end). */
static __u8 *cmb_map;		/* NVMe CMB through sysfs p2pmem/allocate: P2PDMA pages */
static __u8 *tmpfs_map;		/* page cache */
static __u8 *pfn_map;		/* a GPU BAR through sysfs resourceN: VM_PFNMAP */
#define SHARED_MAP_LEN MiB

/* Allocations on the shared fd, mapped by their owner, that others may name. */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	bool used;
	__u64 handle, addr, len;
} shared_tab[MAX_SHARED];

/* --- faults ------------------------------------------------------------------------ */

static __thread sigjmp_buf *fault_jmp;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *jb = fault_jmp;

	(void)si;
	(void)uc;
	if (jb) {
		fault_jmp = NULL;
		siglongjmp(*jb, sig);
	}
	/* Not in a guarded access: a real crash. */
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Copies @len bytes, catching SIGBUS/SIGSEGV. Returns 0 or the signal. */
static int guarded_copy(void *dst, const void *src, size_t len)
{
	sigjmp_buf jb;
	int sig;

	sig = sigsetjmp(jb, 1);
	if (sig)
		return sig;
	fault_jmp = &jb;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	memcpy(dst, src, len);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	fault_jmp = NULL;
	return 0;
}

static __u64 sink;	/* reads must not be optimised away */

/* Reads or writes @len bytes at @p, catching faults. Returns 0 or the signal. */
static int guarded_touch(__u8 *p, size_t len, bool write, __u8 val)
{
	sigjmp_buf jb;
	int sig;

	sig = sigsetjmp(jb, 1);
	if (sig)
		return sig;
	fault_jmp = &jb;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	for (size_t i = 0; i < len; i++) {
		if (write)
			__atomic_store_n(&p[i], val, __ATOMIC_RELAXED);
		else
			__atomic_fetch_add(&sink, __atomic_load_n(&p[i], __ATOMIC_RELAXED),
					   __ATOMIC_RELAXED);
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	fault_jmp = NULL;
	return 0;
}

/* --- recording results ----------------------------------------------------------- */

static void add(__u64 *p, __u64 n)
{
	__atomic_fetch_add(p, n, __ATOMIC_RELAXED);
}

static void fail(struct worker *w, int kind, const char *fmt, ...)
{
	char buf[400];
	va_list ap;

	add(&sh->fails[kind], 1);
	if (__atomic_fetch_add(&sh->msgs, 1, __ATOMIC_RELAXED) >= MAX_MSGS)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	say("# FAIL (%s %d, seed %llu): %s", w->child ? "child of thread" : "thread", w->id,
	    (unsigned long long)opt_seed, buf);
}

/* Counts one call and checks its result: 0 or -1 with an allowed errno. */
static void note(struct worker *w, int op, int fd, long ret, int err)
{
	int slot;
	char eb[24];

	add(&sh->calls[op], 1);
	if (ret == 0)
		slot = 0;
	else if (ret != -1)
		slot = SLOT_BADRET;
	else if (err > 0 && err < SLOT_OTHER)
		slot = err;
	else
		slot = SLOT_OTHER;
	add(&sh->res[op][slot], 1);
	if (ret != 0 && ret != -1)
		fail(w, op >= FIRST_MM_OP ? F_MM_ERRNO : F_ERRNO, "%s on fd %d returned %ld",
		     op_name[op], fd, ret);
	/* io_uring cancels the rest of a failed link chain, and a worker's command at ring exit. */
	else if (ret == -1 && !errno_allowed(err) && !(op == OP_URING && err == ECANCELED))
		fail(w, op >= FIRST_MM_OP ? F_MM_ERRNO : F_ERRNO,
		     "%s on fd %d failed with %s, not an allowed errno", op_name[op], fd,
		     errname(err, eb, sizeof(eb)));
	if (opt_trace)
		say("# t%d%s %s fd %d -> %ld %s", w->id, w->child ? "c" : "", op_name[op], fd, ret,
		    ret ? errname(err, eb, sizeof(eb)) : "");
}

/* An oracle: @bad means the call did what the ABI says it must not. */
static void expect(struct worker *w, bool bad, const char *fmt, ...)
{
	char buf[300];
	va_list ap;

	if (!bad)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fail(w, F_ORACLE, "%s", buf);
}

/* --- device fds ------------------------------------------------------------------- */

static const __u64 kernel_ptrs[] = {
	0xffff888000000000ull, 0xffffffff81000000ull, 0xffffffffff600000ull,
	0xffffc90000000000ull, 0xfffffffffffff000ull,
};

static const __u64 noncanon_ptrs[] = {
	0x0000800000000000ull, 0x8000000000000000ull, 0xdead000000000100ull,
	0x00007ffffffff000ull, 0x10ull,
};

static int fd_of_kind(struct worker *w, int fk)
{
	static const int bad[] = { -1, 4096, INT_MAX, 1000000, -2 };

	if (fk == FK_BAD)
		return bad[rnd(w, ARRAY_SIZE(bad))];
	if (fk == FK_DEV_RACE)
		return RACE_FD;
	return zoo[fk];
}

/* A /dev/p2pdirect fd (or, now and then, something else) for an ioctl. */
static int pick_dev(struct worker *w, int *slot)
{
	int r = rnd(w, 100);

	if (r < 50) {
		*slot = DS_PRIV;
		return w->priv;
	}
	if (r < 70) {
		*slot = DS_SHARED;
		return shared_dev;
	}
	if (r < 85) {
		*slot = DS_RACE;
		return RACE_FD;
	}
	if (r < 91) {
		*slot = DS_NEW;
		return open(DEV_PATH, O_RDWR | O_CLOEXEC);
	}
	if (r < 94) {
		*slot = DS_RDONLY;
		return zoo[FK_DEV_RDONLY];
	}
	*slot = DS_OTHER;
	return fd_of_kind(w, FK_NS1_RW + rnd(w, NR_FK));
}

static void put_dev(int fd, int slot)
{
	if (slot == DS_NEW && fd >= 0)
		close(fd);
}

/* --- the argument's placement -------------------------------------------------------- */

enum place {
	PL_OK, PL_NULL, PL_KERNEL, PL_NONCANON, PL_PROTNONE, PL_RO, PL_STRADDLE, PL_DEVMEM,
	PL_ZAPPED, NR_PL
};

static struct region *pick_region(struct worker *w, __u64 min_len, bool want_zapped);

static bool region_zapped(struct worker *w, struct region *r)
{
	return r->alloc >= 0 && w->allocs[r->alloc].freed;
}

/*
 * ioctl(@fd, @cmd, @arg) with the @len bytes of the argument placed somewhere
 * random: mostly where it is, else NULL, kernel, non-canonical, PROT_NONE,
 * read-only, straddling into a guard page, in device memory, in a freed
 * device mapping. Returns true if @arg holds what the kernel wrote back.
 * With @exact the kernel reads exactly @arg (never a copy in device memory,
 * where another thread's stale pointer may be DMAing), so that the caller
 * knows which object it acted on. What comes back through device memory is
 * exercised but not trusted.
 */
static bool issue(struct worker *w, int op, int fd, unsigned long cmd, void *arg, size_t len,
		  bool exact, long *ret, int *err)
{
	int pl = chance(w, 85) ? PL_OK : 1 + rnd(w, NR_PL - 1);
	struct region *r;
	__u8 *p = arg;
	bool back = false;
	__u64 off;

	w->last_region = NULL;
	switch (pl) {
	case PL_NULL:
		p = NULL;
		break;
	case PL_KERNEL:
		p = (__u8 *)(uintptr_t)kernel_ptrs[rnd(w, ARRAY_SIZE(kernel_ptrs))];
		break;
	case PL_NONCANON:
		p = (__u8 *)(uintptr_t)noncanon_ptrs[rnd(w, ARRAY_SIZE(noncanon_ptrs))];
		break;
	case PL_PROTNONE:
		p = w->zone + Z_GUARD2;
		break;
	case PL_RO:
		off = rnd(w, (PAGE - len) / 8) * 8;
		mprotect(w->zone + Z_RO, PAGE, PROT_READ | PROT_WRITE);
		memcpy(w->zone + Z_RO + off, arg, len);
		mprotect(w->zone + Z_RO, PAGE, PROT_READ);
		p = w->zone + Z_RO + off;
		break;
	case PL_STRADDLE:
		off = 1 + rnd(w, len - 1);	/* bytes readable before the guard */
		p = w->zone + Z_GUARD3 - off;
		memcpy(p, arg, off);
		break;
	case PL_DEVMEM:
	case PL_ZAPPED:
		if (exact) {
			pl = PL_OK;
			break;
		}
		r = pick_region(w, len, pl == PL_ZAPPED);
		if (!r) {
			p = w->zone + Z_GUARD1;
			break;
		}
		off = rnd(w, (r->len - len) / 8 + 1) * 8;
		p = r->addr + off;
		w->last_region = r;
		back = pl == PL_DEVMEM && !guarded_copy(p, arg, len);
		break;
	}
	*ret = ioctl(fd, cmd, p);
	*err = *ret ? errno : 0;
	note(w, op, fd, *ret, *err);
	w->last_pl = pl;
	/* Since ABI 1.6 the argument is read and written back before anything happens. */
	expect(w, abi_minor >= 6 && *ret == 0 && pl != PL_OK && pl != PL_DEVMEM,
	       "%s succeeded with its argument at %p (placement %d%s), not read-write memory",
	       op_name[op], p, pl, pl == PL_ZAPPED && w->last_region ?
	       ", a mapping of an allocation the thread freed" : "");
	/* Since ABI 1.6 a read-only open may only read (GET_VERSION, LIST_PROVIDERS, STATS). */
	expect(w, abi_minor >= 6 && *ret == 0 && fd == zoo[FK_DEV_RDONLY] && op != OP_VERSION &&
	       op != OP_LIST && op != OP_STATS,
	       "%s succeeded on /dev/p2pdirect opened O_RDONLY", op_name[op]);
	if (back)
		guarded_copy(w->zone + Z_SCRIBBLE, p, len);
	return pl == PL_OK;
}

/* --- allocations, regions, registrations -------------------------------------------- */

static int new_alloc(struct worker *w)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!w->allocs[i].used)
			return i;
	return -1;
}

static struct dalloc *pick_alloc(struct worker *w, int slot)
{
	int start = rnd(w, MAX_ALLOCS);

	for (int k = 0; k < MAX_ALLOCS; k++) {
		struct dalloc *a = &w->allocs[(start + k) % MAX_ALLOCS];

		if (a->used && !a->gone && a->slot == slot && (slot != DS_PRIV || a->gen == w->gen))
			return a;
	}
	return NULL;
}

static struct region *pick_region(struct worker *w, __u64 min_len, bool want_zapped)
{
	int start = rnd(w, MAX_REGIONS);

	for (int k = 0; k < MAX_REGIONS; k++) {
		struct region *r = &w->regions[(start + k) % MAX_REGIONS];

		if (!r->used || r->len < min_len)
			continue;
		if (want_zapped && !region_zapped(w, r))
			continue;
		if (!want_zapped && (region_zapped(w, r) ||
				     (r->prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE)))
			continue;
		return r;
	}
	return NULL;
}

static struct region *any_region(struct worker *w)
{
	int start = rnd(w, MAX_REGIONS);

	for (int k = 0; k < MAX_REGIONS; k++) {
		struct region *r = &w->regions[(start + k) % MAX_REGIONS];

		if (r->used)
			return r;
	}
	return NULL;
}

static struct region *new_region(struct worker *w)
{
	for (int i = 0; i < MAX_REGIONS; i++)
		if (!w->regions[i].used)
			return &w->regions[i];
	return NULL;
}

static void shared_drop(struct worker *w, struct region *r)
{
	if (r->shared_ix < 0 || w->child)
		return;
	pthread_mutex_lock(&shared_lock);
	shared_tab[r->shared_ix].used = false;
	pthread_mutex_unlock(&shared_lock);
	r->shared_ix = -1;
}

static void shared_add(struct worker *w, struct region *r, __u64 handle)
{
	if (w->child)
		return;
	pthread_mutex_lock(&shared_lock);
	for (int i = 0; i < MAX_SHARED; i++) {
		if (shared_tab[i].used)
			continue;
		shared_tab[i].used = true;
		shared_tab[i].handle = handle;
		shared_tab[i].addr = (uintptr_t)r->addr;
		shared_tab[i].len = r->len;
		r->shared_ix = i;
		break;
	}
	pthread_mutex_unlock(&shared_lock);
}

/* Forgets an allocation once no region maps it and it can no longer be freed. */
static void alloc_maybe_forget(struct worker *w, int ix)
{
	struct dalloc *a = &w->allocs[ix];

	if (!a->used)
		return;
	for (int i = 0; i < MAX_REGIONS; i++)
		if (w->regions[i].used && w->regions[i].alloc == ix)
			return;
	if (a->freed || a->gone || a->slot == DS_NEW || (a->slot == DS_PRIV && a->gen != w->gen))
		a->used = false;
}

static void remember_gone(struct worker *w, __u8 *addr)
{
	w->gone[w->ngone++ % MAX_GONE] = (uintptr_t)addr;
}

static void region_unmap_all(struct worker *w, struct region *r)
{
	int ix = r->alloc;

	shared_drop(w, r);
	munmap(r->addr, r->len);
	remember_gone(w, r->addr);
	r->used = false;
	if (ix >= 0)
		alloc_maybe_forget(w, ix);
}

/* --- picking values ------------------------------------------------------------------- */

enum ptr_kind {
	PK_DEV, PK_ZAPPED, PK_SHARED, PK_CMB, PK_RAM, PK_FILEMAP, PK_PFN, PK_RO, PK_NONE,
	PK_NULL, PK_KERNEL, PK_GONE, PK_RANDOM, NR_PK
};

/* Kinds of pointer no peer-memory client may claim: RAM, or not mapped at all. */
static bool pk_never_device(int pk)
{
	return pk == PK_RAM || pk == PK_FILEMAP || pk == PK_RO || pk == PK_NONE ||
	       pk == PK_NULL || pk == PK_KERNEL;
}

/* A "device pointer", and how many bytes from it belong to what it points into. */
static __u64 pick_dev_ptr(struct worker *w, __u64 *avail, int *pk)
{
	static const int weights[NR_PK] = { 46, 5, 8, 7, 8, 3, 3, 3, 3, 3, 3, 4, 4 };
	int r = rnd(w, 100), k = 0;
	struct region *reg;
	__u64 off, base = 0, len = 0;

	while (k < NR_PK - 1 && r >= weights[k])
		r -= weights[k++];
	*pk = k;
	switch (k) {
	case PK_DEV:
	case PK_ZAPPED:
		reg = pick_region(w, 1, k == PK_ZAPPED);
		if (!reg && k == PK_DEV)
			reg = any_region(w);
		if (!reg)
			break;
		base = (uintptr_t)reg->addr;
		len = reg->len;
		break;
	case PK_SHARED: {
		int i = rnd(w, MAX_SHARED);

		if (w->child)
			break;
		pthread_mutex_lock(&shared_lock);
		if (shared_tab[i].used) {
			base = shared_tab[i].addr;
			len = shared_tab[i].len;
		}
		pthread_mutex_unlock(&shared_lock);
		break;
	}
	case PK_CMB:
		base = (uintptr_t)cmb_map;
		len = cmb_map ? SHARED_MAP_LEN : 0;
		break;
	case PK_RAM:
		base = (uintptr_t)(w->zone + Z_RAM);
		len = RAM_LEN;
		break;
	case PK_FILEMAP:
		base = (uintptr_t)tmpfs_map;
		len = tmpfs_map ? SHARED_MAP_LEN : 0;
		break;
	case PK_PFN:
		base = (uintptr_t)pfn_map;
		len = pfn_map ? SHARED_MAP_LEN : 0;
		break;
	case PK_RO:
		base = (uintptr_t)(w->zone + Z_RO);
		len = PAGE;
		break;
	case PK_NONE:
		base = (uintptr_t)(w->zone + Z_GUARD1);
		len = PAGE;
		break;
	case PK_NULL:
		*avail = MiB;
		return chance(w, 50) ? 0 : PAGE;
	case PK_KERNEL:
		*avail = MiB;
		return kernel_ptrs[rnd(w, ARRAY_SIZE(kernel_ptrs))];
	case PK_GONE:
		*avail = 64 * KiB;
		return w->gone[rnd(w, MAX_GONE)];
	case PK_RANDOM:
		*avail = rnd(w, 16 * MiB);
		return rnd64(w);
	}
	if (!base) {
		/* Nothing of that kind at hand: RAM, which no client claims. */
		*pk = PK_RAM;
		base = (uintptr_t)(w->zone + Z_RAM);
		len = RAM_LEN;
	}
	off = chance(w, 60) ? 0 : rnd(w, len / BLK) * BLK;
	if (chance(w, 5))
		off += 1 + rnd(w, BLK - 1);	/* unaligned */
	if (off >= len)
		off = 0;
	*avail = len - off;
	return base + off;
}

/* A length for a range of @avail bytes: mostly fitting, block-aligned, at most @cap. */
static __u64 pick_len(struct worker *w, __u64 avail, __u64 cap, __u64 addr)
{
	__u64 max = avail < cap ? avail : cap;
	int r = rnd(w, 100);

	if (max < BLK)
		max = BLK;
	if (r < 70)
		return (1 + rnd(w, max / BLK)) * BLK;
	if (r < 78)
		return max / BLK * BLK;
	if (r < 83)
		return avail + BLK * (1 + rnd(w, 8));	/* past the end */
	if (r < 87)
		return 0;
	if (r < 91)
		return rnd(w, 4) * BLK + 1 + rnd(w, BLK - 1);
	switch (rnd(w, 7)) {
	case 0: return ~0ull;
	case 1: return ~0ull & ~(BLK - 1);
	case 2: return 1ull << 63;
	case 3: return 1ull << 32;
	case 4: return 1ull << 40;
	case 5: return (0 - addr) & ~(BLK - 1);		/* to the top of the address space */
	default: return (0 - addr) + BLK;		/* wraps */
	}
}

static __u64 pick_flags(struct worker *w, __u64 valid)
{
	int r = rnd(w, 100);

	if (r < 45)
		return 0;
	if (r < 85)
		return valid & rnd64(w);
	if (r < 95)
		return 1ull << rnd(w, 32);
	return rnd64(w) & 0xffffffff;
}

static __u32 pick_pad(struct worker *w)
{
	return chance(w, 92) ? 0 : (chance(w, 50) ? 1 : (__u32)rnd64(w) | 1);
}

/* A provider index: mostly real. */
static __u32 pick_provider(struct worker *w)
{
	int r = rnd(w, 100);

	if (r < 88 && nprov)
		return prov[rnd(w, nprov)].index;
	if (r < 94)
		return nprov + rnd(w, 4);
	return chance(w, 50) ? ~0u : (__u32)rnd64(w);
}

/*
 * An output array for @elem-byte entries: the pointer and a capacity. Where
 * the kernel writes is always memory the fuzzer can lose: its scribble buffer
 * (followed by a guard page), device memory (the capacity fits), or memory
 * the kernel cannot write at all.
 */
static void pick_out(struct worker *w, size_t elem, __u64 *ptr, __u32 *cap)
{
	static const __u32 caps[] = { 0, 1, 2, 3, 8, 16, 64, 4096, 0x7fffffff, 0xffffffff };
	struct region *r;
	__u64 off;

	*cap = caps[rnd(w, ARRAY_SIZE(caps))];
	switch (rnd(w, 12)) {
	case 0: case 1: case 2: case 3: case 4: case 5:
		*ptr = (uintptr_t)(w->zone + Z_SCRIBBLE + rnd(w, SCRIBBLE_LEN / 2 / 8) * 8);
		break;
	case 6:
		*ptr = chance(w, 50) ? 0 : kernel_ptrs[rnd(w, ARRAY_SIZE(kernel_ptrs))];
		break;
	case 7:
		*ptr = (uintptr_t)(w->zone + (chance(w, 50) ? Z_RO : Z_GUARD1));
		break;
	case 8:
		/* The first entries fit, the rest runs into the guard page. */
		*ptr = (uintptr_t)(w->zone + Z_GUARD1 - elem * (1 + rnd(w, 3)) - rnd(w, elem));
		break;
	case 9:
		*ptr = noncanon_ptrs[rnd(w, ARRAY_SIZE(noncanon_ptrs))];
		break;
	default:
		r = pick_region(w, elem, chance(w, 20));
		if (!r) {
			*ptr = (uintptr_t)(w->zone + Z_SCRIBBLE);
			break;
		}
		off = rnd(w, (r->len - elem) / 8 + 1) * 8;
		*ptr = (uintptr_t)(r->addr + off);
		if (*cap > (r->len - off) / elem)
			*cap = (r->len - off) / elem;
		break;
	}
}

/* --- the operations -------------------------------------------------------------------- */

static void op_version(struct worker *w)
{
	struct p2pdirect_version v;
	int slot, fd = pick_dev(w, &slot), err;
	long ret;

	memset(&v, chance(w, 50) ? 0 : 0xa5, sizeof(v));
	if (issue(w, OP_VERSION, fd, P2PDIRECT_IOC_GET_VERSION, &v, sizeof(v), false, &ret, &err) &&
	    ret == 0) {
		expect(w, v.abi_major != P2PDIRECT_ABI_MAJOR, "GET_VERSION: ABI major %u",
		       v.abi_major);
		expect(w, strnlen(v.module_version, sizeof(v.module_version)) ==
		       sizeof(v.module_version), "GET_VERSION: module version not NUL-terminated");
	}
	put_dev(fd, slot);
}

static void op_list(struct worker *w)
{
	struct p2pdirect_list_providers l;
	int slot, fd = pick_dev(w, &slot), err;
	long ret;

	memset(&l, 0, sizeof(l));
	pick_out(w, sizeof(struct p2pdirect_provider_info), &l.entries, &l.capacity);
	l.count = (__u32)rnd64(w);
	if (issue(w, OP_LIST, fd, P2PDIRECT_IOC_LIST_PROVIDERS, &l, sizeof(l), false, &ret, &err) &&
	    ret == 0 && slot != DS_OTHER)
		expect(w, l.count != nprov, "LIST_PROVIDERS: count %u, %u at the start", l.count,
		       nprov);
	put_dev(fd, slot);
}

static struct region *map_alloc(struct worker *w, int fd, int ix, bool shared);

static __u64 pick_alloc_size(struct worker *w)
{
	int r = rnd(w, 100);

	if (r < 60)
		return (1 + rnd(w, 64)) * PAGE;
	if (r < 75)
		return (1 + rnd(w, 512)) * PAGE;
	if (r < 80)
		return (1 + rnd(w, ALLOC_CAP / PAGE)) * PAGE;
	if (r < 86)
		return 1 + rnd(w, 64 * KiB);	/* not page-aligned: rounded up */
	if (r < 89)
		return 0;
	if (r < 93 && nprov)
		return prov[rnd(w, nprov)].bytes_total + PAGE * rnd(w, 2);
	switch (rnd(w, 5)) {
	case 0: return ~0ull;
	case 1: return 1ull << 63;
	case 2: return 1ull << 32;
	case 3: return ~0ull - PAGE + 2;
	default: return rnd64(w);
	}
}

static __u64 pick_alignment(struct worker *w)
{
	int r = rnd(w, 100);

	if (r < 60)
		return 0;
	if (r < 85)
		return 1ull << rnd(w, 25);	/* powers of two up to 16 MiB */
	if (r < 92)
		return 3 * (1ull << rnd(w, 20));
	switch (rnd(w, 3)) {
	case 0: return 1ull << 63;
	case 1: return ~0ull;
	default: return rnd64(w);
	}
}

static bool pow2(__u64 x)
{
	return x && !(x & (x - 1));
}

static void op_alloc(struct worker *w)
{
	struct p2pdirect_alloc a;
	int slot, fd = pick_dev(w, &slot), err, ix;
	__u64 want;
	long ret;

	memset(&a, 0, sizeof(a));
	a.provider = pick_provider(w);
	a.flags = pick_flags(w, 0);
	a.size = want = pick_alloc_size(w);
	a.alignment = pick_alignment(w);
	if (chance(w, 30)) {
		a.handle = rnd64(w);
		a.mmap_offset = rnd64(w);
		a.bus_addr = rnd64(w);
	}
	if (!issue(w, OP_ALLOC, fd, P2PDIRECT_IOC_ALLOC, &a, sizeof(a), true, &ret, &err) || ret ||
	    slot == DS_OTHER) {
		put_dev(fd, slot);
		return;
	}
	expect(w, a.flags != 0, "ALLOC succeeded with flags %#x", a.flags);
	expect(w, want == 0, "ALLOC succeeded with size 0");
	expect(w, a.alignment && !pow2(a.alignment),
	       "ALLOC succeeded with alignment %#llx, not a power of two",
	       (unsigned long long)a.alignment);
	expect(w, a.size < want || a.size % PAGE || a.size - want >= PAGE,
	       "ALLOC: size %#llx for %#llx asked", (unsigned long long)a.size,
	       (unsigned long long)want);
	expect(w, a.mmap_offset % PAGE, "ALLOC: mmap offset %#llx not page-aligned",
	       (unsigned long long)a.mmap_offset);
	expect(w, a.alignment >= PAGE && pow2(a.alignment) && a.provider_offset % a.alignment,
	       "ALLOC: offset %#llx in the provider, alignment %#llx asked",
	       (unsigned long long)a.provider_offset, (unsigned long long)a.alignment);
	ix = new_alloc(w);
	if (ix < 0) {
		struct p2pdirect_free f = { .handle = a.handle };

		/* No room to track it: give it back (or leave it to the close). */
		ret = ioctl(fd, P2PDIRECT_IOC_FREE, &f);
		note(w, OP_FREE, fd, ret, ret ? errno : 0);
		put_dev(fd, slot);
		return;
	}
	w->allocs[ix] = (struct dalloc){
		.used = true, .slot = slot, .gen = w->gen, .reliable = slot == DS_PRIV,
		.handle = a.handle, .size = a.size, .mmap_offset = a.mmap_offset,
		.born = w->nops,
	};
	if (chance(w, 75) || slot == DS_NEW) {
		struct region *r = map_alloc(w, fd, ix, slot == DS_SHARED);

		if (r)
			guarded_touch(r->addr + rnd(w, r->len), 1, true, (__u8)rnd64(w));
	}
	put_dev(fd, slot);
	alloc_maybe_forget(w, ix);
}

/* Maps allocation @ix whole, read-write, shared: the normal way. */
static struct region *map_alloc(struct worker *w, int fd, int ix, bool shared)
{
	struct dalloc *a = &w->allocs[ix];
	struct region *r = new_region(w);
	void *m;

	if (!r)
		return NULL;
	m = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, a->mmap_offset);
	note(w, OP_MMAP, fd, m == MAP_FAILED ? -1 : 0, m == MAP_FAILED ? errno : 0);
	if (m == MAP_FAILED) {
		/* The racer may have replaced the race fd in between. */
		char eb[24];

		expect(w, a->reliable && a->gen == w->gen && !a->freed,
		       "mmap of a live allocation (%#llx bytes at offset %#llx) failed: %s",
		       (unsigned long long)a->size, (unsigned long long)a->mmap_offset,
		       errname(errno, eb, sizeof(eb)));
		return NULL;
	}
	*r = (struct region){ .used = true, .addr = m, .len = a->size, .alloc = ix,
			      .prot = PROT_READ | PROT_WRITE, .shared_ix = -1 };
	if (shared)
		shared_add(w, r, a->handle);
	return r;
}

/*
 * After FREE of @handle on the file of @slot returned @ret/@err: what the
 * thread's table now knows about the allocation with that handle.
 */
static void after_free(struct worker *w, int slot, __u64 handle, long ret, int err)
{
	for (int i = 0; i < MAX_ALLOCS; i++) {
		struct dalloc *a = &w->allocs[i];

		if (!a->used || a->slot != slot || a->handle != handle ||
		    (slot == DS_PRIV && a->gen != w->gen))
			continue;
		if (slot == DS_RACE) {
			/*
			 * The racer may have put another file behind the fd, whose
			 * handles are its own (recycled per file since ABI 1.6): the
			 * FREE says nothing about this allocation, whose own file
			 * may be gone from the fd.
			 */
			if (ret == 0 || err == ENOENT)
				a->gone = true;
		} else if (ret == 0) {
			a->freed = true;
		} else if (err == ENOENT) {
			/* Only another thread or a racer's close could have freed it. */
			expect(w, a->reliable && !a->freed,
			       "FREE: ENOENT for live allocation %#llx of the thread's own file (made at its operation %llu, now %llu)",
			       (unsigned long long)handle, (unsigned long long)a->born,
			       (unsigned long long)w->nops);
			a->freed = true;
			a->reliable = false;
		} else if (abi_minor >= 6 && err == EFAULT) {
			/* The argument is checked before FREE acts: nothing happened. */
		} else {
			/* EFAULT, EBUSY, ...: maybe freed, maybe not; no oracle on it now. */
			a->reliable = false;
		}
		alloc_maybe_forget(w, i);
	}
}

static void op_free(struct worker *w)
{
	struct p2pdirect_free f;
	int slot, fd = pick_dev(w, &slot), err, r = rnd(w, 100);
	struct dalloc *a;
	long ret;

	f.handle = rnd64(w);
	a = r < 65 ? pick_alloc(w, slot) : NULL;
	if (a) {
		f.handle = a->handle;
	} else if (r < 80 && slot == DS_SHARED && !w->child) {
		int i = rnd(w, MAX_SHARED);

		pthread_mutex_lock(&shared_lock);
		if (shared_tab[i].used)
			f.handle = shared_tab[i].handle;
		pthread_mutex_unlock(&shared_lock);
	} else if (r < 90) {
		f.handle = chance(w, 50) ? rnd(w, 64) : (chance(w, 50) ? 0 : ~0ull);
	}
	issue(w, OP_FREE, fd, P2PDIRECT_IOC_FREE, &f, sizeof(f), true, &ret, &err);
	expect(w, abi_minor >= 6 && ret && err == EBUSY, "FREE returned EBUSY (never waits since ABI 1.6)");
	if (slot != DS_OTHER && slot != DS_NEW)
		after_free(w, slot, f.handle, ret, err);
	put_dev(fd, slot);
}

static int pick_probe_fd(struct worker *w)
{
	static const int ns[] = { FK_NS1_RW, FK_NS4_RW, FK_NS1_RO, FK_NS4_RO, FK_NS2_RO,
				  FK_NS3_RO, FK_NS1_WO, FK_NS1_BUF };

	if (chance(w, 70))
		return fd_of_kind(w, ns[rnd(w, ARRAY_SIZE(ns))]);
	return fd_of_kind(w, rnd(w, NR_FK));
}

static void op_probe(struct worker *w)
{
	struct p2pdirect_dma_probe p;
	int slot, fd = pick_dev(w, &slot), err, pk;
	__u64 avail;
	long ret;

	memset(&p, 0, sizeof(p));
	p.addr = pick_dev_ptr(w, &avail, &pk);
	p.size = pick_len(w, avail, 64 * MiB, p.addr);
	p.fd = pick_probe_fd(w);
	p.flags = pick_flags(w, P2PDIRECT_PROBE_WRITE);
	pick_out(w, sizeof(struct p2pdirect_dma_seg), &p.segs, &p.capacity);
	p.pad = pick_pad(w);
	if (chance(w, 30)) {
		p.count = (__u32)rnd64(w);
		p.page_size = (__u32)rnd64(w);
		p.client = (__u32)rnd64(w);
	}
	if (issue(w, OP_PROBE, fd, P2PDIRECT_IOC_DMA_PROBE, &p, sizeof(p), false, &ret, &err) &&
	    ret == 0 && slot != DS_OTHER) {
		expect(w, p.pad != 0, "DMA_PROBE succeeded with pad %#x", p.pad);
		expect(w, p.flags & ~P2PDIRECT_PROBE_WRITE, "DMA_PROBE succeeded with flags %#x",
		       p.flags);
		expect(w, p.size == 0, "DMA_PROBE succeeded with size 0");
		expect(w, pk_never_device(pk), "DMA_PROBE succeeded on %#llx, which is no device memory",
		       (unsigned long long)p.addr);
		expect(w, abi_minor >= 6 && pk == PK_DEV && p.size > avail,
		       "DMA_PROBE succeeded on %#llx + %#llx, past the end of its mapping (%#llx left)",
		       (unsigned long long)p.addr, (unsigned long long)p.size,
		       (unsigned long long)avail);
		expect(w, p.client != P2PDIRECT_CLIENT_DEVMEM &&
		       p.client != P2PDIRECT_CLIENT_P2PDMA_USER, "DMA_PROBE: client %u", p.client);
		expect(w, p.page_size < PAGE || !pow2(p.page_size), "DMA_PROBE: page size %u",
		       p.page_size);
	}
	put_dev(fd, slot);
}

static void op_register(struct worker *w)
{
	struct p2pdirect_register rg;
	int slot, fd = pick_dev(w, &slot), err, pk;
	__u64 avail;
	long ret;

	memset(&rg, 0, sizeof(rg));
	rg.addr = pick_dev_ptr(w, &avail, &pk);
	rg.size = pick_len(w, avail, 64 * MiB, rg.addr);
	rg.flags = pick_flags(w, P2PDIRECT_REG_WRITE);
	if (chance(w, 30)) {
		rg.client = (__u32)rnd64(w);
		rg.id = rnd64(w);
	}
	if (!issue(w, OP_REGISTER, fd, P2PDIRECT_IOC_REGISTER, &rg, sizeof(rg), true, &ret, &err) ||
	    ret || slot == DS_OTHER) {
		put_dev(fd, slot);
		return;
	}
	expect(w, rg.flags & ~P2PDIRECT_REG_WRITE, "REGISTER succeeded with flags %#x", rg.flags);
	expect(w, rg.size == 0, "REGISTER succeeded with size 0");
	expect(w, pk_never_device(pk), "REGISTER succeeded on %#llx, which is no device memory",
	       (unsigned long long)rg.addr);
	expect(w, abi_minor >= 6 && pk == PK_DEV && rg.size > avail,
	       "REGISTER succeeded on %#llx + %#llx, past the end of its mapping (%#llx left)",
	       (unsigned long long)rg.addr, (unsigned long long)rg.size,
	       (unsigned long long)avail);
	expect(w, rg.client != P2PDIRECT_CLIENT_DEVMEM &&
	       rg.client != P2PDIRECT_CLIENT_P2PDMA_USER, "REGISTER: client %u", rg.client);
	for (int i = 0; i < MAX_REGS && slot != DS_NEW; i++) {
		if (w->regs[i].used)
			continue;
		w->regs[i] = (struct reg){ .used = true, .slot = slot, .gen = w->gen,
					   .id = rg.id, .size = rg.size };
		break;
	}
	put_dev(fd, slot);
}

static struct reg *pick_reg(struct worker *w, int slot)
{
	int start = rnd(w, MAX_REGS);

	for (int k = 0; k < MAX_REGS; k++) {
		struct reg *r = &w->regs[(start + k) % MAX_REGS];

		if (r->used && r->slot == slot && (slot != DS_PRIV || r->gen == w->gen))
			return r;
	}
	return NULL;
}

static void op_reg_id(struct worker *w, bool dereg)
{
	struct p2pdirect_reg_id q;
	int slot, fd = pick_dev(w, &slot), err;
	struct reg *r = NULL;
	long ret;

	memset(&q, 0, sizeof(q));
	if (chance(w, 75))
		r = pick_reg(w, slot);
	if (r)
		q.id = r->id;
	else
		q.id = chance(w, 50) ? rnd(w, 64) : rnd64(w);
	q.pad = pick_pad(w);
	q.state = chance(w, 30) ? (__u32)rnd64(w) : 0;
	if (issue(w, dereg ? OP_DEREGISTER : OP_REG_QUERY, fd,
		  dereg ? P2PDIRECT_IOC_DEREGISTER : P2PDIRECT_IOC_REG_QUERY, &q, sizeof(q), dereg,
		  &ret, &err) && ret == 0 && slot != DS_OTHER) {
		expect(w, q.pad != 0, "%s succeeded with pad %#x", dereg ? "DEREGISTER" : "REG_QUERY",
		       q.pad);
		expect(w, q.state != P2PDIRECT_REG_LIVE && q.state != P2PDIRECT_REG_DEAD,
		       "%s: state %u", dereg ? "DEREGISTER" : "REG_QUERY", q.state);
	}
	if (dereg && r && (ret == 0 || err == ENOENT))
		r->used = false;
	put_dev(fd, slot);
}

/* An fd for READ/WRITE: anything but the mounted file systems' namespaces. */
static int pick_io_fd(struct worker *w, int *fk)
{
	static const int good[] = { FK_NS1_RW, FK_NS4_RW, FK_EXT4_RW, FK_XFS_RW };

	if (chance(w, 65)) {
		*fk = good[rnd(w, ARRAY_SIZE(good))];
	} else {
		*fk = rnd(w, NR_FK - 2);
		if (*fk >= FK_NS2_RO)
			*fk += 2;	/* skips FK_NS2_RO and FK_NS3_RO */
	}
	return fd_of_kind(w, *fk);
}

/*
 * The file offset: for NSID 1 and 4 in [200 MiB, end) or past the end
 * (READs may also wrap); for scratch files mostly in their first 32 MiB.
 */
static __u64 pick_foff(struct worker *w, int fk, bool write, __u64 size)
{
	int r = rnd(w, 100);

	if (fk_is_ns(fk)) {
		__u64 hi = ns_size[fk == FK_NS4_RW || fk == FK_NS4_RO];
		__u64 span = hi - SAFE_LO, off;

		if (r < 70)
			off = SAFE_LO + rnd(w, span / BLK) * BLK;
		else if (r < 78)
			off = hi - BLK * (1 + rnd(w, 8));
		else if (r < 84)
			off = SAFE_LO + 1 + rnd(w, span - 1);
		else if (r < 90)
			off = hi + rnd(w, 64) * BLK;
		else if (r < 95 || write)
			off = (1ull << (40 + rnd(w, 23))) + rnd(w, 8) * BLK;
		else
			off = (0 - size) + BLK * rnd(w, 4);	/* wraps */
		/* Never below SAFE_LO, and a WRITE never wraps to a low offset. */
		if (off < SAFE_LO || (write && off + size < off))
			off = hi;
		return off;
	}
	if (fk_is_scratch(fk)) {
		if (r < 80)
			return rnd(w, SCRATCH_SPAN / BLK) * BLK;
		if (r < 88)
			return rnd(w, SCRATCH_SPAN);
		if (r < 96)
			return (1ull << (30 + rnd(w, 33))) & ~(BLK - 1);
		return 0 - size + BLK * rnd(w, 4);
	}
	return r < 50 ? rnd(w, SCRATCH_SPAN) : rnd64(w);
}

/*
 * The argument of a READ or WRITE through /dev/p2pdirect slot @slot: real and
 * hostile values mixed; @fk the kind of its fd, @pk of its device pointer,
 * @avail the bytes from its memory on that belong to what it points into.
 */
static void pick_io(struct worker *w, bool write, int slot, struct p2pdirect_io *io, int *fk,
		    int *pk, __u64 *avail)
{
	struct reg *rg;

	memset(io, 0, sizeof(*io));
	*pk = PK_RANDOM;
	*avail = 0;
	io->fd = pick_io_fd(w, fk);
	io->flags = pick_flags(w, P2PDIRECT_IO_REGISTERED | P2PDIRECT_IO_COMPAT);
	if (io->flags & P2PDIRECT_IO_REGISTERED) {
		rg = chance(w, 85) ? pick_reg(w, slot) : NULL;
		if (rg) {
			io->addr = rg->id;
			*avail = rg->size;
		} else {
			io->addr = chance(w, 50) ? rnd(w, 64) : rnd64(w);
			*avail = MiB;
		}
	} else {
		io->addr = pick_dev_ptr(w, avail, pk);
	}
	io->size = pick_len(w, *avail, IO_CAP, io->addr);
	if (write && fk_is_ns(*fk) && io->size > ((~0ull - SAFE_HI) & ~(BLK - 1)))
		io->size = (~0ull - SAFE_HI) & ~(BLK - 1);
	if (chance(w, 70) || *avail <= io->size)
		io->buf_offset = 0;
	else if (chance(w, 70))
		io->buf_offset = rnd(w, (*avail - io->size) / BLK + 1) * BLK;
	else
		io->buf_offset = chance(w, 50) ? 1 + rnd(w, BLK - 1) : rnd64(w);
	io->file_offset = pick_foff(w, *fk, write, io->size);
	/* Belt and braces: never a namespace range another suite checks. */
	if (fk_is_ns(*fk) && (io->file_offset < SAFE_LO || *fk == FK_NS2_RO || *fk == FK_NS3_RO ||
			      (write && io->file_offset + io->size < io->file_offset))) {
		say("# fuzzer bug: I/O at %#llx of fd kind %d refused", io->file_offset, *fk);
		abort();
	}
}

/* The oracles of a READ or WRITE that succeeded with @io's results (@what: its name). */
static void check_io(struct worker *w, const char *what, bool write, const struct p2pdirect_io *io,
		     int fk, int pk, __u64 avail)
{
	expect(w, io->pad != 0, "%s succeeded with pad %#x", what, io->pad);
	expect(w, io->flags & ~(P2PDIRECT_IO_REGISTERED | P2PDIRECT_IO_COMPAT),
	       "%s succeeded with flags %#x", what, io->flags);
	expect(w, io->size == 0, "%s succeeded with size 0", what);
	expect(w, fk_io_must_fail(fk, write), "%s succeeded on fd kind %d (must fail)", what, fk);
	/* 0 bytes (a READ at the end) may succeed without looking at memory, as pread. */
	expect(w, pk == PK_DEV && io->bytes && (io->buf_offset >= avail ||
						io->size > avail - io->buf_offset),
	       "%s moved %llu bytes with %#llx + %#llx + %#llx, past the end of its mapping (%#llx left)",
	       what, (unsigned long long)io->bytes, (unsigned long long)io->addr,
	       (unsigned long long)io->buf_offset, (unsigned long long)io->size,
	       (unsigned long long)avail);
	expect(w, pk_never_device(pk) && io->buf_offset < avail && io->bytes,
	       "%s moved %llu bytes with %#llx + %#llx, which is no device memory", what,
	       (unsigned long long)io->bytes, (unsigned long long)io->addr,
	       (unsigned long long)io->buf_offset);
	expect(w, io->bytes > io->size ||
	       io->p2p_bytes + io->bounce_bytes + io->zeroed_bytes > io->bytes,
	       "%s: bytes %llu (p2p %llu, bounce %llu, zeroed %llu) for size %llu", what,
	       (unsigned long long)io->bytes, (unsigned long long)io->p2p_bytes,
	       (unsigned long long)io->bounce_bytes, (unsigned long long)io->zeroed_bytes,
	       (unsigned long long)io->size);
}

static void op_io(struct worker *w, bool write)
{
	struct p2pdirect_io io;
	int slot, fd = pick_dev(w, &slot), err, fk, pk;
	__u64 avail;
	long ret;

	pick_io(w, write, slot, &io, &fk, &pk, &avail);
	io.pad = pick_pad(w);
	if (chance(w, 30)) {
		io.bytes = rnd64(w);
		io.p2p_bytes = rnd64(w);
		io.dma_pci_addr = (__u32)rnd64(w);
	}
	if (issue(w, write ? OP_WRITE : OP_READ, fd, write ? P2PDIRECT_IOC_WRITE :
		  P2PDIRECT_IOC_READ, &io, sizeof(io), false, &ret, &err) && ret == 0 &&
	    slot != DS_OTHER)
		check_io(w, write ? "WRITE" : "READ", write, &io, fk, pk, avail);
	put_dev(fd, slot);
}

/*
 * io_uring READ/WRITE commands (IORING_OP_URING_CMD) with the arguments of
 * the ioctls, on a ring of the thread's own: 128-byte SQEs and 32-byte CQEs
 * mostly; now and then 128-byte SQEs with 16-byte CQEs, 64-byte SQEs (every
 * command -EINVAL), or DEFER_TASKRUN. Up to four commands per call, some
 * with IOSQE_ASYNC or linked, some with a reserved byte, uring_cmd_flags, an
 * unused SQE field or an unknown cmd_op set (each must fail), on every kind
 * of /dev/p2pdirect fd (a new one is closed right after the submission, the
 * racer's may be replaced under it). Commands stay in flight across other
 * operations (FREE, munmap, DEREGISTER, close, fork) until a later call reaps
 * them, and one ring in ten is torn down with its commands in flight.
 */
enum { RK_NONE, RK_BIG, RK_SQE128, RK_SMALL, RK_DEFER };

static const unsigned int ring_flags[] = {
	[RK_BIG] = IORING_SETUP_SQE128 | IORING_SETUP_CQE32,
	[RK_SQE128] = IORING_SETUP_SQE128,
	[RK_SMALL] = 0,
	[RK_DEFER] = IORING_SETUP_SQE128 | IORING_SETUP_CQE32 | IORING_SETUP_SINGLE_ISSUER |
		     IORING_SETUP_DEFER_TASKRUN,
};

#define URING_SQ 8u

static void uring_forget(struct worker *w)
{
	w->ring_kind = RK_NONE;
	w->inflight = 0;
	memset(w->uq, 0, sizeof(w->uq));
}

/* Checks one CQE against what its command was. */
static void uring_cqe(struct worker *w, struct io_uring_cqe *cqe)
{
	__u64 ud = cqe->user_data;
	bool big = w->ring_kind == RK_BIG || w->ring_kind == RK_DEFER;
	struct uq *q;

	if (ud >= URING_SQ || !w->uq[ud].used) {
		fail(w, F_ORACLE, "io_uring: a CQE with user_data %llu, res %d, no such command",
		     (unsigned long long)ud, cqe->res);
		return;
	}
	q = &w->uq[ud];
	note(w, OP_URING, q->io.fd, cqe->res < 0 ? -1 : 0, cqe->res < 0 ? -cqe->res : 0);
	if (cqe->res >= 0) {
		const char *what = q->write ? "io_uring WRITE" : "io_uring READ";

		expect(w, q->bad, "%s succeeded (%d) with a bad field, cmd_op, SQE size or open mode",
		       what, cqe->res);
		q->io.bytes = (__u32)cqe->res;
		if (big) {
			q->io.p2p_bytes = cqe->big_cqe[0] & 0xffffffff;
			q->io.bounce_bytes = cqe->big_cqe[0] >> 32;
		}
		/*
		 * A command io_uring's worker issues looks its memory up when it
		 * starts (the header): after another operation of this thread, its
		 * address may name another mapping by then, so what the pointer
		 * was at submission says nothing.
		 */
		check_io(w, what, q->write, &q->io, q->fk, w->nops == q->nops ? q->pk : PK_RANDOM,
			 q->avail);
	}
	q->used = false;
	w->inflight--;
}

/* Reaps what has completed, or (@all) every command in flight. */
static void uring_reap(struct worker *w, bool all)
{
	while (w->inflight) {
		struct __kernel_timespec ts = { .tv_sec = 1 };
		struct io_uring_cqe *cqe;
		int r;

		if (all)
			r = io_uring_submit_and_wait_timeout(&w->ring, &cqe, 1, &ts, NULL);
		else if (w->ring_kind == RK_DEFER)
			r = io_uring_get_events(&w->ring) < 0 ? -EAGAIN :
			    io_uring_peek_cqe(&w->ring, &cqe);
		else
			r = io_uring_peek_cqe(&w->ring, &cqe);
		if (r == -ETIME || r == -EINTR)
			continue;	/* a command still running: the watchdog judges a hang */
		if (r == -EAGAIN && !all)
			return;
		if (r < 0) {
			fail(w, F_ORACLE, "io_uring: waiting for %u CQEs: %s", w->inflight,
			     strerror(-r));
			io_uring_queue_exit(&w->ring);
			uring_forget(w);
			return;
		}
		uring_cqe(w, cqe);
		io_uring_cqe_seen(&w->ring, cqe);
	}
}

static void op_uring(struct worker *w)
{
	unsigned int n = 1 + rnd(w, 4), queued = 0;
	int fds[4], slots[4];

	if (w->ring_kind == RK_NONE) {
		int r = rnd(w, 100);
		int kind = r < 70 ? RK_BIG : r < 78 ? RK_SQE128 : r < 86 ? RK_SMALL : RK_DEFER;

		if (io_uring_queue_init(URING_SQ, &w->ring, ring_flags[kind]))
			return;
		w->ring_kind = kind;
	}
	if (w->inflight + n > URING_SQ)
		uring_reap(w, true);
	for (unsigned int i = 0; i < n && w->ring_kind != RK_NONE; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
		bool write = chance(w, 45), small = w->ring_kind == RK_SMALL;
		struct p2pdirect_uring_io arg;
		unsigned int ud = 0;
		struct uq *q;
		int r;

		if (!sqe)
			break;
		while (w->uq[ud].used)
			ud++;
		q = &w->uq[ud];
		memset(q, 0, sizeof(*q));
		fds[i] = pick_dev(w, &slots[i]);
		if (slots[i] == DS_OTHER) {
			/* Another driver's file would take the command as its own. */
			fds[i] = w->priv;
			slots[i] = DS_PRIV;
		}
		pick_io(w, write, slots[i], &q->io, &q->fk, &q->pk, &q->avail);
		arg = (struct p2pdirect_uring_io){
			.fd = q->io.fd, .flags = q->io.flags, .addr = q->io.addr,
			.size = q->io.size, .file_offset = q->io.file_offset,
			.buf_offset = q->io.buf_offset,
		};
		memset(sqe, 0, small ? 64 : 128);
		sqe->opcode = IORING_OP_URING_CMD;
		sqe->fd = fds[i];
		sqe->cmd_op = write ? P2PDIRECT_URING_CMD_WRITE : P2PDIRECT_URING_CMD_READ;
		/* A 64-byte SQE has 16 bytes of command area. */
		memcpy((__u8 *)sqe + offsetof(struct io_uring_sqe, cmd), &arg,
		       small ? 16 : sizeof(arg));
		q->bad = small || slots[i] == DS_RDONLY;
		r = rnd(w, 100);
		if (r < 4 && !small) {	/* a 64-byte SQE has no such bytes */
			((__u8 *)sqe)[offsetof(struct io_uring_sqe, cmd) + sizeof(arg) +
				      rnd(w, 80 - sizeof(arg))] = 1 + rnd(w, 255);
			q->bad = true;
		} else if (r < 7) {
			sqe->uring_cmd_flags = 1u << rnd(w, 32);
			q->bad = true;
		} else if (r < 10) {
			switch (rnd(w, 5)) {
			case 0:
				sqe->ioprio = 1 + rnd(w, 0xffff);
				break;
			case 1:
				sqe->addr = 1 + rnd64(w) / 2;
				break;
			case 2:
				sqe->len = 1 + rnd(w, 0xffffffff);
				break;
			case 3:
				sqe->buf_index = 1 + rnd(w, 0xffff);
				break;
			default:
				sqe->file_index = 1 + rnd(w, 0xffffffff);
				break;
			}
			q->bad = true;
		} else if (r < 13) {
			sqe->cmd_op = chance(w, 50) ? (__u32)rnd64(w) : P2PDIRECT_URING_CMD_READ ^
				      (1u << rnd(w, 32));
			/* BASE + 16 and + 17 differ in one bit: never the other command. */
			if (sqe->cmd_op == P2PDIRECT_URING_CMD_READ ||
			    sqe->cmd_op == P2PDIRECT_URING_CMD_WRITE)
				sqe->cmd_op = 0;
			q->bad = true;
		}
		if (chance(w, 10))
			sqe->flags |= IOSQE_ASYNC;
		if (i + 1 < n && chance(w, 5))
			sqe->flags |= IOSQE_IO_LINK;
		sqe->user_data = ud;
		q->nops = w->nops;
		q->write = write;
		q->used = true;
		w->inflight++;
		queued++;
	}
	if (queued)
		io_uring_submit(&w->ring);
	for (unsigned int i = 0; i < queued; i++)
		put_dev(fds[i], slots[i]);
	if (w->ring_kind == RK_NONE)
		return;
	if (chance(w, 10)) {
		io_uring_queue_exit(&w->ring);	/* with its commands in flight */
		uring_forget(w);
	} else {
		uring_reap(w, chance(w, 60));
	}
}

static void op_stats(struct worker *w)
{
	struct p2pdirect_stats s;
	int slot, fd = pick_dev(w, &slot), err;
	long ret;

	memset(&s, 0, sizeof(s));
	pick_out(w, sizeof(struct p2pdirect_stat), &s.entries, &s.capacity);
	s.flags = pick_flags(w, P2PDIRECT_STATS_RESET);
	s.pad = pick_pad(w);
	s.count = chance(w, 30) ? (__u32)rnd64(w) : 0;
	if (issue(w, OP_STATS, fd, P2PDIRECT_IOC_STATS, &s, sizeof(s), false, &ret, &err) && ret == 0 &&
	    slot != DS_OTHER) {
		expect(w, s.pad != 0, "STATS succeeded with pad %#x", s.pad);
		expect(w, s.flags & ~P2PDIRECT_STATS_RESET, "STATS succeeded with flags %#x",
		       s.flags);
		expect(w, abi_minor >= 6 && slot == DS_RDONLY && (s.flags & P2PDIRECT_STATS_RESET),
		       "STATS with RESET succeeded on /dev/p2pdirect opened O_RDONLY");
	}
	put_dev(fd, slot);
}

static const __u32 cmd_size[] = {
	sizeof(struct p2pdirect_version), sizeof(struct p2pdirect_list_providers),
	sizeof(struct p2pdirect_alloc), sizeof(struct p2pdirect_free),
	sizeof(struct p2pdirect_dma_probe), sizeof(struct p2pdirect_register),
	sizeof(struct p2pdirect_reg_id), sizeof(struct p2pdirect_reg_id),
	sizeof(struct p2pdirect_io), sizeof(struct p2pdirect_io),
	sizeof(struct p2pdirect_stats), sizeof(struct p2pdirect_export_dmabuf),
};

/*
 * A command p2pdirect does not have: a free number of its magic, or a known
 * number with another size or direction. The argument is a plausible struct
 * of the known command, in the scribble buffer.
 */
/*
 * EXPORT_DMABUF of an allocation of the thread's (or a hostile handle),
 * whole, a page range or a random range; a dma-buf it gets names exactly
 * the bytes asked for, may be mapped, and is closed at once.
 */
static void op_export(struct worker *w)
{
	struct p2pdirect_export_dmabuf e = { 0 };
	int slot, fd = pick_dev(w, &slot), err;
	struct dalloc *a = chance(w, 75) ? pick_alloc(w, slot) : NULL;
	__u64 want = 0;
	__u32 flags;
	long ret;

	e.handle = a ? a->handle : (chance(w, 50) ? rnd(w, 64) : rnd64(w));
	if (a && chance(w, 40)) {
		e.offset = 0;
		want = a->size;
	} else if (a && chance(w, 70)) {
		e.offset = rnd(w, a->size / PAGE) * PAGE;
		e.size = chance(w, 30) ? 0 : PAGE * (1 + rnd(w, (a->size - e.offset) / PAGE));
		want = e.size ? e.size : a->size - e.offset;
	} else {
		e.offset = chance(w, 50) ? rnd(w, 3 * PAGE) : rnd64(w);
		e.size = chance(w, 50) ? rnd(w, 3 * PAGE) : rnd64(w);
	}
	flags = chance(w, 85) ? (chance(w, 50) ? P2PDIRECT_EXPORT_CLOEXEC : 0) : (__u32)rnd64(w);
	e.flags = flags;
	e.fd = chance(w, 50) ? -1 : (int)rnd(w, 1024);
	if (!issue(w, OP_EXPORT, fd, P2PDIRECT_IOC_EXPORT_DMABUF, &e, sizeof(e), true, &ret,
		   &err) || ret) {
		put_dev(fd, slot);
		return;
	}
	expect(w, flags & ~P2PDIRECT_EXPORT_CLOEXEC, "EXPORT_DMABUF accepted flags %#x", flags);
	expect(w, e.offset % PAGE || e.size % PAGE, "EXPORT_DMABUF accepted %#llx+%#llx",
	       (unsigned long long)e.offset, (unsigned long long)e.size);
	expect(w, e.fd < 0, "EXPORT_DMABUF succeeded with fd %d", e.fd);
	if (e.fd >= 0) {
		off_t end = lseek(e.fd, 0, SEEK_END);

		/*
		 * Only of an allocation no other thread can have freed, and that
		 * this thread did not free: a freed one's handle may name a newer
		 * allocation of the file (handles are recycled per file).
		 */
		expect(w, want && a->reliable && !a->freed && end != (off_t)want,
		       "EXPORT_DMABUF of %#llx bytes gave a dma-buf of %lld",
		       (unsigned long long)want, (long long)end);
		if (end > 0 && chance(w, 30)) {
			void *m = mmap(NULL, end, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd, 0);

			if (m != MAP_FAILED)
				munmap(m, end);
		}
		close(e.fd);
	}
	put_dev(fd, slot);
}

static void op_bad_cmd(struct worker *w)
{
	static const unsigned int dirs[] = { _IOC_NONE, _IOC_READ, _IOC_WRITE,
					     _IOC_READ | _IOC_WRITE };
	unsigned int nr, size, dir;
	int slot, fd = pick_dev(w, &slot), op, err;
	__u8 *arg = w->zone + Z_SCRIBBLE + rnd(w, SCRIBBLE_LEN / 2 / 8) * 8;
	long ret;

	if (chance(w, 40)) {
		op = OP_UNKNOWN;
		nr = chance(w, 70) ? P2PDIRECT_IOCTL_BASE + ARRAY_SIZE(cmd_size) +
			rnd(w, 0x20 - ARRAY_SIZE(cmd_size)) : rnd(w, P2PDIRECT_IOCTL_BASE);
		size = chance(w, 50) ? rnd(w, 256) : rnd(w, 1u << _IOC_SIZEBITS);
		dir = dirs[rnd(w, 4)];
	} else {
		unsigned int k = rnd(w, ARRAY_SIZE(cmd_size));

		op = OP_WRONG;
		nr = P2PDIRECT_IOCTL_BASE + k;
		size = cmd_size[k];
		dir = _IOC_READ | _IOC_WRITE;
		if (chance(w, 50))
			dir = dirs[rnd(w, 3)];
		else if (chance(w, 50))
			size += 1 + rnd(w, 64);
		else if (chance(w, 50))
			size -= 1 + rnd(w, size);
		else
			size = (size + 1 + rnd(w, (1u << _IOC_SIZEBITS) - 2)) %
			       (1u << _IOC_SIZEBITS);
		if (size == cmd_size[k] && dir == (_IOC_READ | _IOC_WRITE))
			size ^= 8;
		/* Something the real command would accept: zeros, then a size. */
		memset(arg, 0, 256);
		((__u64 *)arg)[1] = PAGE;
	}
	if (chance(w, 20))
		for (int i = 0; i < 32; i++)
			((__u64 *)arg)[i] = rnd64(w);
	ret = ioctl(fd, _IOC(dir, P2PDIRECT_IOCTL_MAGIC, nr, size), chance(w, 90) ? arg : NULL);
	err = ret ? errno : 0;
	note(w, op, fd, ret, err);
	if ((slot == DS_PRIV || slot == DS_SHARED || slot == DS_NEW) && fd >= 0)
		expect(w, ret != -1 || err != ENOTTY,
		       "command %#x (nr %#x, size %u, dir %u) returned %ld errno %d, not ENOTTY",
		       _IOC(dir, P2PDIRECT_IOCTL_MAGIC, nr, size), nr, size, dir, ret, err);
	put_dev(fd, slot);
}

/* --- mm operations on device memory ------------------------------------------------------ */

static void op_mmap(struct worker *w)
{
	static const int prots[] = { PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE,
				     PROT_READ | PROT_WRITE, PROT_READ, PROT_WRITE, PROT_NONE,
				     PROT_READ | PROT_WRITE | PROT_EXEC, PROT_EXEC };
	static const int extra[] = { 0, 0, 0, 0, MAP_POPULATE, MAP_LOCKED, MAP_NORESERVE,
				     MAP_32BIT, MAP_HUGETLB, MAP_GROWSDOWN, MAP_SYNC };
	int slot, fd = pick_dev(w, &slot), prot, flags, type, ix = -1, r1;
	struct region *r = new_region(w);
	__u64 off, len, size;
	struct dalloc *a;
	bool exact;
	void *m;

	/*
	 * Never another kind of fd: a shared mapping of a namespace or a file,
	 * written by op_touch(), would end up on the disk. The other open of
	 * /dev/p2pdirect has none of the allocations asked for here.
	 */
	if (slot == DS_OTHER)
		fd = second_dev;
	a = pick_alloc(w, slot == DS_OTHER ? DS_PRIV : slot);
	size = a ? a->size : PAGE * (1 + rnd(w, 16));
	if (!r) {
		put_dev(fd, slot);
		return;
	}
	off = a ? a->mmap_offset : rnd(w, 1 << 20) * PAGE;
	r1 = rnd(w, 10);
	if (r1 == 0)
		off += PAGE;
	else if (r1 == 1)
		off = rnd(w, 1 << 20) * PAGE;
	else if (r1 == 2)
		off = chance(w, 50) ? off + 1 + rnd(w, PAGE - 1) : ~0ull & ~(PAGE - 1);
	len = size;
	r1 = rnd(w, 10);
	if (r1 == 0)
		len = size - 1;		/* rounds up to the size */
	else if (r1 == 1)
		len = size > PAGE ? size - PAGE : PAGE;
	else if (r1 == 2)
		len = size + PAGE;
	else if (r1 == 3)
		len = chance(w, 50) ? 0 : 1ull << 46;
	prot = prots[rnd(w, ARRAY_SIZE(prots))];
	type = chance(w, 85) ? MAP_SHARED : (chance(w, 50) ? MAP_PRIVATE : MAP_SHARED_VALIDATE);
	flags = type | extra[rnd(w, ARRAY_SIZE(extra))];
	m = mmap(NULL, len, prot, flags, fd, off);
	note(w, OP_MMAP, fd, m == MAP_FAILED ? -1 : 0, m == MAP_FAILED ? errno : 0);
	put_dev(fd, slot);
	if (m == MAP_FAILED)
		return;
	if (slot != DS_OTHER) {
		expect(w, type == MAP_PRIVATE, "mmap of device memory succeeded with MAP_PRIVATE");
		expect(w, prot & PROT_EXEC, "mmap of device memory succeeded with PROT_EXEC");
	}
	exact = a && slot != DS_OTHER && off == a->mmap_offset;
	if (exact && a->reliable && !a->freed)
		expect(w, (len + PAGE - 1) / PAGE * PAGE != a->size,
		       "mmap of %#llx bytes of a %#llx-byte allocation succeeded",
		       (unsigned long long)len, (unsigned long long)a->size);
	if (exact && (len + PAGE - 1) / PAGE * PAGE == a->size && !a->freed)
		ix = a - w->allocs;
	*r = (struct region){ .used = true, .addr = m, .len = (len + PAGE - 1) / PAGE * PAGE,
			      .alloc = ix, .prot = prot, .shared_ix = -1 };
	if (ix >= 0 && slot == DS_SHARED && !w->child)
		shared_add(w, r, a->handle);
	if (prot & PROT_READ)
		guarded_touch(r->addr + rnd(w, r->len), 1, false, 0);
}

static void op_munmap(struct worker *w)
{
	struct region *r = any_region(w), *r2;
	__u64 pages, a, b;
	long ret;

	if (!r)
		return;
	pages = r->len / PAGE;
	switch (rnd(w, 6)) {
	case 0: case 1: case 2:
		ret = munmap(r->addr, r->len);
		note(w, OP_MUNMAP, -1, ret, ret ? errno : 0);
		shared_drop(w, r);
		remember_gone(w, r->addr);
		r->used = false;
		if (r->alloc >= 0)
			alloc_maybe_forget(w, r->alloc);
		return;
	case 3:		/* head */
		if (pages < 2)
			return;
		a = 1 + rnd(w, pages - 1);
		ret = munmap(r->addr, a * PAGE);
		note(w, OP_MUNMAP, -1, ret, ret ? errno : 0);
		if (ret)
			return;
		shared_drop(w, r);
		r->addr += a * PAGE;
		r->len -= a * PAGE;
		r->hist |= H_SPLIT;
		return;
	case 4:		/* tail */
		if (pages < 2)
			return;
		a = 1 + rnd(w, pages - 1);
		ret = munmap(r->addr + a * PAGE, r->len - a * PAGE);
		note(w, OP_MUNMAP, -1, ret, ret ? errno : 0);
		if (!ret) {
			r->len = a * PAGE;
			r->hist |= H_SHRUNK;
		}
		return;
	default:	/* a hole in the middle: two regions */
		r2 = new_region(w);
		if (pages < 3 || !r2)
			return;
		a = 1 + rnd(w, pages - 2);
		b = a + 1 + rnd(w, pages - a - 1);	/* unmap [a, b) */
		if (b >= pages)
			b = pages - 1;
		if (b <= a)
			return;
		ret = munmap(r->addr + a * PAGE, (b - a) * PAGE);
		note(w, OP_MUNMAP, -1, ret, ret ? errno : 0);
		if (ret)
			return;
		*r2 = *r;
		r2->addr = r->addr + b * PAGE;
		r2->len = r->len - b * PAGE;
		r2->shared_ix = -1;
		r2->hist |= H_SPLIT;
		r->len = a * PAGE;
		r->hist |= H_SHRUNK;
		return;
	}
}

static void op_madvise(struct worker *w)
{
	static const int advice[] = {
		MADV_DONTNEED, MADV_DONTNEED, MADV_DONTNEED, MADV_WILLNEED, MADV_NORMAL,
		MADV_RANDOM, MADV_SEQUENTIAL, MADV_DONTFORK, MADV_DOFORK, MADV_DONTDUMP,
		MADV_DODUMP, MADV_FREE, MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ,
		MADV_POPULATE_WRITE, MADV_WIPEONFORK, MADV_KEEPONFORK,
	};
	struct region *r = any_region(w);
	__u64 pages, a, n;
	long ret;
	int adv;

	if (!r)
		return;
	pages = r->len / PAGE;
	a = chance(w, 50) ? 0 : rnd(w, pages);
	n = chance(w, 50) ? pages - a : 1 + rnd(w, pages - a);
	adv = advice[rnd(w, ARRAY_SIZE(advice))];
	ret = madvise(r->addr + a * PAGE, n * PAGE, adv);
	note(w, OP_MADVISE, -1, ret, ret ? errno : 0);
	if (!ret)
		r->hist |= adv == MADV_DONTNEED ? H_DONTNEED : H_MADV;
}

static void op_mprotect(struct worker *w)
{
	static const int prots[] = { PROT_READ, PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE,
				     PROT_NONE, PROT_WRITE, PROT_READ | PROT_EXEC, PROT_EXEC };
	struct region *r = any_region(w);
	int prot = prots[rnd(w, ARRAY_SIZE(prots))];
	long ret;

	if (!r)
		return;
	ret = mprotect(r->addr, r->len, prot);
	note(w, OP_MPROTECT, -1, ret, ret ? errno : 0);
	if (ret)
		return;
	expect(w, prot & PROT_EXEC, "mprotect(PROT_EXEC) of device memory succeeded");
	r->prot = prot;
	r->hist |= H_MPROTECT;
}

static void op_mremap(struct worker *w)
{
	struct region *r = any_region(w);
	__u64 pages, nlen;
	int flags = chance(w, 50) ? MREMAP_MAYMOVE : 0;
	void *m;

	if (!r)
		return;
	pages = r->len / PAGE;
	switch (rnd(w, 3)) {
	case 0:
		nlen = pages > 1 ? (1 + rnd(w, pages - 1)) * PAGE : r->len;
		break;
	case 1:
		nlen = r->len + PAGE * (1 + rnd(w, 16));
		break;
	default:
		nlen = r->len;
		break;
	}
	m = mremap(r->addr, r->len, nlen, flags);
	note(w, OP_MREMAP, -1, m == MAP_FAILED ? -1 : 0, m == MAP_FAILED ? errno : 0);
	if (m == MAP_FAILED)
		return;
	expect(w, nlen > r->len, "mremap grew a device mapping from %#llx to %#llx bytes",
	       (unsigned long long)r->len, (unsigned long long)nlen);
	if (m != r->addr || nlen != r->len)
		shared_drop(w, r);
	if (nlen > r->len && r->alloc >= 0) {
		int ix = r->alloc;

		r->alloc = -1;
		alloc_maybe_forget(w, ix);
	}
	if (m != r->addr)
		r->hist |= H_MOVED;
	if (nlen < r->len)
		r->hist |= H_SHRUNK;
	r->addr = m;
	r->len = nlen;
}

/* CPU access: a live allocation of this thread's own file must not fault, a freed one must. */
static void op_touch(struct worker *w)
{
	struct region *r = any_region(w);
	bool write = chance(w, 50), judged, zapped;
	__u64 off, len;
	struct dalloc *a;
	int sig;

	if (!r)
		return;
	off = rnd(w, r->len);
	len = 1 + rnd(w, 64);
	if (off + len > r->len)
		len = r->len - off;
	a = r->alloc >= 0 ? &w->allocs[r->alloc] : NULL;
	zapped = a && a->freed;
	sig = guarded_touch(r->addr + off, len, write, (__u8)rnd64(w));
	add(&sh->cpu[sig == 0 ? CPU_OK : sig == SIGBUS ? CPU_SIGBUS : CPU_SIGSEGV], 1);
	judged = a && a->reliable && (r->prot & (write ? PROT_WRITE : PROT_READ)) &&
		 (r->prot & PROT_READ);
	if (!judged)
		return;
	if (zapped)
		expect(w, sig != SIGBUS, "%s of a freed allocation's mapping: %s, not SIGBUS",
		       write ? "write" : "read", signame(sig));
	else if (sig)
		fail(w, F_CPU,
		     "%s at +%#llx of a live allocation's mapping (%#llx bytes; before:%s%s%s%s%s%s%s): %s",
		     write ? "write" : "read", (unsigned long long)off,
		     (unsigned long long)r->len, r->hist & H_DONTNEED ? " MADV_DONTNEED" : "",
		     r->hist & H_MADV ? " other madvise" : "", r->hist & H_SPLIT ? " split" : "",
		     r->hist & H_SHRUNK ? " shrunk" : "", r->hist & H_MPROTECT ? " mprotect" : "",
		     r->hist & H_MOVED ? " moved" : "", r->hist ? "" : " nothing",
		     signame(sig));
}

/* Closes and reopens the thread's own device file; its mappings keep the old file alive. */
static void op_churn(struct worker *w)
{
	int fd;

	if (chance(w, 50)) {
		fd = dup(w->priv);
		if (fd >= 0)
			close(fd);
		return;
	}
	fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	close(w->priv);
	w->priv = fd;
	w->gen++;
	for (int i = 0; i < MAX_REGS; i++)
		if (w->regs[i].used && w->regs[i].slot == DS_PRIV)
			w->regs[i].used = false;
	for (int i = 0; i < MAX_ALLOCS; i++)
		alloc_maybe_forget(w, i);
}

/* Clears or sets O_DIRECT on a scratch file's fd under the other threads' I/O. */
static void op_toggle(struct worker *w)
{
	int fk = chance(w, 50) ? FK_EXT4_RW : FK_XFS_RW;
	int fl = fcntl(zoo[fk], F_GETFL);

	if (fl < 0)
		return;
	if (fcntl(zoo[fk], F_SETFL, fl ^ O_DIRECT))
		return;
}

/* Truncates a scratch file, so that the file systems do not fill up. */
static void op_truncate(struct worker *w)
{
	int fk = chance(w, 50) ? FK_EXT4_RW : FK_XFS_RW;

	if (ftruncate(zoo[fk], rnd(w, SCRATCH_SPAN / 2 / BLK) * BLK))
		return;
}

/* --- fork ----------------------------------------------------------------------------------- */

static void run_ops(struct worker *w, __u64 max_ops);

static void child_main(struct worker *w, __u64 seed)
{
	struct region *r = any_region(w);
	__u8 *parent_map = r ? r->addr : NULL;
	int sig;

	w->child = true;
	w->rng = seed;
	/* Device mappings are not inherited: the parent's address is empty here. */
	if (parent_map) {
		sig = guarded_touch(parent_map, 1, false, 0);
		add(&sh->cpu[sig == 0 ? CPU_OK : sig == SIGBUS ? CPU_SIGBUS : CPU_SIGSEGV], 1);
		expect(w, sig != SIGSEGV, "fork child: parent's device mapping at %p: %s, not SIGSEGV",
		       parent_map, signame(sig));
	}
	memset(w->allocs, 0, sizeof(w->allocs));
	memset(w->regions, 0, sizeof(w->regions));
	memset(w->regs, 0, sizeof(w->regs));
	memset(w->kids, 0, sizeof(w->kids));
	/* The parent's ring is shared memory: the child makes its own. */
	uring_forget(w);
	w->priv = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	if (w->priv < 0)
		_exit(3);
	w->gen++;
	run_ops(w, 10 + rnd(w, 150));
	/* Leave everything to exit (mostly), or clean up first. */
	if (chance(w, 20))
		for (int i = 0; i < MAX_REGIONS; i++)
			if (w->regions[i].used)
				munmap(w->regions[i].addr, w->regions[i].len);
	_exit(0);
}

static void reap(struct worker *w, bool wait_all)
{
	for (int i = 0; i < MAX_KIDS; i++) {
		int status;
		pid_t p;

		if (!w->kids[i])
			continue;
		if (!wait_all && w->kid_kill[i] && now_ns() - w->kid_born[i] > 50000000ull)
			kill(w->kids[i], SIGKILL);
		p = waitpid(w->kids[i], &status, wait_all ? 0 : WNOHANG);
		if (p == 0)
			continue;
		if (p < 0) {
			char eb[24];

			fail(w, F_KIDS, "waitpid(%d): %s", w->kids[i], errname(errno, eb, sizeof(eb)));
		} else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
			add(&sh->kids_exited, 1);
		} else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && w->kid_kill[i]) {
			add(&sh->kids_killed, 1);
		} else {
			add(&sh->kids_bad, 1);
			fail(w, F_KIDS, "fork child %d: %s %d", w->kids[i],
			     WIFSIGNALED(status) ? "killed by signal" : "exit status",
			     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		}
		w->kids[i] = 0;
	}
}

static void op_fork(struct worker *w)
{
	__u64 seed = rnd64(w), t = now_ns();
	int i;
	pid_t p;

	if (w->child || t < w->next_fork)
		return;
	for (i = 0; i < MAX_KIDS && w->kids[i]; i++)
		;
	if (i == MAX_KIDS)
		return;
	w->next_fork = t + 500000000ull + rnd(w, 1000000000ull);
	w->kid_kill[i] = chance(w, 30);
	p = fork();
	if (p < 0)
		return;
	if (p == 0)
		child_main(w, seed);
	w->kids[i] = p;
	w->kid_born[i] = t;
	add(&sh->kids_started, 1);
}

/* --- the worker loop -------------------------------------------------------------------------- */

static void op_deregister(struct worker *w)
{
	op_reg_id(w, true);
}

static void op_reg_query(struct worker *w)
{
	op_reg_id(w, false);
}

static void op_read(struct worker *w)
{
	op_io(w, false);
}

static void op_write(struct worker *w)
{
	op_io(w, true);
}

static const struct {
	const char *name;
	int weight;
	void (*fn)(struct worker *w);
} wops[] = {
	{ "GET_VERSION", 2, op_version },
	{ "LIST_PROVIDERS", 3, op_list },
	{ "ALLOC", 12, op_alloc },
	{ "FREE", 8, op_free },
	{ "DMA_PROBE", 7, op_probe },
	{ "REGISTER", 7, op_register },
	{ "DEREGISTER", 4, op_deregister },
	{ "REG_QUERY", 4, op_reg_query },
	{ "READ", 9, op_read },
	{ "WRITE", 7, op_write },
	{ "STATS", 2, op_stats },
	{ "EXPORT_DMABUF", 3, op_export },
	{ "io_uring READ/WRITE", 6, op_uring },
	{ "bad command", 5, op_bad_cmd },
	{ "mmap", 6, op_mmap },
	{ "munmap", 4, op_munmap },
	{ "madvise", 3, op_madvise },
	{ "mprotect", 2, op_mprotect },
	{ "mremap", 2, op_mremap },
	{ "CPU access", 8, op_touch },
	{ "reopen", 1, op_churn },
	{ "O_DIRECT toggle", 1, op_toggle },
	{ "truncate", 1, op_truncate },
	{ "fork", 2, op_fork },
};

static void run_ops(struct worker *w, __u64 max_ops)
{
	int total = 0;

	for (size_t i = 0; i < ARRAY_SIZE(wops); i++)
		total += wops[i].weight;
	for (__u64 n = 0; n < max_ops; n++) {
		int r, k = 0;

		if (__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) || now_ns() >= t_deadline)
			break;
		reap(w, false);
		r = rnd(w, total);
		while (r >= wops[k].weight)
			r -= wops[k++].weight;
		if (!w->child) {
			__atomic_store_n(&sh->cur[w->id].op, k, __ATOMIC_RELAXED);
			__atomic_store_n(&sh->cur[w->id].since, now_ns(), __ATOMIC_RELAXED);
		}
		wops[k].fn(w);
		w->nops++;
		add(&sh->ops, 1);
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	run_ops(w, ~0ull);
	__atomic_store_n(&sh->cur[w->id].since, now_ns(), __ATOMIC_RELAXED);
	__atomic_store_n(&sh->cur[w->id].op, CUR_CLEANUP, __ATOMIC_RELAXED);
	for (int i = 0; i < MAX_REGIONS; i++)
		if (w->regions[i].used)
			region_unmap_all(w, &w->regions[i]);
	reap(w, true);
	if (w->ring_kind != RK_NONE) {
		/* Its last commands: reaped, or left to the ring's teardown. */
		if (chance(w, 50))
			uring_reap(w, true);
		if (w->ring_kind != RK_NONE)
			io_uring_queue_exit(&w->ring);
		uring_forget(w);
	}
	close(w->priv);
	munmap(w->zone, ZONE_LEN);
	__atomic_store_n(&sh->cur[w->id].op, CUR_DONE, __ATOMIC_RELAXED);
	return NULL;
}

/* Replaces the shared RACE_FD under the workers: dup2 over it, or close then reopen. */
static void *racer_main(void *arg)
{
	struct worker *w = arg;

	while (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && now_ns() < t_deadline) {
		int fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);

		if (fd < 0)
			break;
		if (chance(w, 30)) {
			struct p2pdirect_alloc a = { .provider = pick_provider(w),
						     .size = PAGE * (1 + rnd(w, 16)) };

			/* Something for the close to free. */
			long ret = ioctl(fd, P2PDIRECT_IOC_ALLOC, &a);

			note(w, OP_ALLOC, fd, ret, ret ? errno : 0);
		}
		sleep_ns(rnd(w, 20000000ull));
		if (chance(w, 25)) {
			close(RACE_FD);
			sleep_ns(rnd(w, 2000000ull));
		}
		dup2(fd, RACE_FD);
		close(fd);
	}
	return NULL;
}

static int claim_report(int who)
{
	int zero = 0;

	return __atomic_compare_exchange_n(&sh->reporting, &zero, who, false, __ATOMIC_SEQ_CST,
					   __ATOMIC_SEQ_CST);
}

static void print_counts(void)
{
	char eb[24];

	say("# %llu operations; per command and result:", (unsigned long long)sh->ops);
	for (int op = 0; op < NR_OPS; op++) {
		char line[400];
		int n;

		if (!sh->calls[op])
			continue;
		n = snprintf(line, sizeof(line), "#   %s: %llu calls;", op_name[op],
			     (unsigned long long)sh->calls[op]);
		for (int s = 0; s < NR_SLOTS && n < (int)sizeof(line) - 40; s++) {
			const char *name = s == 0 ? "ok" : s == SLOT_OTHER ? "other errno" :
				s == SLOT_BADRET ? "bad return" : errname(s, eb, sizeof(eb));

			if (sh->res[op][s])
				n += snprintf(line + n, sizeof(line) - n, " %s %llu", name,
					      (unsigned long long)sh->res[op][s]);
		}
		say("%s", line);
	}
	say("#   CPU access: %llu ok, %llu SIGBUS, %llu SIGSEGV",
	    (unsigned long long)sh->cpu[CPU_OK], (unsigned long long)sh->cpu[CPU_SIGBUS],
	    (unsigned long long)sh->cpu[CPU_SIGSEGV]);
	say("#   fork children: %llu started, %llu exited, %llu killed by the fuzzer, %llu otherwise",
	    (unsigned long long)sh->kids_started, (unsigned long long)sh->kids_exited,
	    (unsigned long long)sh->kids_killed, (unsigned long long)sh->kids_bad);
}

static struct worker workers[MAX_THREADS + 1];

static void *watchdog_main(void *arg)
{
	__u64 limit = t_deadline + GRACE_S * 1000000000ull;

	(void)arg;
	while (now_ns() < limit) {
		if (__atomic_load_n(&sh->reporting, __ATOMIC_SEQ_CST))
			return NULL;
		sleep_ns(200000000ull);
	}
	if (!claim_report(2))
		return NULL;
	say("# watchdog: the run did not end within %d s (--seconds %d + %d)", opt_seconds + GRACE_S,
	    opt_seconds, GRACE_S);
	say("#   main thread: %s", phase_name[__atomic_load_n(&sh->phase, __ATOMIC_RELAXED)]);
	for (int i = 0; i < opt_threads; i++) {
		int op = __atomic_load_n(&sh->cur[i].op, __ATOMIC_RELAXED);
		double secs = (now_ns() - sh->cur[i].since) / 1e9;

		if (op >= 0)
			say("#   thread %d: in %s for %.1f s", i, wops[op].name, secs);
		else if (op == CUR_CLEANUP)
			say("#   thread %d: unmapping, reaping, closing for %.1f s", i, secs);
		else
			say("#   thread %d: done", i);
	}
	print_counts();
	say("not ok 2 - the run ended by itself within --seconds + %d s (seed %llu)", GRACE_S,
	    (unsigned long long)opt_seed);
	say("1..2");
	klog("fuzz_test: seed %llu: watchdog fired\n", (unsigned long long)opt_seed);
	_exit(1);
}

/* --- setup and teardown ------------------------------------------------------------------------- */

struct gpu_save {
	char path[PATH_MAX];
	__u64 len;
	__u8 *data;
};

static struct gpu_save gsave[MAX_PROV];
static int ngsave;
static char setup_err[256];

static bool setup_failed(const char *what)
{
	snprintf(setup_err, sizeof(setup_err), "%s: %s", what, strerror(errno));
	return false;
}

static __u8 *map_resource(const char *path, __u64 len, int prot)
{
	int fd = open(path, prot & PROT_WRITE ? O_RDWR : O_RDONLY);
	void *m;

	if (fd < 0)
		return NULL;
	m = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
	close(fd);
	return m == MAP_FAILED ? NULL : m;
}

/* Saves every GPU BAR's content, so that it can be put back at the end. */
static bool save_gpus(void)
{
	for (__u32 i = 0; i < nprov; i++) {
		struct gpu_save *g = &gsave[ngsave];
		char bdf[32];
		__u8 *m;

		if (prov[i].kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		pci_name(prov[i].pci_addr, bdf, sizeof(bdf));
		snprintf(g->path, sizeof(g->path), "/sys/bus/pci/devices/%s/resource%u", bdf,
			 prov[i].bar);
		g->len = prov[i].bar_size;
		g->data = malloc(g->len);
		m = map_resource(g->path, g->len, PROT_READ);
		if (!g->data || !m)
			return setup_failed(g->path);
		memcpy(g->data, m, g->len);
		munmap(m, g->len);
		ngsave++;
		if (!pfn_map)
			pfn_map = map_resource(g->path, SHARED_MAP_LEN, PROT_READ);
	}
	return true;
}

/* Writes the saved content back; returns the bytes that still differ after it. */
static __u64 restore_gpus(void)
{
	__u64 bad = 0;

	for (int i = 0; i < ngsave; i++) {
		struct gpu_save *g = &gsave[i];
		__u8 *m = map_resource(g->path, g->len, PROT_READ | PROT_WRITE);

		if (!m) {
			say("# cannot map %s to restore it: %s", g->path, strerror(errno));
			bad += g->len;
			continue;
		}
		for (__u64 o = 0; o < g->len; o += PAGE)
			if (memcmp(m + o, g->data + o, PAGE))
				memcpy(m + o, g->data + o, PAGE);
		for (__u64 o = 0; o < g->len; o += PAGE) {
			if (!memcmp(m + o, g->data + o, PAGE))
				continue;
			for (__u64 k = o; k < o + PAGE; k++)
				bad += m[k] != g->data[k];
		}
		munmap(m, g->len);
	}
	return bad;
}

/*
 * A namespace by NSID, on the controller with that serial. Waits up to 10 s
 * for it: a suite before may just have rebound its controller, whose
 * namespaces then appear asynchronously.
 */
static int open_ns(unsigned long nsid, const char *serial, int flags)
{
	char ns[64], ser[32];

	for (int tries = 0; tries < 100; tries++) {
		if (find_nvme_nsid(nsid, ns, sizeof(ns), ser)) {
			int fd;

			if (strncmp(ser, serial, strlen(serial)))
				break;
			fd = open(ns, flags | O_CLOEXEC);
			if (fd >= 0 || errno != ENOENT)
				return fd;
		}
		sleep_ns(100000000ull);
	}
	errno = ENODEV;
	return -1;
}

static bool setup(void)
{
	struct p2pdirect_list_providers l = { .capacity = MAX_PROV };
	struct p2pdirect_version v;
	int pipefd[2], sv[2], fd;
	char ns[64], pci[PATH_MAX], path[PATH_MAX + 32];

	shared_dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	second_dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	if (shared_dev < 0 || second_dev < 0)
		return setup_failed(DEV_PATH);
	l.entries = (uintptr_t)prov;
	if (ioctl(shared_dev, P2PDIRECT_IOC_LIST_PROVIDERS, &l))
		return setup_failed("LIST_PROVIDERS");
	nprov = l.count < MAX_PROV ? l.count : MAX_PROV;
	if (ioctl(shared_dev, P2PDIRECT_IOC_GET_VERSION, &v))
		return setup_failed("GET_VERSION");
	abi_minor = v.abi_minor;
	if (!nprov) {
		errno = ENODEV;
		return setup_failed("no providers");
	}

	/* Namespaces first, so that no later fd number can ever be one. */
	zoo[FK_NS1_RW] = open_ns(1, "p2pnvme-sw", O_RDWR | O_DIRECT);
	zoo[FK_NS4_RW] = open_ns(4, "p2pnvme-rp", O_RDWR | O_DIRECT);
	zoo[FK_NS1_RO] = open_ns(1, "p2pnvme-sw", O_RDONLY | O_DIRECT);
	zoo[FK_NS1_WO] = open_ns(1, "p2pnvme-sw", O_WRONLY | O_DIRECT);
	zoo[FK_NS4_RO] = open_ns(4, "p2pnvme-rp", O_RDONLY | O_DIRECT);
	zoo[FK_NS1_BUF] = open_ns(1, "p2pnvme-sw", O_RDONLY);
	zoo[FK_NS2_RO] = open_ns(2, "p2pnvme-sw", O_RDONLY | O_DIRECT);
	zoo[FK_NS3_RO] = open_ns(3, "p2pnvme-sw", O_RDONLY | O_DIRECT);
	for (int fk = FK_NS1_RW; fk <= FK_NS3_RO; fk++)
		if (zoo[fk] < 0)
			return setup_failed("opening the NVMe namespaces");
	if (ioctl(zoo[FK_NS1_RW], BLKGETSIZE64, &ns_size[0]) ||
	    ioctl(zoo[FK_NS4_RW], BLKGETSIZE64, &ns_size[1]))
		return setup_failed("BLKGETSIZE64");
	for (int i = 0; i < 2; i++) {
		if (ns_size[i] > SAFE_HI)
			ns_size[i] = SAFE_HI;
		if (ns_size[i] < SAFE_LO + 8 * MiB) {
			errno = ENOSPC;
			return setup_failed("namespace smaller than 208 MiB");
		}
	}

	for (int i = 0; i < 2; i++) {
		snprintf(scratch_path[i], sizeof(scratch_path[i]), "/mnt/%s/fuzz-%d.bin",
			 i ? "xfs" : "ext4", getpid());
		fd = open(scratch_path[i], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
		if (fd < 0)
			return setup_failed(scratch_path[i]);
		zoo[i ? FK_XFS_RW : FK_EXT4_RW] = fd;
		/* A hole, then an unwritten extent: READs of both are zeroed by the CPU. */
		if (ftruncate(fd, 8 * MiB) || fallocate(fd, 0, 4 * MiB, 2 * MiB))
			return setup_failed("preparing the scratch files");
	}
	zoo[FK_EXT4_RO] = open(scratch_path[0], O_RDONLY | O_DIRECT | O_CLOEXEC);
	zoo[FK_XFS_RO] = open(scratch_path[1], O_RDONLY | O_DIRECT | O_CLOEXEC);
	zoo[FK_EXT4_WO] = open(scratch_path[0], O_WRONLY | O_DIRECT | O_CLOEXEC);
	zoo[FK_XFS_APPEND] = open(scratch_path[1], O_WRONLY | O_APPEND | O_DIRECT | O_CLOEXEC);
	zoo[FK_EXT4_BUF] = open(scratch_path[0], O_RDWR | O_CLOEXEC);
	zoo[FK_TMPFS] = open("/tmp/fuzz-tmpfs.bin", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	zoo[FK_PROC] = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	zoo[FK_DEVNULL] = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (pipe2(pipefd, O_CLOEXEC) || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return setup_failed("pipe/socketpair");
	zoo[FK_PIPE_R] = pipefd[0];
	zoo[FK_PIPE_W] = pipefd[1];
	zoo[FK_SOCK] = sv[0];
	zoo[FK_DIR] = open("/mnt/ext4", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	zoo[FK_MEMFD] = memfd_create("fuzz", MFD_CLOEXEC);
	zoo[FK_EPOLL] = epoll_create1(EPOLL_CLOEXEC);
	zoo[FK_EVENTFD] = eventfd(0, EFD_CLOEXEC);
	zoo[FK_DEV_SHARED] = shared_dev;
	zoo[FK_DEV_SECOND] = second_dev;
	zoo[FK_DEV_RDONLY] = open(DEV_PATH, O_RDONLY | O_CLOEXEC);
	zoo[FK_CLOSED] = CLOSED_FD;
	for (int fk = FK_EXT4_RO; fk <= FK_DEV_RDONLY; fk++)
		if (zoo[fk] < 0)
			return setup_failed("opening the fds of other kinds");
	if (dup2(zoo[FK_DEVNULL], CLOSED_FD) != CLOSED_FD || close(CLOSED_FD))
		return setup_failed("dup2 for the closed fd");
	fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0 || dup2(fd, RACE_FD) != RACE_FD)
		return setup_failed("the race fd");
	close(fd);

	/* Shared device pointers of other kinds. */
	if (ftruncate(zoo[FK_TMPFS], SHARED_MAP_LEN))
		return setup_failed("tmpfs file");
	tmpfs_map = mmap(NULL, SHARED_MAP_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, zoo[FK_TMPFS],
			 0);
	if (tmpfs_map == MAP_FAILED)
		return setup_failed("mmap of a tmpfs file");
	if (find_nvme("p2pnvme-sw", ns, sizeof(ns), pci)) {
		snprintf(path, sizeof(path), "%s/p2pmem/allocate", pci);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0) {
			cmb_map = mmap(NULL, SHARED_MAP_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
				       0);
			if (cmb_map == MAP_FAILED)
				cmb_map = NULL;
			close(fd);
		}
	}
	if (!cmb_map)
		say("# no mapping of the NVMe CMB (p2pmem/allocate): those pointers fall back to RAM");
	return save_gpus();
}

static void teardown(void)
{
	close(RACE_FD);
	if (cmb_map)
		munmap(cmb_map, SHARED_MAP_LEN);
	if (pfn_map)
		munmap(pfn_map, SHARED_MAP_LEN);
	munmap(tmpfs_map, SHARED_MAP_LEN);
	for (int fk = 0; fk < NR_FK; fk++)
		if (fk != FK_CLOSED && fk != FK_BAD && fk != FK_DEV_RACE && zoo[fk] >= 0)
			close(zoo[fk]);
	for (int i = 0; i < 2; i++)
		unlink(scratch_path[i]);
	unlink("/tmp/fuzz-tmpfs.bin");
}

/* After the last close: bytes_used of every provider, summed (polled up to 10 s). */
static __u64 used_after_close(__u64 *pinned)
{
	struct p2pdirect_provider_info now[MAX_PROV];
	struct p2pdirect_stat st[64];
	__u64 used = ~0ull;

	*pinned = ~0ull;
	for (int tries = 0; tries < 100; tries++) {
		struct p2pdirect_list_providers l = { .entries = (uintptr_t)now,
						      .capacity = MAX_PROV };
		struct p2pdirect_stats s = { .entries = (uintptr_t)st, .capacity = 64 };
		int fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);

		if (fd < 0)
			return used;
		if (!ioctl(fd, P2PDIRECT_IOC_LIST_PROVIDERS, &l)) {
			used = 0;
			for (__u32 i = 0; i < l.count && i < MAX_PROV; i++)
				used += now[i].bytes_used;
		}
		if (!ioctl(fd, P2PDIRECT_IOC_STATS, &s)) {
			*pinned = 0;
			for (__u32 i = 0; i < s.count && i < 64; i++)
				if (st[i].kind == P2PDIRECT_STAT_PROVIDER)
					*pinned += st[i].pinned_bytes;
		}
		close(fd);
		if (!used && !*pinned)
			break;
		sleep_ns(100000000ull);
	}
	return used;
}

static void bad_args(const char *prog)
{
	fprintf(stderr, "usage: %s [--seed N] [--seconds S] [--threads T] [--trace]\n", prog);
	exit(2);
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	pthread_t wd, racer;
	__u64 used, pinned, bad, t, t_end;
	struct timespec ts;
	int n = 0, fails = 0;
	bool ok_setup;

	clock_gettime(CLOCK_REALTIME, &ts);
	opt_seed = ((__u64)ts.tv_sec * 1000003ull) ^ (__u64)ts.tv_nsec ^ ((__u64)getpid() << 32);
	opt_seed &= 0xffffffffffffull;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			opt_seed = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			opt_seconds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			opt_threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--trace"))
			opt_trace = 1;
		else
			bad_args(argv[0]);
	}
	if (opt_seconds < 1 || opt_threads < 1 || opt_threads > MAX_THREADS)
		bad_args(argv[0]);
	say("# fuzz seed %llu; replay: fuzz_test --seed %llu --seconds %d --threads %d",
	    (unsigned long long)opt_seed, (unsigned long long)opt_seed, opt_seconds, opt_threads);
	klog("fuzz_test: seed %llu, %d s, %d threads (replay: fuzz_test --seed %llu --seconds %d --threads %d)\n",
	     (unsigned long long)opt_seed, opt_seconds, opt_threads, (unsigned long long)opt_seed,
	     opt_seconds, opt_threads);

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		say("not ok 1 - setup: shared counters: %s", strerror(errno));
		say("1..1");
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	ok_setup = setup();
	say("%s %d - setup: %u providers, namespaces 1-4, scratch files, fds of every kind, GPU memory saved%s%s",
	    ok_setup ? "ok" : "not ok", ++n, nprov, ok_setup ? "" : ": ", setup_err);
	if (!ok_setup) {
		say("1..1");
		return 1;
	}

	t_start = now_ns();
	t_deadline = t_start + (__u64)opt_seconds * 1000000000ull;
	pthread_create(&wd, NULL, watchdog_main, NULL);
	for (int i = 0; i <= opt_threads; i++) {
		struct worker *w = &workers[i];
		__u64 s = opt_seed + 0x1000ull * (i + 1);

		w->id = i;
		w->rng = splitmix(&s);
		w->zone = mmap(NULL, ZONE_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
		w->priv = open(DEV_PATH, O_RDWR | O_CLOEXEC);
		if (w->zone == MAP_FAILED || w->priv < 0) {
			say("# worker %d: %s", i, strerror(errno));
			abort();
		}
		mprotect(w->zone + Z_SCRIBBLE, SCRIBBLE_LEN, PROT_READ | PROT_WRITE);
		mprotect(w->zone + Z_RO, PAGE, PROT_READ);
		mprotect(w->zone + Z_ARG, PAGE, PROT_READ | PROT_WRITE);
		mprotect(w->zone + Z_RAM, RAM_LEN, PROT_READ | PROT_WRITE);
		memset(w->zone + Z_RAM, 0x5a, RAM_LEN);
		if (i < opt_threads)
			pthread_create(&w->thread, NULL, worker_main, w);
	}
	pthread_create(&racer, NULL, racer_main, &workers[opt_threads]);

	while (now_ns() < t_deadline)
		sleep_ns(100000000ull);
	__atomic_store_n(&sh->stop, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&sh->phase, PH_JOIN, __ATOMIC_RELAXED);
	for (int i = 0; i < opt_threads; i++)
		pthread_join(workers[i].thread, NULL);
	pthread_join(racer, NULL);
	t = now_ns();
	__atomic_store_n(&sh->phase, PH_CLOSE, __ATOMIC_RELAXED);
	close(workers[opt_threads].priv);
	teardown();
	__atomic_store_n(&sh->phase, PH_USED, __ATOMIC_RELAXED);
	used = used_after_close(&pinned);
	__atomic_store_n(&sh->phase, PH_RESTORE, __ATOMIC_RELAXED);
	bad = restore_gpus();
	t_end = now_ns();
	if (!claim_report(1)) {
		/* The watchdog is reporting. */
		pause();
	}
	pthread_join(wd, NULL);

	say("# ran %.1f s, %d threads; threads joined %.1f s after the deadline, all closed and checked after %.1f s more",
	    (t - t_start) / 1e9, opt_threads, ((__s64)(t - t_deadline)) / 1e9,
	    (t_end - t) / 1e9);
	print_counts();
	fails += !!sh->fails[F_ERRNO];
	say("%s %d - every ioctl returned 0 or -1 with an allowed errno (%llu failures)",
	    sh->fails[F_ERRNO] ? "not ok" : "ok", ++n, (unsigned long long)sh->fails[F_ERRNO]);
	fails += !!sh->fails[F_MM_ERRNO];
	say("%s %d - mmap, munmap, madvise, mprotect, mremap of device memory: allowed errnos (%llu failures)",
	    sh->fails[F_MM_ERRNO] ? "not ok" : "ok", ++n,
	    (unsigned long long)sh->fails[F_MM_ERRNO]);
	fails += !!sh->fails[F_ORACLE];
	say("%s %d - nothing succeeded that the ABI says must fail, and successes returned sane values (%llu failures)",
	    sh->fails[F_ORACLE] ? "not ok" : "ok", ++n, (unsigned long long)sh->fails[F_ORACLE]);
	fails += !!sh->fails[F_CPU];
	say("%s %d - CPU access to a live allocation's mapping never faulted (%llu failures)",
	    sh->fails[F_CPU] ? "not ok" : "ok", ++n, (unsigned long long)sh->fails[F_CPU]);
	fails += !!sh->fails[F_KIDS];
	say("%s %d - fork children (%llu) exited normally or by the fuzzer's SIGKILL",
	    sh->fails[F_KIDS] ? "not ok" : "ok", ++n, (unsigned long long)sh->kids_started);
	fails += t_end - t_deadline > GRACE_S * 1000000000ull;
	say("%s %d - the run ended by itself within --seconds + %d s",
	    t_end - t_deadline > GRACE_S * 1000000000ull ? "not ok" : "ok", ++n, GRACE_S);
	fails += used != 0;
	say("%s %d - after the last close no device memory is in use (bytes_used %llu)",
	    used ? "not ok" : "ok", ++n, (unsigned long long)used);
	fails += pinned != 0;
	say("%s %d - after the last close no device memory is pinned (STATS pinned_bytes %llu)",
	    pinned ? "not ok" : "ok", ++n, (unsigned long long)pinned);
	fails += bad != 0;
	say("%s %d - the emulated GPUs' memory is back as the fuzzer found it (%llu bytes differ)",
	    bad ? "not ok" : "ok", ++n, (unsigned long long)bad);
	say("1..%d", n);
	say("# fuzz seed %llu: %s", (unsigned long long)opt_seed, fails ? "FAILED" : "passed");
	klog("fuzz_test: seed %llu done: %s\n", (unsigned long long)opt_seed,
	     fails ? "FAILED" : "passed");
	return fails ? 1 : 0;
}
