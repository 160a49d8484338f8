// SPDX-License-Identifier: GPL-2.0
/*
 * Fault-injection tests of /dev/p2pdirect (kselftest harness, TAP on stdout):
 *  - device errors in the middle of a multi-bio READ and WRITE on a raw
 *    namespace (fail_make_request scoped to the disk): the partial-transfer
 *    rule of the UAPI header, and nothing outside the range touched;
 *  - allocation failures inside every command, the io_uring READ and WRITE
 *    commands among them (failslab and fail_page_alloc through
 *    /proc/thread-self/fail-nth: only allocations with the module on the
 *    call stack, then every allocation of the system call): success or the
 *    documented errno, no half state, no leak;
 *  - an NVMe controller reset during READs and WRITEs;
 *  - the GPU unbound from p2pdirect during pointer and registered READs;
 *  - rmmod while /dev/p2pdirect is open, while a mapping lives and during
 *    I/O (last: an unload that succeeds takes the module away under us).
 *
 * Regions of NSID 1 (raw, on the controller behind the switch) this suite
 * owns, all in [160M, 192M):
 *   [160M, 164M)  device error: READ source
 *   [164M, 169M)  device error: WRITE target [165M, 168M), guards around it
 *   [169M, 174M)  device error with cached pages: WRITE target [170M, 173M)
 *   [174M, 179M)  device error in the first bio: WRITE target [175M, 178M)
 *   [180M, 184M)  allocation failures: READ source [180M, 181M), WRITE
 *                 target [182M, 183M), guards around it
 *   [184M, 189M)  controller reset: a 1 MiB slice per thread, every 2 MiB
 *   [190M, 191M)  GPU unbind: READ source
 *   [191M, 192M)  rmmod: READ source
 * Device memory the tests write is reported to the host as storage_test does
 * (ci/hostcheck.py replays the records in order, the last writer wins):
 *   # HOSTCHECK gpu=BDF off=N len=N (fill=S pos=P | ns=NSID nsoff=N | zero) guard=N
 *   # NVMECHECK ns=NSID off=N len=N fill=S pos=P
 * Every (command, N, result) of the allocation-failure loops is a TAP
 * comment. The suite-wide kmemleak scan at teardown finds leaks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/p2pdirect.h>
#include <liburing.h>

#include "kselftest_harness.h"
#include "nvme_util.h"

#define DEV_PATH "/dev/p2pdirect"
#define MODULE_NAME "p2pdirect"
#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GUARD (64 * KiB)	/* device memory around the usable part */
#define LBS 512ull		/* logical block size of the test namespaces */
#define DEBUGFS "/sys/kernel/debug/"

/* NSID 1 regions (see the top of the file) and the fill seeds written there. */
#define A_READ_POS (160 * MiB)
#define A_READ_LEN (4 * MiB)
#define A_WRITE_POS (165 * MiB)
#define A_WRITE_LEN (3 * MiB)
#define A_CACHE_POS (170 * MiB)
#define A_CACHE_LEN (3 * MiB)
#define A_FIRST_POS (175 * MiB)
#define NS_GUARD MiB		/* namespace bytes checked on each side of a WRITE */
#define B_READ_POS (180 * MiB)
#define B_WRITE_POS (182 * MiB)
#define B_LEN MiB
#define C_POS (184 * MiB)
#define C_STRIDE (2 * MiB)
#define C_LEN MiB
#define D_POS (190 * MiB)
#define D_LEN MiB
#define E_POS (191 * MiB)
#define E_LEN MiB

#define SEED_A_READ 0xfa1
#define SEED_A_OLD 0xfa2
#define SEED_A_NEW 0xfa3
#define SEED_A_CACHE_OLD 0xfa4
#define SEED_A_CACHE_NEW 0xfa5
#define SEED_B_READ 0xfb1
#define SEED_B_OLD 0xfb2
#define SEED_B_NEW 0xfb3
#define SEED_C 0xfc00
#define SEED_D 0xfd1
#define SEED_E 0xfe1
#define SEED_MEM_OLD 0xf0f	/* device memory before an I/O into it */

/* --- small helpers --------------------------------------------------------- */

static const char *ename(int e)
{
	const char *s = strerrorname_np(e < 0 ? -e : e);

	return s ? s : "E?";
}

static int sysfs_read(const char *path, char *buf, size_t len)
{
	return nvme_read_attr(path, buf, len) ? 0 : -ENOENT;
}

static long long sysfs_ll(const char *path)
{
	char buf[64];

	if (sysfs_read(path, buf, sizeof(buf)))
		return -1;
	return strtoll(buf, NULL, 0);
}

/* A kernel address or size from sysfs ("0xffff..."); 0 if unreadable. */
static unsigned long long sysfs_ull(const char *path)
{
	char buf[64];

	if (sysfs_read(path, buf, sizeof(buf)))
		return 0;
	return strtoull(buf, NULL, 0);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned int ms)
{
	usleep(ms * 1000);
}

static __u64 nonzero(const __u8 *p, __u64 len)
{
	__u64 n = 0;

	for (__u64 i = 0; i < len; i++)
		n += p[i] != 0;
	return n;
}

/* A CPU access of @p: 0, or the signal it raised (SIGBUS after a revoke). */
static sigjmp_buf fault_jmp;

static void on_fault(int sig)
{
	siglongjmp(fault_jmp, sig);
}

static int touch(const __u8 *p)
{
	int sig;

	signal(SIGBUS, on_fault);
	signal(SIGSEGV, on_fault);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig)
		(void)__atomic_load_n(p, __ATOMIC_RELAXED);
	signal(SIGBUS, SIG_DFL);
	signal(SIGSEGV, SIG_DFL);
	return sig;
}

/* --- the namespace from RAM ------------------------------------------------ */

/* Writes fill(seed) with pattern position = byte offset to [off, off + len). */
static int ns_fill(int fd, __u64 off, __u64 len, __u64 seed)
{
	void *buf;
	ssize_t n;

	if (posix_memalign(&buf, 4096, len))
		return -ENOMEM;
	fill_buf(buf, len, off, seed);
	n = pwrite(fd, buf, len, off);
	free(buf);
	if (n < 0)
		return -errno;
	return n == (ssize_t)len ? 0 : -EIO;
}

/* Reads [off, off + len) of @fd into a new buffer (O_DIRECT needs alignment). */
static __u8 *ns_read(int fd, __u64 off, __u64 len)
{
	void *buf;

	if (posix_memalign(&buf, 4096, len))
		return NULL;
	if (pread(fd, buf, len, off) != (ssize_t)len) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* Bytes of [off, off + len) of @fd that differ from fill(seed); ~0 if unreadable. */
static __u64 ns_diff(int fd, __u64 off, __u64 len, __u64 seed)
{
	__u8 *buf = ns_read(fd, off, len);
	__u64 bad;

	if (!buf)
		return ~0ull;
	bad = fill_diff(buf, len, off, seed);
	free(buf);
	return bad;
}

static void rec_nvme(__u64 off, __u64 len, __u64 seed)
{
	printf("# NVMECHECK ns=1 off=%llu len=%llu fill=%llu pos=%llu\n",
	       (unsigned long long)off, (unsigned long long)len, (unsigned long long)seed,
	       (unsigned long long)off);
}

/* --- device memory --------------------------------------------------------- */

struct gpu {
	__u32 index;		/* provider index */
	__u32 pci;		/* P2PDIRECT_PCI_ADDR */
	char bdf[32];
};

static int list(int dev, struct p2pdirect_provider_info *p, unsigned int cap)
{
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = cap };

	if (ioctl(dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return -errno;
	return req.count;
}

/* The provider of PCI function @pci now (its index changes when it is rebound). */
static int provider_of(int dev, __u32 pci, struct p2pdirect_provider_info *out)
{
	struct p2pdirect_provider_info p[8];
	int n = list(dev, p, 8);

	for (int i = 0; i < n && i < 8; i++) {
		if (p[i].pci_addr == pci && p[i].kind == P2PDIRECT_PROVIDER_BAR) {
			*out = p[i];
			return 0;
		}
	}
	return n < 0 ? n : -ENOENT;
}

/* The first two providers p2pdirect registered itself: the emulated GPUs. */
static int find_gpus(int dev, struct gpu *gpu)
{
	struct p2pdirect_provider_info p[8];
	int n = list(dev, p, 8), g = 0;

	for (int i = 0; i < n && i < 8 && g < 2; i++) {
		if (p[i].kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		gpu[g].index = p[i].index;
		gpu[g].pci = p[i].pci_addr;
		pci_name(p[i].pci_addr, gpu[g].bdf, sizeof(gpu[g].bdf));
		g++;
	}
	return g;
}

/* ALLOC alone, for a call under fault injection: nothing else in between. */
static int alloc_only(int dev, const struct gpu *g, __u64 size, struct p2pdirect_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->provider = g->index;
	a->size = size;
	return ioctl(dev, P2PDIRECT_IOC_ALLOC, a) ? -errno : 0;
}

/* ALLOC zeroes the memory: every ALLOC is a write the host must know of. */
static int do_alloc(int dev, const struct gpu *g, __u64 size, struct p2pdirect_alloc *a)
{
	int r = alloc_only(dev, g, size, a);

	if (!r)
		record_alloc_zero(dev, a);
	return r;
}

static int do_free(int dev, __u64 handle)
{
	struct p2pdirect_free f = { .handle = handle };

	return ioctl(dev, P2PDIRECT_IOC_FREE, &f) ? -errno : 0;
}

static void *map(int dev, const struct p2pdirect_alloc *a)
{
	return mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, dev, a->mmap_offset);
}

static int do_register(int dev, void *p, __u64 size, __u32 flags, __u64 *id)
{
	struct p2pdirect_register r = { .addr = (uintptr_t)p, .size = size, .flags = flags };

	if (ioctl(dev, P2PDIRECT_IOC_REGISTER, &r))
		return -errno;
	*id = r.id;
	return 0;
}

/* REG_QUERY (@dereg false) or DEREGISTER: the state, or -errno. */
static int reg_op(int dev, __u64 id, bool dereg)
{
	struct p2pdirect_reg_id q = { .id = id };

	if (ioctl(dev, dereg ? P2PDIRECT_IOC_DEREGISTER : P2PDIRECT_IOC_REG_QUERY, &q))
		return -errno;
	return q.state;
}

/* Device memory pinned now on the provider of @pci (STATS), 0 without a row. */
static long long pinned(int dev, __u32 pci)
{
	struct p2pdirect_stat rows[32];
	struct p2pdirect_stats req = { .entries = (uintptr_t)rows, .capacity = 32 };

	if (ioctl(dev, P2PDIRECT_IOC_STATS, &req))
		return -errno;
	for (unsigned int i = 0; i < req.count && i < 32; i++)
		if (rows[i].kind == P2PDIRECT_STAT_PROVIDER && rows[i].id == pci)
			return rows[i].pinned_bytes;
	return 0;
}

/* An allocation of device memory, mapped, with GUARD bytes on each side. */
struct dbuf {
	struct p2pdirect_alloc a;
	__u8 *map;		/* whole allocation */
	__u8 *p;		/* usable part, after the front guard */
	__u64 len;		/* usable bytes */
	const struct gpu *g;
};

/* A new allocation, all zero (and the host told so). */
static int dbuf_new(int dev, const struct gpu *g, __u64 len, struct dbuf *b)
{
	int r;

	memset(b, 0, sizeof(*b));
	r = do_alloc(dev, g, len + 2 * GUARD, &b->a);
	if (r)
		return r;
	b->map = map(dev, &b->a);
	if (b->map == MAP_FAILED)
		return -errno;
	b->p = b->map + GUARD;
	b->len = len;
	b->g = g;
	/* ALLOC zeroed it (and do_alloc() told the host). */
	return nonzero(b->map, b->a.size) ? -EIO : 0;
}

static int dbuf_free(int dev, struct dbuf *b)
{
	munmap(b->map, b->a.size);
	return do_free(dev, b->a.handle);
}

/* Offset in the GPU's memory of byte @off of the usable part. */
static __u64 gpu_off(const struct dbuf *b, __u64 off)
{
	return b->a.provider_offset + GUARD + off;
}

/* The whole allocation, guards included, gets fill(seed) at pattern position = its offset. */
static void dbuf_fill_all(struct dbuf *b, __u64 seed)
{
	fill_buf(b->map, b->a.size, 0, seed);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu fill=%llu pos=0 guard=0\n", b->g->bdf,
	       (unsigned long long)b->a.provider_offset, (unsigned long long)b->a.size,
	       (unsigned long long)seed);
}

static void rec_fill(const struct dbuf *b, __u64 off, __u64 len, __u64 seed, __u64 pos)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu fill=%llu pos=%llu guard=0\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len,
	       (unsigned long long)seed, (unsigned long long)pos);
}

static void rec_ns(const struct dbuf *b, __u64 off, __u64 len, __u64 nsoff, __u64 guard)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu ns=1 nsoff=%llu guard=%llu\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len,
	       (unsigned long long)nsoff, (unsigned long long)guard);
}

/* Zeroes [off, off + len) of the usable part with the CPU, and tells the host. */
static void zero_rec(struct dbuf *b, __u64 off, __u64 len)
{
	memset(b->p + off, 0, len);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len);
}

static int rw(int dev, bool write, int fd, __u32 flags, __u64 addr, __u64 size, __u64 foff,
	      __u64 boff, struct p2pdirect_io *out)
{
	struct p2pdirect_io io = {
		.fd = fd, .flags = flags, .addr = addr, .size = size,
		.file_offset = foff, .buf_offset = boff,
	};
	int r = ioctl(dev, write ? P2PDIRECT_IOC_WRITE : P2PDIRECT_IOC_READ, &io) ? -errno : 0;

	if (out)
		*out = io;
	return r;
}

/* --- fixture --------------------------------------------------------------- */

FIXTURE(ft) {
	int dev;
	struct gpu gpu[2];
	char ns1[64];		/* /dev/NODE of NSID 1 */
	char disk[32];		/* NODE: its /sys/block entry */
	char ctrl[32];		/* its controller, nvmeX */
	__u64 maxbio;		/* the most bytes one bio to it carries */
};

/* NSID 1's node and its controller's name. */
static int find_ns1(char *ns, size_t ns_len, char *ctrl, size_t ctrl_len)
{
	int found = 0;
	glob_t g;

	if (glob("/sys/class/nvme/nvme*", 0, NULL, &g))
		return 0;
	for (size_t i = 0; i < g.gl_pathc && !found; i++) {
		if (!nvme_ctrl_ns(g.gl_pathv[i], 1, ns, ns_len))
			continue;
		snprintf(ctrl, ctrl_len, "%s", strrchr(g.gl_pathv[i], '/') + 1);
		found = 1;
	}
	globfree(&g);
	return found;
}

FIXTURE_SETUP(ft)
{
	char path[PATH_MAX];
	long long kb, segs;

	/* Records reach the host line by line, and forks never duplicate them. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	self->dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("open %s: %s", DEV_PATH, strerror(errno));
	ASSERT_EQ(2, find_gpus(self->dev, self->gpu)) TH_LOG("need two emulated GPUs");
	ASSERT_TRUE(find_ns1(self->ns1, sizeof(self->ns1), self->ctrl, sizeof(self->ctrl)));
	snprintf(self->disk, sizeof(self->disk), "%s", strrchr(self->ns1, '/') + 1);
	snprintf(path, sizeof(path), "/sys/block/%s/queue/max_sectors_kb", self->disk);
	kb = sysfs_ll(path);
	snprintf(path, sizeof(path), "/sys/block/%s/queue/max_segments", self->disk);
	segs = sysfs_ll(path);
	ASSERT_GT(kb, 0);
	ASSERT_GT(segs, 0);
	self->maxbio = (__u64)kb * KiB;
	if ((__u64)segs * 4096 < self->maxbio)
		self->maxbio = (__u64)segs * 4096;
}

FIXTURE_TEARDOWN(ft)
{
	close(self->dev);
}

/* --- a: device errors in the middle of a READ or WRITE ---------------------- */

/*
 * fail_make_request, for bios to @disk only: with times=1 and space=S the
 * first bio that finds no more than its own size left of S bytes fails with
 * EIO at submission (it never reaches the device); the bios before it pass
 * and so do those after it. With every bio at most maxbio bytes and
 * S = 2 * maxbio + 1, at least two bios pass and the good prefix P (the
 * bytes before the failed bio) satisfies S - maxbio <= P < S.
 */
static int fmr(const char *attr, const char *val)
{
	char path[128];

	snprintf(path, sizeof(path), DEBUGFS "fail_make_request/%s", attr);
	return sysfs_write(path, val);
}

static int fmr_arm(const char *disk, __u64 space)
{
	char path[PATH_MAX], v[32];
	int r;

	snprintf(v, sizeof(v), "%llu", (unsigned long long)space);
	r = fmr("verbose", "0") ?: fmr("task-filter", "N") ?: fmr("interval", "1") ?:
	    fmr("times", "1") ?: fmr("space", v) ?: fmr("probability", "100");
	if (r)
		return r;
	snprintf(path, sizeof(path), "/sys/block/%s/make-it-fail", disk);
	return sysfs_write(path, "1");
}

/* Turns it off; returns the failures it had left (0: the one was injected). */
static long long fmr_disarm(const char *disk)
{
	char path[PATH_MAX];
	long long left = sysfs_ll(DEBUGFS "fail_make_request/times");

	snprintf(path, sizeof(path), "/sys/block/%s/make-it-fail", disk);
	sysfs_write(path, "0");
	fmr("probability", "0");
	fmr("space", "0");
	return left;
}

/*
 * A READ of 4 MiB from NSID 1 whose third-or-so bio fails: the call succeeds
 * with the good prefix (pread's rule, as the UAPI header documents it), the
 * prefix holds the namespace's data, the first block of the failed bio and
 * the memory around the range still hold what was there before.
 */
TEST_F_TIMEOUT(ft, a1_device_error_mid_read, 120)
{
	__u64 space = 2 * self->maxbio + 1, len = A_READ_LEN, pos = A_READ_POS, got;
	struct p2pdirect_io out;
	struct dbuf b;
	long long left;
	int fd, r;

	ASSERT_GE(len, 4 * self->maxbio) TH_LOG("bios of %llu bytes: too few in %llu",
						 self->maxbio, len);
	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ns_fill(fd, pos, len, SEED_A_READ));
	rec_nvme(pos, len, SEED_A_READ);
	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	dbuf_fill_all(&b, SEED_MEM_OLD);

	ASSERT_EQ(0, fmr_arm(self->disk, space));
	r = rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, pos, 0, &out);
	left = fmr_disarm(self->disk);
	got = out.bytes;
	TH_LOG("READ %llu bytes, bios <= %llu, space %llu: %s, %llu bytes", len, self->maxbio,
	       space, r ? ename(r) : "success", got);
	ASSERT_EQ(0, left) TH_LOG("no bio failed: the fault was not injected");
	ASSERT_EQ(0, r) TH_LOG("a device error after a good prefix must report the prefix");
	ASSERT_LT(got, len);
	EXPECT_EQ(0u, got % LBS);
	EXPECT_LT(got, space);
	EXPECT_GE(got + self->maxbio, space);
	EXPECT_EQ(got, out.p2p_bytes);
	/* The prefix arrived; the failed bio's first block and the guards did not change. */
	EXPECT_EQ(0u, fill_diff(b.p, got, pos, SEED_A_READ));
	EXPECT_EQ(0u, fill_diff(b.p + got, LBS, GUARD + got, SEED_MEM_OLD));
	EXPECT_EQ(0u, fill_diff(b.map, GUARD, 0, SEED_MEM_OLD));
	EXPECT_EQ(0u, fill_diff(b.p + len, GUARD, GUARD + len, SEED_MEM_OLD));
	rec_ns(&b, 0, got, pos, 0);
	/* After the failed bio's first block the content is not defined: zero it. */
	zero_rec(&b, got + LBS, len - got - LBS);
	close(fd);
}

/*
 * A WRITE of 3 MiB to NSID 1 whose third-or-so bio fails: the call succeeds
 * with the good prefix, which is on the namespace (read back with an O_DIRECT
 * pread); the failed bio's first block and 1 MiB on each side of the range
 * hold what they held before.
 */
TEST_F_TIMEOUT(ft, a2_device_error_mid_write, 120)
{
	__u64 space = 2 * self->maxbio + 1, len = A_WRITE_LEN, pos = A_WRITE_POS, got;
	__u64 lo = pos - NS_GUARD, span = len + 2 * NS_GUARD;
	struct p2pdirect_io out;
	struct dbuf b;
	long long left;
	__u8 *back;
	int fd, r;

	ASSERT_GE(len, 4 * self->maxbio);
	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ns_fill(fd, lo, span, SEED_A_OLD));
	rec_nvme(lo, span, SEED_A_OLD);
	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	fill_buf(b.p, len, pos, SEED_A_NEW);
	rec_fill(&b, 0, len, SEED_A_NEW, pos);

	ASSERT_EQ(0, fmr_arm(self->disk, space));
	r = rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, pos, 0, &out);
	left = fmr_disarm(self->disk);
	got = out.bytes;
	TH_LOG("WRITE %llu bytes, bios <= %llu, space %llu: %s, %llu bytes", len, self->maxbio,
	       space, r ? ename(r) : "success", got);
	ASSERT_EQ(0, left) TH_LOG("no bio failed: the fault was not injected");
	ASSERT_EQ(0, r) TH_LOG("a device error after a good prefix must report the prefix");
	ASSERT_LT(got, len);
	EXPECT_EQ(0u, got % LBS);
	EXPECT_LT(got, space);
	EXPECT_GE(got + self->maxbio, space);

	back = ns_read(fd, lo, span);
	ASSERT_NE(NULL, back);
	EXPECT_EQ(0u, fill_diff(back, NS_GUARD, lo, SEED_A_OLD));
	EXPECT_EQ(0u, fill_diff(back + NS_GUARD, got, pos, SEED_A_NEW));
	EXPECT_EQ(0u, fill_diff(back + NS_GUARD + got, LBS, pos + got, SEED_A_OLD));
	EXPECT_EQ(0u, fill_diff(back + NS_GUARD + len, NS_GUARD, pos + len, SEED_A_OLD));
	free(back);
	/* The source is only read. */
	EXPECT_EQ(0u, fill_diff(b.p, len, pos, SEED_A_NEW));
	EXPECT_EQ(0u, nonzero(b.map, GUARD) + nonzero(b.p + len, GUARD));
	rec_nvme(pos, got, SEED_A_NEW);
	/* After the failed bio's first block the content is not defined: rewrite it. */
	ASSERT_EQ(0, ns_fill(fd, pos + got + LBS, len - got - LBS, SEED_A_NEW));
	rec_nvme(pos + got + LBS, len - got - LBS, SEED_A_NEW);
	close(fd);
}

/*
 * The same with the range in the page cache (a buffered reader read it
 * before): after the WRITE a buffered read shows what the device holds, as
 * after an O_DIRECT pwrite, which drops the cached pages of its range before
 * it writes. Cached pages of the part after the failed bio, which the later
 * bios did write, must not keep the old data.
 */
TEST_F_TIMEOUT(ft, a3_device_error_mid_write_no_stale_cache, 120)
{
	__u64 space = 2 * self->maxbio + 1, len = A_CACHE_LEN, pos = A_CACHE_POS, got;
	__u64 stale = 0, first = ~0ull;
	struct p2pdirect_io out;
	__u8 *direct, *cached;
	struct dbuf b;
	long long left;
	int fd, bfd, r;

	ASSERT_GE(len, 4 * self->maxbio);
	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	bfd = open(self->ns1, O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_GE(bfd, 0);
	ASSERT_EQ(0, ns_fill(fd, pos - NS_GUARD, len + 2 * NS_GUARD, SEED_A_CACHE_OLD));
	rec_nvme(pos - NS_GUARD, len + 2 * NS_GUARD, SEED_A_CACHE_OLD);
	/* A buffered reader brings the range into the page cache. */
	cached = ns_read(bfd, pos, len);
	ASSERT_NE(NULL, cached);
	ASSERT_EQ(0u, fill_diff(cached, len, pos, SEED_A_CACHE_OLD));
	free(cached);
	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	fill_buf(b.p, len, pos, SEED_A_CACHE_NEW);
	rec_fill(&b, 0, len, SEED_A_CACHE_NEW, pos);

	ASSERT_EQ(0, fmr_arm(self->disk, space));
	r = rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, pos, 0, &out);
	left = fmr_disarm(self->disk);
	got = out.bytes;
	ASSERT_EQ(0, left) TH_LOG("no bio failed: the fault was not injected");
	ASSERT_EQ(0, r);
	ASSERT_LT(got, len);

	direct = ns_read(fd, pos, len);
	cached = ns_read(bfd, pos, len);
	ASSERT_NE(NULL, direct);
	ASSERT_NE(NULL, cached);
	EXPECT_EQ(0u, fill_diff(direct, got, pos, SEED_A_CACHE_NEW));
	for (__u64 i = 0; i < len; i++) {
		if (direct[i] == cached[i])
			continue;
		stale++;
		if (first == ~0ull)
			first = i;
	}
	EXPECT_EQ(0u, stale) TH_LOG("prefix %llu of %llu bytes; a buffered read differs from the device in %llu bytes, first at +%llu (the device has %s there)",
				    got, len, stale, first,
				    first < len && !fill_diff(direct + first, 1, pos + first,
							      SEED_A_CACHE_NEW) ? "the new data" : "other data");
	free(direct);
	free(cached);
	/* A clean state for the host and the next buffered reader. */
	ASSERT_EQ(0, ns_fill(fd, pos, len, SEED_A_CACHE_NEW));
	rec_nvme(pos, len, SEED_A_CACHE_NEW);
	close(bfd);
	close(fd);
}

/*
 * When the first bio fails, nothing was transferred from @file_offset on:
 * READ and WRITE fail with EIO, whether the I/O takes many bios or one (the
 * module's on-stack bio). The first block of the range and everything around
 * it keep what they held.
 */
static int first_bio_fails(struct __test_metadata *_metadata, FIXTURE_DATA(ft) * self,
			   bool write, __u64 len)
{
	__u64 pos = write ? A_FIRST_POS : A_READ_POS, lo = pos - NS_GUARD;
	struct p2pdirect_io out;
	struct dbuf b;
	long long left;
	__u8 *back;
	int fd, r;

	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	if (fd < 0 || dbuf_new(self->dev, &self->gpu[0], len, &b))
		return -1;
	if (write) {
		if (ns_fill(fd, lo, len + 2 * NS_GUARD, SEED_A_OLD))
			return -1;
		rec_nvme(lo, len + 2 * NS_GUARD, SEED_A_OLD);
		fill_buf(b.p, len, pos, SEED_A_NEW);
		rec_fill(&b, 0, len, SEED_A_NEW, pos);
	} else {
		dbuf_fill_all(&b, SEED_MEM_OLD);
	}
	if (fmr_arm(self->disk, 0))
		return -1;
	r = rw(self->dev, write, fd, 0, (uintptr_t)b.p, len, pos, 0, &out);
	left = fmr_disarm(self->disk);
	TH_LOG("%s of %llu bytes, first bio failing: %s, %llu bytes", write ? "WRITE" : "READ",
	       len, r ? ename(r) : "success", out.bytes);
	EXPECT_EQ(0, left) TH_LOG("no bio failed: the fault was not injected");
	EXPECT_EQ(-EIO, r);
	if (write) {
		back = ns_read(fd, lo, len + 2 * NS_GUARD);
		if (!back)
			return -1;
		EXPECT_EQ(0u, fill_diff(back, NS_GUARD + LBS, lo, SEED_A_OLD));
		EXPECT_EQ(0u, fill_diff(back + NS_GUARD + len, NS_GUARD, pos + len, SEED_A_OLD));
		free(back);
		/* After the first block the content is not defined: rewrite it. */
		if (ns_fill(fd, pos + LBS, len - LBS, SEED_A_OLD))
			return -1;
		rec_nvme(pos + LBS, len - LBS, SEED_A_OLD);
	} else {
		EXPECT_EQ(0u, fill_diff(b.map, GUARD + LBS, 0, SEED_MEM_OLD));
		EXPECT_EQ(0u, fill_diff(b.p + len, GUARD, GUARD + len, SEED_MEM_OLD));
		zero_rec(&b, LBS, len - LBS);
	}
	close(fd);
	return dbuf_free(self->dev, &b);
}

TEST_F_TIMEOUT(ft, a4_device_error_at_first_bio, 120)
{
	EXPECT_EQ(0, first_bio_fails(_metadata, self, false, A_READ_LEN));
	EXPECT_EQ(0, first_bio_fails(_metadata, self, true, A_WRITE_LEN));
	/* One bio: the module's on-stack path. */
	EXPECT_EQ(0, first_bio_fails(_metadata, self, false, 64 * KiB));
	EXPECT_EQ(0, first_bio_fails(_metadata, self, true, 64 * KiB));
}

/* --- b: allocation failures inside every command ---------------------------- */

/*
 * failslab and fail_page_alloc through /proc/thread-self/fail-nth: writing
 * N makes the N-th allocation of this thread that passes the capabilities'
 * filters fail, and reading it back says whether that happened (0) or the
 * call made fewer allocations (N minus those it made). The filters: only
 * allocations with the module's code on the call stack (require-start/end),
 * sleeping ones too (ignore-gfp-wait=N), every page order; probability 0,
 * so that nothing fails outside the call under test. Nothing is printed
 * (verbose=0), except the allocator's own "page allocation failure" report,
 * which the host's console scan accepts between the marker lines.
 */
#define MAX_NTH 400u
#define FI_BEGIN "<5>p2pdirect-fault: injecting allocation failures\n"
#define FI_END "<5>p2pdirect-fault: allocation failure injection over\n"

static int fi(const char *cap, const char *attr, const char *val)
{
	char path[128];

	snprintf(path, sizeof(path), DEBUGFS "%s/%s", cap, attr);
	return sysfs_write(path, val);
}

/* [start, end) of the module's code: its .text sections and what follows, coresize bytes. */
static int module_text(unsigned long long *start, unsigned long long *end)
{
	unsigned long long size = sysfs_ull("/sys/module/" MODULE_NAME "/coresize");
	glob_t g;

	*start = ~0ull;
	if (glob("/sys/module/" MODULE_NAME "/sections/.text*", 0, NULL, &g))
		return -ENOENT;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		unsigned long long a = sysfs_ull(g.gl_pathv[i]);

		if (a && a < *start)
			*start = a;
	}
	globfree(&g);
	if (*start == ~0ull || !size)
		return -ENOENT;
	*end = *start + size;
	return 0;
}

/*
 * @module: only allocations with the module's code on the stack (the top 32
 * frames); else every allocation of the call, in the kernel's own paths
 * around the module's callbacks too (mmap_region, open, the block layer).
 */
static int fi_alloc_arm(bool module)
{
	static const char *const caps[] = { "failslab", "fail_page_alloc" };
	unsigned long long start = 0, end = ~0ull;
	char s[32], e[32];
	int r = module ? module_text(&start, &end) : 0;

	if (r)
		return r;
	snprintf(s, sizeof(s), "%llu", start);
	snprintf(e, sizeof(e), "%llu", end);
	for (int i = 0; i < 2; i++) {
		r = fi(caps[i], "probability", "0") ?: fi(caps[i], "verbose", "0") ?:
		    fi(caps[i], "task-filter", "N") ?: fi(caps[i], "ignore-gfp-wait", "N") ?:
		    fi(caps[i], "stacktrace-depth", "32") ?: fi(caps[i], "require-start", s) ?:
		    fi(caps[i], "require-end", e);
		if (r)
			return r;
	}
	r = fi("fail_page_alloc", "min-order", "0") ?:
	    fi("fail_page_alloc", "ignore-gfp-highmem", "N");
	if (!r)
		log_kernel(FI_BEGIN);
	return r;
}

static void fi_alloc_disarm(void)
{
	static const char *const caps[] = { "failslab", "fail_page_alloc" };

	for (int i = 0; i < 2; i++) {
		fi(caps[i], "require-start", "0");
		fi(caps[i], "require-end", "18446744073709551615");
		fi(caps[i], "ignore-gfp-wait", "Y");
	}
	log_kernel(FI_END);
}

static void nth_arm(int nth, unsigned int n)
{
	char buf[16];
	int len = snprintf(buf, sizeof(buf), "%u", n);

	if (write(nth, buf, len) != len)
		perror("fail-nth");
}

/* Reads fail-nth back (0: the fault was injected) and disarms it. */
static unsigned int nth_left(int nth)
{
	char buf[16] = { 0 };
	unsigned int left;

	if (pread(nth, buf, sizeof(buf) - 1, 0) <= 0)
		return ~0u;
	left = strtoul(buf, NULL, 10);
	if (write(nth, "0", 1) != 1)
		perror("fail-nth");
	return left;
}

/* What the commands under test work with. */
struct bctx {
	int dev, rd, wr;	/* /dev/p2pdirect; NSID 1, O_DIRECT, read-only and read-write */
	const struct gpu *g;
	struct dbuf b;		/* device memory of the command, if it needs some */
	__u64 reg;		/* a registration of b's usable part */
	int fd;			/* OPEN's and EXPORT_DMABUF's result */
	int low_fd;		/* the lowest free descriptor before the call */
	void *m;		/* mmap's result */
	struct p2pdirect_alloc a;	/* ALLOC's result */
	struct p2pdirect_io io;	/* READ's and WRITE's result */
	struct p2pdirect_dma_seg segs[64];
	struct io_uring ring;	/* READ and WRITE go through it if @uring */
	bool uring;
	bool enter_failed;	/* io_uring_enter itself failed the last call */
	long long free0;	/* the GPU's bytes_free before the command's memory */
	long long pinned0;	/* its pinned bytes then */
	int nprov0;		/* providers then */
	char why[512];		/* what a check found */
};

struct cmd {
	const char *name;
	int (*setup)(struct bctx *c);		/* once, before the tries */
	int (*before)(struct bctx *c);		/* before each try */
	int (*call)(struct bctx *c);		/* the call: 0 or -errno */
	int (*after)(struct bctx *c, int ret);	/* checks and undoes each try; 0 or -1 and why */
	int (*teardown)(struct bctx *c);
	bool io;				/* EIO is a documented result too */
};

/* A check of a command failed (c->why says which): no errno, never a call's result. */
#define CHECK_FAILED (-100000)
#define FAILED(c, ...) (snprintf((c)->why, sizeof((c)->why), __VA_ARGS__), CHECK_FAILED)

static long long bytes_free(struct bctx *c)
{
	struct p2pdirect_provider_info p;

	return provider_of(c->dev, c->g->pci, &p) ? -1 : (long long)p.bytes_free;
}

/* The GPU's bytes_free is less by @used than before, its pinned bytes more by @pins. */
static int same_usage(struct bctx *c, long long used, long long pins)
{
	long long f = bytes_free(c), p = pinned(c->dev, c->g->pci);

	if (f != c->free0 - used)
		return FAILED(c, "bytes_free %lld, want %lld", f, c->free0 - used);
	if (p != c->pinned0 + pins)
		return FAILED(c, "pinned bytes %lld, want %lld", p, c->pinned0 + pins);
	return 0;
}

/* ALLOC and mmap of B_LEN bytes (no guards, no host record: never written). */
static int setup_mem(struct bctx *c)
{
	int r = do_alloc(c->dev, c->g, B_LEN, &c->b.a);

	if (r)
		return FAILED(c, "ALLOC: %s", ename(r));
	c->b.map = c->b.p = map(c->dev, &c->b.a);
	if (c->b.map == MAP_FAILED)
		return FAILED(c, "mmap: %s", strerror(errno));
	c->b.len = B_LEN;
	return 0;
}

static int teardown_mem(struct bctx *c)
{
	int r;

	munmap(c->b.map, c->b.a.size);
	r = do_free(c->dev, c->b.a.handle);
	if (r)
		return FAILED(c, "FREE: %s", ename(r));
	return same_usage(c, 0, 0);
}

static int setup_mem_reg(struct bctx *c)
{
	int r = setup_mem(c);

	if (r)
		return r;
	r = do_register(c->dev, c->b.p, c->b.len, P2PDIRECT_REG_WRITE, &c->reg);
	return r ? FAILED(c, "REGISTER: %s", ename(r)) : 0;
}

static int teardown_mem_reg(struct bctx *c)
{
	int r = reg_op(c->dev, c->reg, true);

	if (r != P2PDIRECT_REG_LIVE)
		return FAILED(c, "DEREGISTER: %d", r);
	return teardown_mem(c);
}

/* OPEN */
static int call_open(struct bctx *c)
{
	c->fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	return c->fd < 0 ? -errno : 0;
}

static int after_open(struct bctx *c, int ret)
{
	if (!ret)
		close(c->fd);
	return 0;
}

/* GET_VERSION */
static int call_version(struct bctx *c)
{
	struct p2pdirect_version v = { 0 };

	if (ioctl(c->dev, P2PDIRECT_IOC_GET_VERSION, &v))
		return -errno;
	return v.abi_major == P2PDIRECT_ABI_MAJOR ? 0 : FAILED(c, "ABI major %u", v.abi_major);
}

static int after_nothing(struct bctx *c, int ret)
{
	(void)c;
	(void)ret;
	return 0;
}

/* LIST_PROVIDERS */
static int call_list(struct bctx *c)
{
	struct p2pdirect_provider_info p[8];
	int n = list(c->dev, p, 8);

	if (n < 0)
		return n;
	return n == c->nprov0 ? 0 : FAILED(c, "%d providers, want %d", n, c->nprov0);
}

/* ALLOC */
static int call_alloc(struct bctx *c)
{
	return alloc_only(c->dev, c->g, B_LEN, &c->a);
}

static int after_alloc(struct bctx *c, int ret)
{
	if (!ret) {
		int r;

		record_alloc_zero(c->dev, &c->a);
		r = do_free(c->dev, c->a.handle);

		if (r)
			return FAILED(c, "FREE of what ALLOC gave: %s", ename(r));
	}
	return same_usage(c, 0, 0);
}

/* mmap */
static int call_mmap(struct bctx *c)
{
	c->m = map(c->dev, &c->b.a);
	return c->m == MAP_FAILED ? -errno : 0;
}

static int after_mmap(struct bctx *c, int ret)
{
	if (ret) {
		c->m = map(c->dev, &c->b.a);
		if (c->m == MAP_FAILED)
			return FAILED(c, "mmap after the failed one: %s", strerror(errno));
	}
	if (touch(c->m))
		return FAILED(c, "the mapping faults");
	munmap(c->m, c->b.a.size);
	return same_usage(c, B_LEN, 0);
}

static int setup_alloc_only(struct bctx *c)
{
	int r = do_alloc(c->dev, c->g, B_LEN, &c->b.a);

	return r ? FAILED(c, "ALLOC: %s", ename(r)) : 0;
}

static int teardown_alloc_only(struct bctx *c)
{
	int r = do_free(c->dev, c->b.a.handle);

	return r ? FAILED(c, "FREE: %s", ename(r)) : same_usage(c, 0, 0);
}

/* FREE of mapped memory with a registration on it */
static int before_free(struct bctx *c)
{
	return setup_mem_reg(c);
}

static int call_free(struct bctx *c)
{
	return do_free(c->dev, c->b.a.handle);
}

static int after_free(struct bctx *c, int ret)
{
	int st = reg_op(c->dev, c->reg, false), r;

	if (!ret) {
		if (st != P2PDIRECT_REG_DEAD)
			return FAILED(c, "registration state %d after FREE, want DEAD", st);
		if (touch(c->b.p) != SIGBUS)
			return FAILED(c, "the mapping does not fault after FREE");
		reg_op(c->dev, c->reg, true);
		munmap(c->b.map, c->b.a.size);
		return same_usage(c, 0, 0);
	}
	/* Nothing happened: the memory, its mapping and the registration are all there. */
	if (st != P2PDIRECT_REG_LIVE)
		return FAILED(c, "registration state %d after a failed FREE, want LIVE", st);
	if (touch(c->b.p))
		return FAILED(c, "the mapping faults after a failed FREE");
	r = same_usage(c, B_LEN, B_LEN);
	return r ? r : teardown_mem_reg(c);
}

/* DMA_PROBE */
static int call_probe(struct bctx *c)
{
	struct p2pdirect_dma_probe p = {
		.addr = (uintptr_t)c->b.p, .size = c->b.len, .fd = c->rd,
		.flags = P2PDIRECT_PROBE_WRITE, .segs = (uintptr_t)c->segs, .capacity = 64,
	};

	if (ioctl(c->dev, P2PDIRECT_IOC_DMA_PROBE, &p))
		return -errno;
	if (!p.count || p.client != P2PDIRECT_CLIENT_DEVMEM)
		return FAILED(c, "%u segments, client %u", p.count, p.client);
	return 0;
}

/* Mapped memory, no pin. */
static int after_pins(struct bctx *c, int ret)
{
	(void)ret;
	return same_usage(c, B_LEN, 0);
}

/* Mapped and registered memory. */
static int after_reg_pins(struct bctx *c, int ret)
{
	(void)ret;
	return same_usage(c, B_LEN, B_LEN);
}

/* REGISTER */
static int call_register(struct bctx *c)
{
	return do_register(c->dev, c->b.p, c->b.len, P2PDIRECT_REG_WRITE, &c->reg);
}

static int after_register(struct bctx *c, int ret)
{
	int r;

	if (ret) {
		/* No registration exists: the pin count and a new REGISTER say so. */
		r = same_usage(c, B_LEN, 0);
		if (r)
			return r;
		r = call_register(c);
		if (r)
			return FAILED(c, "REGISTER after the failed one: %s", ename(r));
	}
	r = reg_op(c->dev, c->reg, true);
	if (r != P2PDIRECT_REG_LIVE)
		return FAILED(c, "DEREGISTER: %d", r);
	return same_usage(c, B_LEN, 0);
}

/* DEREGISTER */
static int before_deregister(struct bctx *c)
{
	int r = call_register(c);

	return r ? FAILED(c, "REGISTER: %s", ename(r)) : 0;
}

static int call_deregister(struct bctx *c)
{
	int r = reg_op(c->dev, c->reg, true);

	if (r < 0)
		return r;
	return r == P2PDIRECT_REG_LIVE ? 0 : FAILED(c, "DEREGISTER said state %d", r);
}

static int after_deregister(struct bctx *c, int ret)
{
	int r = reg_op(c->dev, c->reg, false);

	if (!ret) {
		if (r != -ENOENT)
			return FAILED(c, "REG_QUERY after DEREGISTER: %d, want ENOENT", r);
		return same_usage(c, B_LEN, 0);
	}
	if (r != P2PDIRECT_REG_LIVE)
		return FAILED(c, "REG_QUERY after a failed DEREGISTER: %d, want LIVE", r);
	r = reg_op(c->dev, c->reg, true);
	if (r != P2PDIRECT_REG_LIVE)
		return FAILED(c, "DEREGISTER after the failed one: %d", r);
	return same_usage(c, B_LEN, 0);
}

/* REG_QUERY */
static int call_query(struct bctx *c)
{
	int r = reg_op(c->dev, c->reg, false);

	if (r < 0)
		return r;
	return r == P2PDIRECT_REG_LIVE ? 0 : FAILED(c, "state %d", r);
}

/* EXPORT_DMABUF: no descriptor, no hold on the memory left by a failed one */
static int lowest_free_fd(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

static int before_export(struct bctx *c)
{
	c->fd = -1;
	c->low_fd = lowest_free_fd();
	return c->low_fd < 0 ? FAILED(c, "dup: %s", strerror(errno)) : 0;
}

static int call_export(struct bctx *c)
{
	struct p2pdirect_export_dmabuf x = {
		.handle = c->b.a.handle, .size = B_LEN, .flags = P2PDIRECT_EXPORT_CLOEXEC,
	};

	if (ioctl(c->dev, P2PDIRECT_IOC_EXPORT_DMABUF, &x))
		return -errno;
	if (x.fd < 0)
		return FAILED(c, "EXPORT_DMABUF succeeded with fd %d", x.fd);
	c->fd = x.fd;
	return 0;
}

static int after_export(struct bctx *c, int ret)
{
	int r;

	/* The dma-buf is released in close (its last reference). */
	if (!ret)
		close(c->fd);
	if (lowest_free_fd() != c->low_fd)
		return FAILED(c, "a descriptor was left behind (lowest free %d, was %d)",
			      lowest_free_fd(), c->low_fd);
	if (ret) {
		r = call_export(c);
		if (r)
			return FAILED(c, "EXPORT_DMABUF after the failed one: %s", ename(r));
		close(c->fd);
	}
	/* FREE in the teardown must not wait for anything: no export is left. */
	return same_usage(c, B_LEN, 0);
}

/* STATS */
static int call_stats(struct bctx *c)
{
	struct p2pdirect_stat rows[32];
	struct p2pdirect_stats req = { .entries = (uintptr_t)rows, .capacity = 32 };

	if (ioctl(c->dev, P2PDIRECT_IOC_STATS, &req))
		return -errno;
	return req.count ? 0 : FAILED(c, "no rows");
}

/* READ into device memory with guards, by pointer or registration */
static int setup_read(struct bctx *c)
{
	int r = ns_fill(c->wr, B_READ_POS, B_LEN, SEED_B_READ);

	if (r)
		return FAILED(c, "writing the source: %s", ename(r));
	rec_nvme(B_READ_POS, B_LEN, SEED_B_READ);
	r = dbuf_new(c->dev, c->g, B_LEN, &c->b);
	return r ? FAILED(c, "device memory: %s", ename(r)) : 0;
}

static int setup_read_reg(struct bctx *c)
{
	int r = setup_read(c);

	if (r)
		return r;
	r = do_register(c->dev, c->b.p, c->b.len, P2PDIRECT_REG_WRITE, &c->reg);
	return r ? FAILED(c, "REGISTER: %s", ename(r)) : 0;
}

/*
 * One READ or WRITE as an io_uring command on c->ring, submitted and its CQE
 * reaped: 0 and the CQE's counts in c->io, or the CQE's -errno. When
 * io_uring_enter itself fails (an injected failure of io_uring's own
 * allocation of the request: the SQE stays queued), that is the result, and
 * the queued command is submitted again (the one injection has fired) and
 * reaped, so that the ring holds nothing of this call.
 */
static int urw(struct bctx *c, bool write, int fd, __u32 flags, __u64 addr)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
	struct p2pdirect_uring_io io = {
		.fd = fd, .flags = flags, .addr = addr, .size = B_LEN,
		.file_offset = write ? B_WRITE_POS : B_READ_POS,
	};
	struct io_uring_cqe *cqe;
	int r, res;

	c->enter_failed = false;
	if (!sqe)
		return FAILED(c, "no free SQE");
	memset(sqe, 0, 2 * sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = c->dev;
	sqe->cmd_op = write ? P2PDIRECT_URING_CMD_WRITE : P2PDIRECT_URING_CMD_READ;
	memcpy((__u8 *)sqe + offsetof(struct io_uring_sqe, cmd), &io, sizeof(io));
	r = io_uring_submit_and_wait(&c->ring, 1);
	if (r < 0) {
		c->enter_failed = true;
		if (io_uring_submit_and_wait(&c->ring, 1) < 1 || io_uring_wait_cqe(&c->ring, &cqe))
			return FAILED(c, "the queued command after io_uring_enter's %s", ename(r));
		io_uring_cqe_seen(&c->ring, cqe);
		return r;
	}
	if (r != 1)
		return FAILED(c, "io_uring_enter submitted %d commands, not 1", r);
	r = io_uring_wait_cqe(&c->ring, &cqe);
	if (r)
		return FAILED(c, "io_uring_wait_cqe: %s", ename(r));
	res = cqe->res;
	memset(&c->io, 0, sizeof(c->io));
	if (res >= 0) {
		c->io.bytes = (__u32)res;
		c->io.p2p_bytes = cqe->big_cqe[0] & 0xffffffff;
		c->io.bounce_bytes = cqe->big_cqe[0] >> 32;
	}
	io_uring_cqe_seen(&c->ring, cqe);
	return res < 0 ? res : 0;
}

static int do_read(struct bctx *c, bool reg)
{
	__u32 flags = reg ? P2PDIRECT_IO_REGISTERED : 0;
	__u64 addr = reg ? c->reg : (uintptr_t)c->b.p;

	if (c->uring)
		return urw(c, false, c->rd, flags, addr);
	return rw(c->dev, false, c->rd, flags, addr, B_LEN, B_READ_POS, 0, &c->io);
}

static int call_read(struct bctx *c)
{
	return do_read(c, false);
}

static int call_read_reg(struct bctx *c)
{
	return do_read(c, true);
}

static int check_read(struct bctx *c, int ret, bool reg)
{
	__u64 got = c->io.bytes;
	int r;

	if (nonzero(c->b.map, GUARD) || nonzero(c->b.p + B_LEN, GUARD))
		return FAILED(c, "device memory outside the range changed");
	if (!ret) {
		if (!got || got > B_LEN || got % LBS)
			return FAILED(c, "READ reported %llu bytes of %llu", got, B_LEN);
		if (fill_diff(c->b.p, got, B_READ_POS, SEED_B_READ))
			return FAILED(c, "the %llu bytes READ reported are not the namespace's", got);
		if (got < B_LEN)
			printf("#   partial: %llu of %llu bytes\n", got, B_LEN);
	} else {
		if (reg && reg_op(c->dev, c->reg, false) != P2PDIRECT_REG_LIVE)
			return FAILED(c, "the registration is not LIVE after a failed READ");
		/* The memory is still usable. */
		r = do_read(c, reg);
		if (r || c->io.bytes != B_LEN)
			return FAILED(c, "READ after the failed one: %s, %llu bytes",
				      r ? ename(r) : "success", c->io.bytes);
		if (fill_diff(c->b.p, B_LEN, B_READ_POS, SEED_B_READ))
			return FAILED(c, "READ after the failed one brought wrong data");
	}
	memset(c->b.p, 0, B_LEN);
	return same_usage(c, c->b.a.size, reg ? B_LEN : 0);
}

static int after_read(struct bctx *c, int ret)
{
	return check_read(c, ret, false);
}

static int after_read_reg(struct bctx *c, int ret)
{
	return check_read(c, ret, true);
}

/* The last state for the host: a whole READ. */
static int teardown_read(struct bctx *c)
{
	int r = do_read(c, false);

	if (r || c->io.bytes != B_LEN || fill_diff(c->b.p, B_LEN, B_READ_POS, SEED_B_READ))
		return FAILED(c, "the last READ: %s, %llu bytes", r ? ename(r) : "success",
			      c->io.bytes);
	rec_ns(&c->b, 0, B_LEN, B_READ_POS, GUARD);
	r = dbuf_free(c->dev, &c->b);
	return r ? FAILED(c, "FREE: %s", ename(r)) : same_usage(c, 0, 0);
}

static int teardown_read_reg(struct bctx *c)
{
	int r = reg_op(c->dev, c->reg, true);

	if (r != P2PDIRECT_REG_LIVE)
		return FAILED(c, "DEREGISTER: %d", r);
	return teardown_read(c);
}

/* WRITE from device memory, with the namespace around the range checked */
static int setup_write(struct bctx *c)
{
	int r = dbuf_new(c->dev, c->g, B_LEN, &c->b);

	if (r)
		return FAILED(c, "device memory: %s", ename(r));
	fill_buf(c->b.p, B_LEN, B_WRITE_POS, SEED_B_NEW);
	rec_fill(&c->b, 0, B_LEN, SEED_B_NEW, B_WRITE_POS);
	r = ns_fill(c->wr, B_WRITE_POS - NS_GUARD, B_LEN + 2 * NS_GUARD, SEED_B_OLD);
	if (r)
		return FAILED(c, "writing the target: %s", ename(r));
	rec_nvme(B_WRITE_POS - NS_GUARD, B_LEN + 2 * NS_GUARD, SEED_B_OLD);
	return 0;
}

static int before_write(struct bctx *c)
{
	int r = ns_fill(c->wr, B_WRITE_POS, B_LEN, SEED_B_OLD);

	return r ? FAILED(c, "restoring the target: %s", ename(r)) : 0;
}

static int call_write(struct bctx *c)
{
	if (c->uring)
		return urw(c, true, c->wr, 0, (uintptr_t)c->b.p);
	return rw(c->dev, true, c->wr, 0, (uintptr_t)c->b.p, B_LEN, B_WRITE_POS, 0, &c->io);
}

static int after_write(struct bctx *c, int ret)
{
	__u64 got = c->io.bytes, lo = B_WRITE_POS - NS_GUARD;
	__u8 *back;
	int r;

	if (!ret && (!got || got > B_LEN || got % LBS))
		return FAILED(c, "WRITE reported %llu bytes of %llu", got, B_LEN);
	if (ret) {
		/* The memory is still usable. */
		r = call_write(c);
		if (r || c->io.bytes != B_LEN)
			return FAILED(c, "WRITE after the failed one: %s, %llu bytes",
				      r ? ename(r) : "success", c->io.bytes);
		got = B_LEN;
	} else if (got < B_LEN) {
		printf("#   partial: %llu of %llu bytes\n", got, B_LEN);
	}
	back = ns_read(c->wr, lo, B_LEN + 2 * NS_GUARD);
	if (!back)
		return FAILED(c, "reading the namespace back: %s", strerror(errno));
	r = 0;
	if (fill_diff(back, NS_GUARD, lo, SEED_B_OLD) ||
	    fill_diff(back + NS_GUARD + B_LEN, NS_GUARD, B_WRITE_POS + B_LEN, SEED_B_OLD))
		r = FAILED(c, "the namespace outside the range changed");
	else if (fill_diff(back + NS_GUARD, got, B_WRITE_POS, SEED_B_NEW))
		r = FAILED(c, "the %llu bytes WRITE reported are not on the namespace", got);
	free(back);
	if (r)
		return r;
	if (fill_diff(c->b.p, B_LEN, B_WRITE_POS, SEED_B_NEW) || nonzero(c->b.map, GUARD) ||
	    nonzero(c->b.p + B_LEN, GUARD))
		return FAILED(c, "WRITE changed the device memory");
	return same_usage(c, c->b.a.size, 0);
}

static int teardown_write(struct bctx *c)
{
	int r = call_write(c);

	if (r || c->io.bytes != B_LEN || ns_diff(c->wr, B_WRITE_POS, B_LEN, SEED_B_NEW))
		return FAILED(c, "the last WRITE: %s, %llu bytes", r ? ename(r) : "success",
			      c->io.bytes);
	rec_nvme(B_WRITE_POS, B_LEN, SEED_B_NEW);
	r = dbuf_free(c->dev, &c->b);
	return r ? FAILED(c, "FREE: %s", ename(r)) : same_usage(c, 0, 0);
}

/*
 * The same READ and WRITE as io_uring commands: a ring of 128-byte SQEs and
 * 32-byte CQEs, set up before the tries and torn down after the last one.
 */
static int ring_up(struct bctx *c, int (*setup)(struct bctx *c))
{
	int r = io_uring_queue_init(8, &c->ring, IORING_SETUP_SQE128 | IORING_SETUP_CQE32);

	if (r)
		return FAILED(c, "io_uring_queue_init: %s", ename(r));
	c->uring = true;
	return setup(c);
}

static int ring_down(struct bctx *c, int (*teardown)(struct bctx *c))
{
	int r = teardown(c);

	io_uring_queue_exit(&c->ring);
	c->uring = false;
	return r;
}

static int setup_uring_read(struct bctx *c) { return ring_up(c, setup_read); }
static int setup_uring_read_reg(struct bctx *c) { return ring_up(c, setup_read_reg); }
static int setup_uring_write(struct bctx *c) { return ring_up(c, setup_write); }
static int teardown_uring_read(struct bctx *c) { return ring_down(c, teardown_read); }
static int teardown_uring_read_reg(struct bctx *c) { return ring_down(c, teardown_read_reg); }
static int teardown_uring_write(struct bctx *c) { return ring_down(c, teardown_write); }

static const struct cmd cmds[] = {
	{ "OPEN", NULL, NULL, call_open, after_open, NULL, false },
	{ "GET_VERSION", NULL, NULL, call_version, after_nothing, NULL, false },
	{ "LIST_PROVIDERS", NULL, NULL, call_list, after_nothing, NULL, false },
	{ "ALLOC", NULL, NULL, call_alloc, after_alloc, NULL, false },
	{ "mmap", setup_alloc_only, NULL, call_mmap, after_mmap, teardown_alloc_only, false },
	{ "FREE", NULL, before_free, call_free, after_free, NULL, false },
	{ "DMA_PROBE", setup_mem, NULL, call_probe, after_pins, teardown_mem, false },
	{ "REGISTER", setup_mem, NULL, call_register, after_register, teardown_mem, false },
	{ "DEREGISTER", setup_mem, before_deregister, call_deregister, after_deregister,
	  teardown_mem, false },
	{ "REG_QUERY", setup_mem_reg, NULL, call_query, after_reg_pins, teardown_mem_reg, false },
	{ "READ", setup_read, NULL, call_read, after_read, teardown_read, true },
	{ "READ_REGISTERED", setup_read_reg, NULL, call_read_reg, after_read_reg,
	  teardown_read_reg, true },
	{ "WRITE", setup_write, before_write, call_write, after_write, teardown_write, true },
	{ "STATS", NULL, NULL, call_stats, after_nothing, NULL, false },
	{ "EXPORT_DMABUF", setup_mem, before_export, call_export, after_export, teardown_mem,
	  false },
	{ "URING_READ", setup_uring_read, NULL, call_read, after_read, teardown_uring_read, true },
	{ "URING_READ_REGISTERED", setup_uring_read_reg, NULL, call_read_reg, after_read_reg,
	  teardown_uring_read_reg, true },
	{ "URING_WRITE", setup_uring_write, before_write, call_write, after_write,
	  teardown_uring_write, true },
};

static const struct cmd *cmd_named(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(cmds); i++)
		if (!strcmp(cmds[i].name, name))
			return &cmds[i];
	return NULL;
}

/*
 * Fails the 1st, 2nd, ... allocation of the command until it makes no more:
 * each failed call returns ENOMEM (or, for READ and WRITE, EIO, which the
 * header documents for a transfer the device or kernel failed), calls that
 * survive an injected failure work, and neither leaves anything behind.
 */
static void alloc_failures(struct __test_metadata *_metadata, int dev, const struct gpu *g,
			   const char *ns1, const char *name, bool module)
{
	const char *scope = module ? "module" : "syscall";
	const struct cmd *cmd = cmd_named(name);
	struct p2pdirect_provider_info p[8];
	unsigned int n, failed = 0, survived = 0;
	struct bctx c = { .dev = dev, .g = g };
	int nth, ret, e[8] = { 0 }, ne = 0;
	char errs[128] = "";

	ASSERT_NE(NULL, cmd);
	c.rd = open(ns1, O_RDONLY | O_DIRECT | O_CLOEXEC);
	c.wr = open(ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(c.rd, 0);
	ASSERT_GE(c.wr, 0);
	c.nprov0 = list(dev, p, 8);
	c.free0 = bytes_free(&c);
	c.pinned0 = pinned(dev, g->pci);
	ASSERT_GT(c.nprov0, 0);
	ASSERT_GT(c.free0, (long long)(4 * MiB));
	ASSERT_GE(c.pinned0, 0);
	nth = open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC);
	ASSERT_GE(nth, 0) TH_LOG("fail-nth: %s", strerror(errno));
	ASSERT_EQ(0, fi_alloc_arm(module)) TH_LOG("configuring failslab/fail_page_alloc");
	if (cmd->setup)
		ASSERT_EQ(0, cmd->setup(&c)) TH_LOG("%s setup: %s", name, c.why);
	for (n = 1; n <= MAX_NTH; n++) {
		unsigned int left;
		bool injected;

		if (cmd->before)
			ASSERT_EQ(0, cmd->before(&c)) TH_LOG("%s %s N=%u, before: %s", name, scope, n, c.why);
		c.why[0] = '\0';
		nth_arm(nth, n);
		ret = cmd->call(&c);
		left = nth_left(nth);
		injected = left == 0;
		printf("# %s %s N=%u: %s, %s%s%s%s\n", name, scope, n,
		       injected ? "injected" : "not reached",
		       ret == CHECK_FAILED ? "wrong result:" : ret ? "-" : "",
		       ret == CHECK_FAILED ? "" : ret ? ename(ret) : "0", c.why[0] ? " " : "", c.why);
		ASSERT_NE(~0u, left);
		if (ret == CHECK_FAILED) {
			/* The call's own check failed (c.why). */
			EXPECT_EQ(0, ret) TH_LOG("%s %s N=%u: %s", name, scope, n, c.why);
			break;
		}
		if (ret) {
			int k = 0;

			failed++;
			while (k < ne && e[k] != -ret)
				k++;
			if (k == ne && ne < 8)
				e[ne++] = -ret;
			/*
			 * io_uring_enter's own failure to allocate the request is
			 * -EAGAIN (io_uring's documented answer; the SQE stays queued).
			 */
			EXPECT_TRUE(ret == -ENOMEM || (cmd->io && ret == -EIO) ||
				    (c.enter_failed && ret == -EAGAIN))
				TH_LOG("%s %s N=%u failed with %s, not a documented errno", name, scope, n,
				       ename(ret));
		} else if (injected) {
			survived++;
		}
		if (!injected)
			EXPECT_EQ(0, ret) TH_LOG("%s failed with no fault injected: %s", name,
						 ename(ret));
		ASSERT_EQ(0, cmd->after(&c, ret)) TH_LOG("%s %s N=%u (%s): %s", name, scope, n,
							  ret ? ename(ret) : "success", c.why);
		if (!injected)
			break;
	}
	EXPECT_LE(n, MAX_NTH) TH_LOG("%s still hit an injected failure at N=%u", name, MAX_NTH);
	/*
	 * Every command but these allocates (the module's own mmap handler
	 * does not; the kernel's mmap_region does): a count of 0 would mean
	 * the injection no longer reached it.
	 */
	if (ret != CHECK_FAILED && strcmp(name, "GET_VERSION") && strcmp(name, "DEREGISTER") &&
	    strcmp(name, "REG_QUERY") && (strcmp(name, "mmap") || !module))
		EXPECT_LT(1u, n) TH_LOG("%s %s: no allocation was seen", name, scope);
	if (cmd->teardown)
		EXPECT_EQ(0, cmd->teardown(&c)) TH_LOG("%s teardown: %s", name, c.why);
	fi_alloc_disarm();
	for (int i = 0; i < ne; i++)
		snprintf(errs + strlen(errs), sizeof(errs) - strlen(errs), "%s%s", i ? " " : "",
			 ename(e[i]));
	printf("# %s: %u allocations %s; %u calls failed (%s), %u survived an injected failure\n",
	       name, n - 1, module ? "under the module" : "in the system call", failed,
	       ne ? errs : "-", survived);
	close(nth);
	close(c.rd);
	close(c.wr);
}

/* Both scopes: the module's allocations, then every allocation of the call. */
#define FAULT_ALLOCS(name) do { \
	alloc_failures(_metadata, self->dev, &self->gpu[0], self->ns1, name, true); \
	alloc_failures(_metadata, self->dev, &self->gpu[0], self->ns1, name, false); \
} while (0)

/* The filter sees the module: ALLOC allocates, so its first allocation fails. */
TEST_F(ft, b0_alloc_failure_reaches_the_module)
{
	struct p2pdirect_alloc a;
	unsigned int left;
	int nth, r;

	nth = open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC);
	ASSERT_GE(nth, 0);
	ASSERT_EQ(0, fi_alloc_arm(true));
	nth_arm(nth, 1);
	r = alloc_only(self->dev, &self->gpu[0], B_LEN, &a);
	left = nth_left(nth);
	fi_alloc_disarm();
	if (!r) {
		record_alloc_zero(self->dev, &a);
		do_free(self->dev, a.handle);
	}
	EXPECT_EQ(0u, left) TH_LOG("no allocation with the module on the stack was seen");
	EXPECT_TRUE(r == 0 || r == -ENOMEM) TH_LOG("ALLOC: %s", ename(r));
	close(nth);
}

TEST_F_TIMEOUT(ft, b01_alloc_failures_open, 120) { FAULT_ALLOCS("OPEN"); }
TEST_F_TIMEOUT(ft, b02_alloc_failures_get_version, 120)
{
	FAULT_ALLOCS("GET_VERSION");
}

TEST_F_TIMEOUT(ft, b03_alloc_failures_list_providers, 120)
{
	FAULT_ALLOCS("LIST_PROVIDERS");
}

TEST_F_TIMEOUT(ft, b04_alloc_failures_alloc, 120) { FAULT_ALLOCS("ALLOC"); }
TEST_F_TIMEOUT(ft, b05_alloc_failures_mmap, 120) { FAULT_ALLOCS("mmap"); }
TEST_F_TIMEOUT(ft, b06_alloc_failures_free, 120) { FAULT_ALLOCS("FREE"); }
TEST_F_TIMEOUT(ft, b07_alloc_failures_dma_probe, 120)
{
	FAULT_ALLOCS("DMA_PROBE");
}

TEST_F_TIMEOUT(ft, b08_alloc_failures_register, 120)
{
	FAULT_ALLOCS("REGISTER");
}

TEST_F_TIMEOUT(ft, b09_alloc_failures_deregister, 120)
{
	FAULT_ALLOCS("DEREGISTER");
}

TEST_F_TIMEOUT(ft, b10_alloc_failures_reg_query, 120)
{
	FAULT_ALLOCS("REG_QUERY");
}

TEST_F_TIMEOUT(ft, b11_alloc_failures_read, 300) { FAULT_ALLOCS("READ"); }
TEST_F_TIMEOUT(ft, b12_alloc_failures_read_registered, 300)
{
	FAULT_ALLOCS("READ_REGISTERED");
}

TEST_F_TIMEOUT(ft, b13_alloc_failures_write, 300) { FAULT_ALLOCS("WRITE"); }
TEST_F_TIMEOUT(ft, b14_alloc_failures_stats, 120) { FAULT_ALLOCS("STATS"); }
TEST_F_TIMEOUT(ft, b15_alloc_failures_export_dmabuf, 120)
{
	FAULT_ALLOCS("EXPORT_DMABUF");
}

TEST_F_TIMEOUT(ft, b16_alloc_failures_uring_read, 300) { FAULT_ALLOCS("URING_READ"); }
TEST_F_TIMEOUT(ft, b17_alloc_failures_uring_read_registered, 300)
{
	FAULT_ALLOCS("URING_READ_REGISTERED");
}

TEST_F_TIMEOUT(ft, b18_alloc_failures_uring_write, 300) { FAULT_ALLOCS("URING_WRITE"); }

/* --- c: NVMe controller reset during I/O ------------------------------------- */

/* What a READ or WRITE may end with when the device fails it (blk_status_to_errno). */
static bool io_errno(int e)
{
	return e == -EIO || e == -ENOLINK || e == -ETIMEDOUT || e == -ENODEV || e == -EAGAIN;
}

#define C_THREADS 3

struct resetter_io {
	int dev, fd, id;
	__u8 *src, *dst;	/* C_LEN bytes each, in device memory */
	__u64 pos;
	int *stop;		/* __atomic */
	int ok, partial, errs, bad, corrupt, bad_errno;
	double max_ms;
};

static void classify(struct resetter_io *w, int r, __u64 bytes, double ms)
{
	if (ms > w->max_ms)
		w->max_ms = ms;
	if (!r && bytes == C_LEN) {
		w->ok++;
	} else if (!r && bytes && bytes < C_LEN && !(bytes % LBS)) {
		w->partial++;
	} else if (r && io_errno(r)) {
		w->errs++;
	} else {
		w->bad++;
		w->bad_errno = r ? r : (int)bytes;
	}
}

static void *reset_io_main(void *arg)
{
	struct resetter_io *w = arg;
	struct p2pdirect_io out;

	for (int round = 0; !__atomic_load_n(w->stop, __ATOMIC_RELAXED); round++) {
		__u64 seed = SEED_C + w->id * 0x100 + (round & 0xff);
		double t;
		int r;

		fill_buf(w->src, C_LEN, w->pos, seed);
		t = now_ms();
		r = rw(w->dev, true, w->fd, 0, (uintptr_t)w->src, C_LEN, w->pos, 0, &out);
		classify(w, r, out.bytes, now_ms() - t);
		if (r || out.bytes != C_LEN)
			continue;
		t = now_ms();
		r = rw(w->dev, false, w->fd, 0, (uintptr_t)w->dst, C_LEN, w->pos, 0, &out);
		classify(w, r, out.bytes, now_ms() - t);
		if (!r && out.bytes <= C_LEN && fill_diff(w->dst, out.bytes, w->pos, seed))
			w->corrupt++;
	}
	return NULL;
}

/*
 * Three threads WRITE and READ back their own slices of NSID 1 while the
 * controller is reset three times: every I/O ends, with success (all or a
 * good prefix) or an I/O errno, data that was reported moved is right, and
 * afterwards every slice takes a verified WRITE and READ again.
 */
TEST_F_TIMEOUT(ft, c1_controller_reset_during_io, 300)
{
	struct resetter_io w[C_THREADS];
	struct dbuf b[C_THREADS];
	pthread_t t[C_THREADS];
	char path[PATH_MAX];
	int stop = 0, fd, resets = 0;

	snprintf(path, sizeof(path), "/sys/class/nvme/%s/reset_controller", self->ctrl);
	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	for (int i = 0; i < C_THREADS; i++) {
		ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[i % 2], 2 * C_LEN, &b[i]));
		w[i] = (struct resetter_io){ .dev = self->dev, .fd = fd, .id = i,
					     .src = b[i].p, .dst = b[i].p + C_LEN,
					     .pos = C_POS + i * C_STRIDE, .stop = &stop };
	}
	for (int i = 0; i < C_THREADS; i++)
		ASSERT_EQ(0, pthread_create(&t[i], NULL, reset_io_main, &w[i]));
	sleep_ms(300);
	for (int k = 0; k < 3; k++) {
		double t0 = now_ms();
		int r = sysfs_write(path, "1");

		TH_LOG("reset %d of %s: %s after %.0f ms", k + 1, self->ctrl,
		       r ? ename(r) : "done", now_ms() - t0);
		EXPECT_TRUE(r == 0 || r == -EBUSY) TH_LOG("reset_controller: %s", ename(r));
		resets += r == 0;
		sleep_ms(400);
	}
	/* At least one reset happened during the I/O (one may find another still under way). */
	EXPECT_LE(1, resets);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < C_THREADS; i++) {
		ASSERT_EQ(0, pthread_join(t[i], NULL));
		TH_LOG("thread %d: %d whole, %d partial, %d I/O errors, %d other, %d wrong data; slowest %.0f ms",
		       i, w[i].ok, w[i].partial, w[i].errs, w[i].bad, w[i].corrupt, w[i].max_ms);
		EXPECT_EQ(0, w[i].bad) TH_LOG("thread %d: a result that is no I/O errno: %d (%s)",
					      i, w[i].bad_errno,
					      w[i].bad_errno < 0 ? ename(w[i].bad_errno) : "bytes");
		EXPECT_EQ(0, w[i].corrupt);
		EXPECT_LT(0, w[i].ok + w[i].partial + w[i].errs);
	}
	/* Afterwards: verified I/O on every slice; the host gets the final state. */
	for (int i = 0; i < C_THREADS; i++) {
		__u64 seed = SEED_C + 0xf0 + i, pos = w[i].pos;
		struct p2pdirect_io out;

		fill_buf(w[i].src, C_LEN, pos, seed);
		EXPECT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)w[i].src, C_LEN, pos, 0, &out));
		EXPECT_EQ(C_LEN, out.bytes);
		EXPECT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)w[i].dst, C_LEN, pos, 0, &out));
		EXPECT_EQ(C_LEN, out.bytes);
		EXPECT_EQ(0u, fill_diff(w[i].dst, C_LEN, pos, seed));
		EXPECT_EQ(0u, ns_diff(fd, pos, C_LEN, seed));
		rec_nvme(pos, C_LEN, seed);
		zero_rec(&b[i], 0, 2 * C_LEN);
		EXPECT_EQ(0u, nonzero(b[i].map, GUARD) + nonzero(b[i].p + 2 * C_LEN, GUARD));
		EXPECT_EQ(0, dbuf_free(self->dev, &b[i]));
	}
	close(fd);
}

/* --- d: the GPU unbound during I/O -------------------------------------------- */

struct unbind_io {
	int dev, fd;
	__u32 flags;		/* P2PDIRECT_IO_REGISTERED or 0 */
	__u64 addr;		/* device pointer or registration id */
	int *stop;		/* __atomic */
	int ok, refused, bad, bad_errno;
};

static void *unbind_io_main(void *arg)
{
	struct unbind_io *u = arg;
	struct p2pdirect_io out;

	while (!__atomic_load_n(u->stop, __ATOMIC_RELAXED)) {
		int r = rw(u->dev, false, u->fd, u->flags, u->addr, D_LEN, D_POS, 0, &out);

		if (!r && out.bytes == D_LEN) {
			u->ok++;
		} else if (u->flags ? r == -ESTALE : r == -EFAULT) {
			u->refused++;
		} else {
			u->bad++;
			u->bad_errno = r ? r : (int)out.bytes;
		}
	}
	return NULL;
}

/*
 * READs into GPU 1 by device pointer and by registration while GPU 1 is
 * unbound from p2pdirect: the unbind waits for them; each READ ends with
 * success or the documented refusal (EFAULT for a pointer whose memory
 * went away, ESTALE for an invalidated registration); the old
 * mapping gets SIGBUS, the registration is DEAD, FREE still succeeds, ALLOC
 * on the old provider gets ENODEV. Bound again, GPU 1 is a provider with all
 * its memory free and a new ALLOC takes a verified READ.
 */
TEST_F_TIMEOUT(ft, d1_gpu_unbind_during_io, 300)
{
	const struct gpu *g = &self->gpu[1];
	struct p2pdirect_provider_info back;
	struct unbind_io u[2];
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	struct dbuf bp, br, nb;
	struct gpu again;
	pthread_t t[2];
	int stop = 0, fd, r;
	__u64 reg = 0;
	double t0;

	fd = open(self->ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ns_fill(fd, D_POS, D_LEN, SEED_D));
	rec_nvme(D_POS, D_LEN, SEED_D);
	/*
	 * Both buffers hold the source before the race, so whatever part of a
	 * READ lands during it writes the same bytes: the host's record stays true.
	 */
	ASSERT_EQ(0, dbuf_new(self->dev, g, D_LEN, &bp));
	ASSERT_EQ(0, dbuf_new(self->dev, g, D_LEN, &br));
	ASSERT_EQ(0, do_register(self->dev, br.p, D_LEN, P2PDIRECT_REG_WRITE, &reg));
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)bp.p, D_LEN, D_POS, 0, &out));
	ASSERT_EQ(D_LEN, out.bytes);
	ASSERT_EQ(0, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg, D_LEN, D_POS, 0,
			&out));
	ASSERT_EQ(D_LEN, out.bytes);
	EXPECT_EQ(0u, fill_diff(bp.p, D_LEN, D_POS, SEED_D));
	EXPECT_EQ(0u, fill_diff(br.p, D_LEN, D_POS, SEED_D));
	rec_ns(&bp, 0, D_LEN, D_POS, GUARD);
	rec_ns(&br, 0, D_LEN, D_POS, GUARD);

	u[0] = (struct unbind_io){ .dev = self->dev, .fd = fd, .addr = (uintptr_t)bp.p,
				   .stop = &stop };
	u[1] = (struct unbind_io){ .dev = self->dev, .fd = fd, .flags = P2PDIRECT_IO_REGISTERED,
				   .addr = reg, .stop = &stop };
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(0, pthread_create(&t[i], NULL, unbind_io_main, &u[i]));
	sleep_ms(300);
	t0 = now_ms();
	r = sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", g->bdf);
	TH_LOG("unbind %s: %s after %.0f ms", g->bdf, r ? ename(r) : "done", now_ms() - t0);
	sleep_ms(200);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(0, pthread_join(t[i], NULL));
	ASSERT_EQ(0, r);
	for (int i = 0; i < 2; i++) {
		TH_LOG("%s READs: %d done, %d refused after the unbind, %d other",
		       i ? "registered" : "pointer", u[i].ok, u[i].refused, u[i].bad);
		EXPECT_EQ(0, u[i].bad) TH_LOG("%s READ ended with %d (%s)",
					      i ? "registered" : "pointer", u[i].bad_errno,
					      u[i].bad_errno < 0 ? ename(u[i].bad_errno) : "bytes");
		EXPECT_LT(0, u[i].ok);
		EXPECT_LT(0, u[i].refused);
	}

	/* The memory went away from everyone. */
	EXPECT_EQ(SIGBUS, touch(bp.p));
	EXPECT_EQ(SIGBUS, touch(br.p));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_op(self->dev, reg, false));
	EXPECT_EQ(-ENOENT, provider_of(self->dev, g->pci, &back));
	EXPECT_EQ(-ENODEV, do_alloc(self->dev, g, D_LEN, &a));
	EXPECT_EQ(-ESTALE, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg, D_LEN, D_POS, 0,
			      NULL));
	r = rw(self->dev, false, fd, 0, (uintptr_t)bp.p, D_LEN, D_POS, 0, NULL);
	EXPECT_EQ(-EFAULT, r) TH_LOG("READ into the old pointer: %s", ename(r));
	EXPECT_EQ(0, do_free(self->dev, bp.a.handle));
	EXPECT_EQ(0, do_free(self->dev, br.a.handle));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_op(self->dev, reg, true));
	munmap(bp.map, bp.a.size);
	munmap(br.map, br.a.size);

	/* Back again: a new provider, all free, and it works. */
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", g->bdf));
	ASSERT_EQ(0, provider_of(self->dev, g->pci, &back));
	EXPECT_EQ(back.bytes_total, back.bytes_free);
	EXPECT_EQ(0u, back.bytes_used);
	again = *g;
	again.index = back.index;
	/* Where both old buffers were (all of it is free: first fit, from 0). */
	ASSERT_EQ(0, dbuf_new(self->dev, &again, 2 * D_LEN + 2 * GUARD, &nb));
	EXPECT_EQ(0u, nb.a.provider_offset);
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)nb.p, D_LEN, D_POS, 0, &out));
	EXPECT_EQ(D_LEN, out.bytes);
	EXPECT_EQ(D_LEN, out.p2p_bytes);
	EXPECT_EQ(0u, fill_diff(nb.p, D_LEN, D_POS, SEED_D));
	EXPECT_EQ(0u, nonzero(nb.map, GUARD) + nonzero(nb.p + D_LEN, nb.len - D_LEN + GUARD));
	rec_ns(&nb, 0, D_LEN, D_POS, GUARD);
	/*
	 * Leave GPU 1 as any later ALLOC leaves it, zero: ALLOC zeroes without
	 * a host record, which would otherwise contradict these records.
	 */
	zero_rec(&nb, 0, D_LEN);
	EXPECT_EQ(0, dbuf_free(self->dev, &nb));
	close(fd);
}

/* --- e: rmmod while the module is in use (last: it may take the module away) -- */

#define UNLOADED_FLAG "/tmp/p2pdirect-fault-unloaded"

/* "In use": EWOULDBLOCK from a reference count that is not 0, EBUSY while it goes. */
static bool in_use(int r)
{
	return r == -EWOULDBLOCK || r == -EBUSY;
}

/*
 * The module went away under an open file: load it again so that the suites
 * after this one run (the file's holder never closes it: its release
 * callback is gone with the module).
 */
static int reload(void)
{
	char params[64] = "max_pinned_mib=96";
	const char *ko = getenv("P2PDIRECT_KO") ?: "/p2pdirect.ko";
	int fd = open(ko, O_RDONLY | O_CLOEXEC), r;

	if (getenv("P2PDIRECT_KO_PARAMS"))
		snprintf(params, sizeof(params), "%s", getenv("P2PDIRECT_KO_PARAMS"));
	if (fd < 0)
		return -errno;
	r = syscall(SYS_finit_module, fd, params, 0) ? -errno : 0;
	close(fd);
	close(open(UNLOADED_FLAG, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	printf("# %s unloaded under a user: loaded again (%s %s): %s\n", MODULE_NAME, ko, params,
	       r ? ename(r) : "ok");
	return r;
}

/*
 * A process that holds the module the way @what says, then waits for a
 * byte: 'x' lets go and exits 0 (or 1 if what it held no longer works), 'f'
 * (the module was unloaded) keeps everything forever, so that nothing calls
 * into the code that is gone.
 */
struct holder {
	pid_t pid;
	int cmd, ready;		/* pipes: to it, from it */
};

enum hold { HOLD_OPEN, HOLD_MAPPING, HOLD_IO };

struct hold_io {
	int dev, fd;
	__u8 *p;		/* E_LEN / 2 bytes of device memory */
	__u64 pos;
	int *stop;		/* __atomic */
	int ok, failed;
};

static void *hold_io_main(void *arg)
{
	struct hold_io *h = arg;
	struct p2pdirect_io out;

	while (!__atomic_load_n(h->stop, __ATOMIC_RELAXED)) {
		int r = rw(h->dev, false, h->fd, 0, (uintptr_t)h->p, E_LEN / 2, h->pos, 0, &out);

		if (!r && out.bytes == E_LEN / 2 && !fill_diff(h->p, E_LEN / 2, h->pos, SEED_E))
			h->ok++;
		else
			h->failed++;
	}
	return NULL;
}

/* NSID 1's node, for HOLD_IO. */
static char hold_ns1[64];

static int hold(enum hold what, int cmd, int ready)
{
	struct hold_io io[2];
	pthread_t t[2];
	int dev, stop = 0, fd = -1, bad = 0;
	struct dbuf b;
	char c = 'r';

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return 10;
	if (what != HOLD_OPEN) {
		struct gpu g[2];

		if (find_gpus(dev, g) < 1 || dbuf_new(dev, &g[0], E_LEN, &b))
			return 11;
	}
	if (what == HOLD_MAPPING)
		close(dev);
	if (what == HOLD_IO) {
		fd = open(hold_ns1, O_RDONLY | O_DIRECT | O_CLOEXEC);
		if (fd < 0)
			return 12;
		for (int i = 0; i < 2; i++) {
			io[i] = (struct hold_io){ .dev = dev, .fd = fd, .p = b.p + i * E_LEN / 2,
						  .pos = E_POS + i * E_LEN / 2, .stop = &stop };
			if (pthread_create(&t[i], NULL, hold_io_main, &io[i]))
				return 13;
		}
		sleep_ms(100);
	}
	if (write(ready, &c, 1) != 1 || read(cmd, &c, 1) != 1)
		c = 'x';
	if (c == 'f') {
		/* Never let go: closing would call into the unloaded module. */
		close(0);
		close(1);
		close(2);
		for (;;)
			pause();
	}
	if (what == HOLD_IO) {
		__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
		for (int i = 0; i < 2; i++) {
			pthread_join(t[i], NULL);
			printf("# I/O thread %d: %d READs done and checked, %d failed\n", i,
			       io[i].ok, io[i].failed);
			bad |= io[i].failed || !io[i].ok;
		}
		close(fd);
	}
	if (what != HOLD_OPEN) {
		/* Leave it as the host was told (dbuf_new's record). */
		if (touch(b.p))
			bad = 1;
		else
			memset(b.map, 0, b.a.size);
		munmap(b.map, b.a.size);
	}
	if (what != HOLD_MAPPING)
		close(dev);
	return bad;
}

static int holder_start(struct holder *h, enum hold what)
{
	int to[2], from[2];
	char c;

	if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC))
		return -errno;
	fflush(stdout);
	h->pid = fork();
	if (h->pid < 0)
		return -errno;
	if (!h->pid) {
		close(to[1]);
		close(from[0]);
		_exit(hold(what, to[0], from[1]));
	}
	close(to[0]);
	close(from[1]);
	h->cmd = to[1];
	h->ready = from[0];
	return read(h->ready, &c, 1) == 1 && c == 'r' ? 0 : -EIO;
}

/* Tells the holder to let go ('x') or to keep everything ('f'); its exit status or -1. */
static int holder_stop(struct holder *h, char how)
{
	int status = 0;

	if (write(h->cmd, &how, 1) != 1)
		return -1;
	close(h->cmd);
	close(h->ready);
	if (how == 'f')
		return 0;
	if (waitpid(h->pid, &status, 0) != h->pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/*
 * rmmod while a process holds the module: refused as "in use"; the
 * holder's things still work. The test modules, which use p2pdirect's
 * exported symbols, keep rmmod from unloading it whatever else holds it: what the holder holds is
 * shown by the module's reference count, one above what it was before
 * while the holder holds it, and back to it once the holder is gone.
 */
static void rmmod_refused(struct __test_metadata *_metadata, enum hold what, int tries)
{
	int base = module_refs(), unloaded = 0, r;
	struct holder h;

	ASSERT_LE(0, base);
	ASSERT_EQ(0, holder_start(&h, what)) TH_LOG("the holder did not get ready");
	EXPECT_LT(base, module_refs()) TH_LOG("the holder's %s does not hold the module",
					      what == HOLD_OPEN ? "file" :
					      what == HOLD_MAPPING ? "mapping" : "I/O");
	for (int i = 0; i < tries && !unloaded; i++) {
		if (i)
			sleep_ms(150);
		r = try_rmmod();
		printf("# rmmod %s: %s\n", MODULE_NAME, r ? ename(r) : "unloaded");
		if (!r) {
			unloaded = 1;
		} else {
			EXPECT_TRUE(in_use(r)) TH_LOG("rmmod: %s, want EWOULDBLOCK (in use)",
						      ename(r));
		}
	}
	if (unloaded) {
		EXPECT_EQ(0, holder_stop(&h, 'f'));
		EXPECT_EQ(0, reload());
		EXPECT_FALSE(unloaded) TH_LOG("rmmod unloaded the module while it was in use");
		return;
	}
	EXPECT_EQ(0, holder_stop(&h, 'x')) TH_LOG("what the holder held stopped working");
	EXPECT_EQ(base, module_refs()) TH_LOG("the holder is gone, the module still held");
}

/*
 * A fixture that holds nothing, so that only the holder process (and the
 * test modules, which use the module's symbols) keeps the module; defined
 * last, so that its cases run after all of ft's.
 */
FIXTURE(rm) {
	char ns1[64];
};

FIXTURE_SETUP(rm)
{
	char ctrl[32];

	setvbuf(stdout, NULL, _IOLBF, 0);
	ASSERT_TRUE(find_ns1(self->ns1, sizeof(self->ns1), ctrl, sizeof(ctrl)));
}

FIXTURE_TEARDOWN(rm)
{
}

TEST_F(rm, e1_rmmod_refused_while_open)
{
	rmmod_refused(_metadata, HOLD_OPEN, 1);
}

TEST_F(rm, e2_rmmod_refused_while_mapped)
{
	rmmod_refused(_metadata, HOLD_MAPPING, 1);
}

/*
 * rmmod during READs, five times: refused each time, the READs all complete
 * with the right data. An unload here would pull the code from under a
 * running ioctl and crash the guest: if an earlier case saw the module go
 * away while in use, this one fails without trying.
 */
TEST_F(rm, e3_rmmod_refused_during_io)
{
	int fd;

	ASSERT_NE(0, access(UNLOADED_FLAG, F_OK))
		TH_LOG("not tried: the module unloaded while in use above; during I/O that would crash the guest");
	snprintf(hold_ns1, sizeof(hold_ns1), "%s", self->ns1);
	fd = open(hold_ns1, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ns_fill(fd, E_POS, E_LEN, SEED_E));
	rec_nvme(E_POS, E_LEN, SEED_E);
	close(fd);
	rmmod_refused(_metadata, HOLD_IO, 5);
}

TEST_HARNESS_MAIN
