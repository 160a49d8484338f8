// SPDX-License-Identifier: GPL-2.0
/*
 * Careless and hostile use of /dev/p2pdirect (kselftest harness, TAP on
 * stdout): module lifetime, sizes that must not reach an allocation, zeroed
 * ALLOC, open modes, read(2)/write(2) parity on raw block devices, complete
 * invalidation, no side effect of a failed call, resource bounds, honest
 * accounting of CPU-copied bytes, refaults of live mappings, kernel memory
 * charged to the caller's memory cgroup.
 *
 * Every byte written to GPU memory is reported to the host in the record
 * format of ci/hostcheck.py (whole allocations as "zero" when made, as ALLOC
 * hands them out zeroed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"
#include "testmod_util.h"

#define DEV_PATH "/dev/p2pdirect"
#define KiB (1ull << 10)
#define MiB (1ull << 20)
/* The guest loads the module with max_pinned_mib=96. */
#define PIN_CAP (96 * MiB)
#define MAX_REGS 4096

struct gpu {
	__u32 index;
	__u32 pci;
	char bdf[32];
};

FIXTURE(hd) {
	int dev;
	struct gpu gpu[2];
	char ns1[64];
	char sw_pci[256];
};

FIXTURE_SETUP(hd)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	char ns[64];
	int g = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	self->dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->dev, 0) TH_LOG("open %s: %s", DEV_PATH, strerror(errno));
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8 && g < 2; i++) {
		if (p[i].kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		self->gpu[g].index = p[i].index;
		self->gpu[g].pci = p[i].pci_addr;
		pci_name(p[i].pci_addr, self->gpu[g].bdf, sizeof(self->gpu[g].bdf));
		g++;
	}
	ASSERT_EQ(2, g) TH_LOG("need two emulated GPUs");
	ASSERT_TRUE(find_nvme_nsid(1, self->ns1, sizeof(self->ns1), NULL));
	ASSERT_TRUE(find_nvme("p2pnvme-sw", ns, sizeof(ns), self->sw_pci));
}

FIXTURE_TEARDOWN(hd)
{
	close(self->dev);
}

static int alloc_on(int dev, const struct gpu *g, __u64 size, struct p2pdirect_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->provider = g->index;
	a->size = size;
	if (ioctl(dev, P2PDIRECT_IOC_ALLOC, a))
		return -errno;
	/* ALLOC hands out zeroed memory: that is what the host must find. */
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)a->provider_offset, (unsigned long long)a->size);
	return 0;
}

static int free_handle(int dev, __u64 handle)
{
	struct p2pdirect_free f = { .handle = handle };

	return ioctl(dev, P2PDIRECT_IOC_FREE, &f) ? -errno : 0;
}

static void *map_alloc(int dev, const struct p2pdirect_alloc *a)
{
	return mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, dev, a->mmap_offset);
}

static int reg(int dev, const void *addr, __u64 size, __u64 *id)
{
	struct p2pdirect_register r = {
		.addr = (uintptr_t)addr, .size = size, .flags = P2PDIRECT_REG_WRITE,
	};

	if (ioctl(dev, P2PDIRECT_IOC_REGISTER, &r))
		return -errno;
	if (id)
		*id = r.id;
	return 0;
}

static int reg_state(int dev, __u64 id)
{
	struct p2pdirect_reg_id q = { .id = id };

	return ioctl(dev, P2PDIRECT_IOC_REG_QUERY, &q) ? -errno : (int)q.state;
}

static int io(int dev, bool write, int fd, __u32 flags, __u64 addr, __u64 size, __u64 foff,
	      struct p2pdirect_io *out)
{
	struct p2pdirect_io req = {
		.fd = fd, .flags = flags, .addr = addr, .size = size, .file_offset = foff,
	};
	int r = ioctl(dev, write ? P2PDIRECT_IOC_WRITE : P2PDIRECT_IOC_READ, &req) ? -errno : 0;

	if (out)
		*out = req;
	return r;
}

static int probe(int dev, int fd, const void *addr, __u64 size)
{
	struct p2pdirect_dma_seg segs[4];
	struct p2pdirect_dma_probe p = {
		.fd = fd, .addr = (uintptr_t)addr, .size = size,
		.segs = (uintptr_t)segs, .capacity = 4,
	};

	return ioctl(dev, P2PDIRECT_IOC_DMA_PROBE, &p) ? -errno : 0;
}

static __u64 nonzero(const __u8 *p, __u64 len)
{
	__u64 n = 0;

	for (__u64 i = 0; i < len; i++)
		n += p[i] != 0;
	return n;
}

static sigjmp_buf bus_jmp;

static void on_bus(int sig)
{
	siglongjmp(bus_jmp, sig);
}

/* Reads every byte of [p, p + len) the CPU way: SIGBUS, or -1 if none. */
static int read_all(const __u8 *p, __u64 len, __u64 *sum)
{
	int sig;

	signal(SIGBUS, on_bus);
	sig = sigsetjmp(bus_jmp, 1);
	if (!sig) {
		__u64 t = 0;

		for (__u64 i = 0; i < len; i++)
			t += __atomic_load_n(&p[i], __ATOMIC_RELAXED) * (i + 1);
		*sum = t;
		sig = -1;
	}
	signal(SIGBUS, SIG_DFL);
	return sig;
}

/* A page mapped read-only: arguments there cannot take a result. */
static void *ro_page(const void *content, size_t len)
{
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memcpy(p, content, len);
	if (mprotect(p, 4096, PROT_READ)) {
		munmap(p, 4096);
		return NULL;
	}
	return p;
}

/* --- 1. module lifetime ------------------------------------------------------ */

/*
 * An open /dev/p2pdirect holds the module: rmmod fails, "in use". (The test
 * modules, which use its symbols, hold it too: the reference count shows
 * what an open file adds.)
 */
TEST_F(hd, rmmod_refused_while_open)
{
	int base = module_refs(), fd, r;

	ASSERT_LE(1, base);
	fd = open(DEV_PATH, O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	EXPECT_EQ(base + 1, module_refs());
	close(fd);
	EXPECT_EQ(base, module_refs());
	r = try_rmmod();
	EXPECT_TRUE(r == -EWOULDBLOCK || r == -EBUSY) TH_LOG("delete_module: %s", strerror(-r));
	ASSERT_NE(0, r) TH_LOG("the module unloaded under an open file");
}

/* A live mapping holds its file, and so the module, after close. */
TEST(rmmod_refused_while_mapped)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_alloc a = { .size = 64 * KiB };
	int dev, r, base = module_refs();
	__u8 *m;

	ASSERT_LE(1, base);
	dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(dev, 0);
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR) {
			a.provider = p[i].index;
			break;
		}
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_ALLOC, &a));
	m = mmap(NULL, a.size, PROT_READ, MAP_SHARED, dev, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, (void *)m);
	close(dev);
	/* The mapping holds the file, and the file the module. */
	EXPECT_EQ(base + 1, module_refs());
	r = try_rmmod();
	ASSERT_NE(0, r) TH_LOG("the module unloaded under a live mapping");
	EXPECT_TRUE(r == -EWOULDBLOCK || r == -EBUSY);
	/* The mapping still works (and is zeroed memory). */
	EXPECT_EQ(0u, nonzero(m, a.size));
	munmap(m, a.size);
	EXPECT_EQ(base, module_refs());
}

/* --- 2. no user-sized kernel allocation -------------------------------------- */

/* Huge sizes on a device-memory pointer: refused before any allocation. */
TEST_F(hd, huge_sizes_on_device_memory)
{
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	__u8 *m;
	int ns;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	ns = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(ns, 0);
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m, 1ull << 50));
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)m, 1ull << 50, 0, &out));
	EXPECT_EQ(-EDQUOT, reg(self->dev, m, 1ull << 50, NULL));
	EXPECT_EQ(-EDQUOT, reg(self->dev, m, PIN_CAP + 4096, NULL));
	close(ns);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/*
 * Memory a READ (or a REGISTER with REG_WRITE, a DMA_PROBE with PROBE_WRITE)
 * would have the device write is pinned for writing: a read-only mapping of
 * it is EFAULT, as is a mapping whose allocation was freed (it stays until
 * munmap, its pages gone). A read-only mapping still serves what only reads
 * it (REGISTER without REG_WRITE, DMA_PROBE without PROBE_WRITE).
 */
TEST_F(hd, read_only_and_freed_mappings_efault)
{
	struct p2pdirect_dma_seg segs[4];
	struct p2pdirect_dma_probe pr = { .size = 4096, .segs = (uintptr_t)segs, .capacity = 4 };
	struct p2pdirect_alloc a, b;
	struct p2pdirect_reg_id id = { 0 };
	__u8 *ro, *gone;
	int ns;

	ns = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(ns, 0);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	ro = mmap(NULL, a.size, PROT_READ, MAP_SHARED, self->dev, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, (void *)ro);
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)ro, 4096, 0, NULL));
	EXPECT_EQ(-EFAULT, reg(self->dev, ro, 4096, NULL));
	pr.fd = ns;
	pr.addr = (uintptr_t)ro;
	pr.flags = P2PDIRECT_PROBE_WRITE;
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_DMA_PROBE, &pr));
	EXPECT_EQ(EFAULT, errno);
	pr.flags = 0;
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DMA_PROBE, &pr)) TH_LOG("%s", strerror(errno));
	{
		struct p2pdirect_register r = { .addr = (uintptr_t)ro, .size = 4096 };

		EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &r)) TH_LOG("%s",
										  strerror(errno));
		id.id = r.id;
		EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER, &id));
	}
	EXPECT_EQ(0u, nonzero(ro, a.size));
	munmap(ro, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &b));
	gone = map_alloc(self->dev, &b);
	ASSERT_NE(MAP_FAILED, gone);
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)gone, 4096, 0, NULL));
	EXPECT_EQ(-EFAULT, reg(self->dev, gone, 4096, NULL));
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, gone, 4096));
	munmap(gone, b.size);
	close(ns);
}

/*
 * A user mapping of another driver's P2PDMA memory (the NVMe CMB through
 * sysfs) with a huge size is refused before anything is pinned or allocated,
 * never a kvmalloc of gigabytes: the range runs out of the mapping (EFAULT,
 * since ABI 1.11, as for p2pdirect's own mappings; before, max_pinned_mib's
 * EDQUOT came first), and REGISTER's quota of the file comes before that.
 */
TEST_F(hd, huge_sizes_on_p2pmem_mapping)
{
	char path[300];
	struct p2pdirect_io out;
	void *m;
	int f, ns;

	snprintf(path, sizeof(path), "%s/p2pmem/allocate", self->sw_pci);
	f = open(path, O_RDWR);
	ASSERT_GE(f, 0) TH_LOG("open %s: %s", path, strerror(errno));
	m = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
	ASSERT_NE(MAP_FAILED, m);
	ns = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(ns, 0);
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m, 1ull << 40));
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m, PIN_CAP + 4096));
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)m, 1ull << 40, 0, &out));
	EXPECT_EQ(-EDQUOT, reg(self->dev, m, 1ull << 40, NULL));
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m, 2 * MiB));
	EXPECT_EQ(0, probe(self->dev, ns, m, 64 * KiB));
	close(ns);
	munmap(m, 64 * KiB);
	close(f);
}

/* --- 3. ALLOC hands out zeroed memory ---------------------------------------- */

TEST_F(hd, alloc_is_zeroed_between_users)
{
	struct p2pdirect_alloc a, b;
	__u8 *m;
	pid_t pid;
	int st;

	/* Another process writes a secret and exits (its file closes). */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int dev = open(DEV_PATH, O_RDWR);

		if (dev < 0 || alloc_on(dev, &self->gpu[1], 1 * MiB, &a))
			_exit(1);
		m = map_alloc(dev, &a);
		if (m == MAP_FAILED)
			_exit(2);
		/* Unrecorded: the parent's ALLOC must zero it again. */
		memset(m, 0x5a, a.size);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	ASSERT_EQ(0, WEXITSTATUS(st));
	/* The same memory (first fit) comes back zeroed. */
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 1 * MiB, &b));
	m = map_alloc(self->dev, &b);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(0u, nonzero(m, b.size));
	/* And within one file: write, FREE, ALLOC again. */
	memset(m, 0xa5, b.size);
	munmap(m, b.size);
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 1 * MiB, &b));
	m = map_alloc(self->dev, &b);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(0u, nonzero(m, b.size));
	munmap(m, b.size);
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
}

/* --- 4. open mode ---------------------------------------------------------------- */

TEST_F(hd, read_only_open_may_only_look)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers lp = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_stat rows[16];
	struct p2pdirect_stats s = { .entries = (uintptr_t)rows, .capacity = 16 };
	struct p2pdirect_version v;
	struct p2pdirect_alloc a = { .provider = self->gpu[0].index, .size = 4096 };
	struct p2pdirect_free f = { .handle = 1 };
	struct p2pdirect_reg_id q = { .id = 1 };
	struct p2pdirect_io rd = { .fd = 0, .size = 4096 };
	int ro = open(DEV_PATH, O_RDONLY | O_CLOEXEC);

	ASSERT_GE(ro, 0);
	EXPECT_EQ(0, ioctl(ro, P2PDIRECT_IOC_GET_VERSION, &v));
	EXPECT_EQ(0, ioctl(ro, P2PDIRECT_IOC_LIST_PROVIDERS, &lp));
	EXPECT_EQ(0, ioctl(ro, P2PDIRECT_IOC_STATS, &s));
	s.flags = P2PDIRECT_STATS_RESET;
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EBADF, errno);
	/* The open mode before the pad and the flags (ABI 1.13). */
	s.pad = 1;
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EBADF, errno);
	s.flags = P2PDIRECT_STATS_RESET | 2;
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EBADF, errno);
	s.flags = 0;
	s.pad = 0;
	/* STATS may be read, so its argument is read first: EFAULT. */
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_STATS, NULL));
	EXPECT_EQ(EFAULT, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_ALLOC, &a));
	EXPECT_EQ(EBADF, errno);
	/* The open mode before the argument pointer. */
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_ALLOC, NULL));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_FREE, &f));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_DEREGISTER, &q));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_READ, &rd));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_WRITE, &rd));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-EBADF, reg(ro, &v, 16, NULL));
	EXPECT_EQ(-EBADF, probe(ro, 0, &v, 16));
	/* Not a command at all: still ENOTTY. */
	EXPECT_EQ(-1, ioctl(ro, _IOWR(P2PDIRECT_IOCTL_MAGIC, 0xef, struct p2pdirect_version), &v));
	EXPECT_EQ(ENOTTY, errno);
	close(ro);
}

/* STATS on a writable file: a non-zero pad or an unknown flag is EINVAL. */
TEST_F(hd, stats_refuses_pad_and_unknown_flags)
{
	struct p2pdirect_stat rows[16];
	struct p2pdirect_stats s = { .entries = (uintptr_t)rows, .capacity = 16 };

	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_STATS, &s));
	s.pad = 1;
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EINVAL, errno);
	s.pad = 0;
	s.flags = 2;
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EINVAL, errno);
	s.flags = P2PDIRECT_STATS_RESET | 2;
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EINVAL, errno);
}

/*
 * Access mode 3 (O_ACCMODE: neither read nor write, ioctl only) may look
 * but not change anything, as O_RDONLY (since ABI 1.13; before, it passed
 * for writable).
 */
TEST_F(hd, access_mode_3_may_only_look)
{
	struct p2pdirect_alloc a = { .provider = self->gpu[0].index, .size = 4096 };
	struct p2pdirect_stat rows[16];
	struct p2pdirect_stats s = { .entries = (uintptr_t)rows, .capacity = 16 };
	struct p2pdirect_version v;
	int f = open(DEV_PATH, O_ACCMODE | O_CLOEXEC);

	ASSERT_GE(f, 0) TH_LOG("open with access mode 3: %s", strerror(errno));
	EXPECT_EQ(0, ioctl(f, P2PDIRECT_IOC_GET_VERSION, &v));
	EXPECT_EQ(0, ioctl(f, P2PDIRECT_IOC_STATS, &s));
	s.flags = P2PDIRECT_STATS_RESET;
	EXPECT_EQ(-1, ioctl(f, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EBADF, errno);
	EXPECT_EQ(-1, ioctl(f, P2PDIRECT_IOC_ALLOC, &a));
	EXPECT_EQ(EBADF, errno);
	close(f);
}

/* --- 5. read(2)/write(2) parity on raw block devices --------------------------- */

static int sh(const char *cmd)
{
	int r = system(cmd);

	return WIFEXITED(r) ? WEXITSTATUS(r) : -1;
}

/* Attaches @file to the next free loop device, whose path goes to @loop. */
static int new_loop(const char *file, char *loop, size_t len)
{
	char cmd[200];
	FILE *p = popen("losetup -f", "r");

	if (!p)
		return -1;
	if (!fgets(loop, len, p)) {
		pclose(p);
		return -1;
	}
	pclose(p);
	loop[strcspn(loop, "\n")] = 0;
	snprintf(cmd, sizeof(cmd), "losetup %s %s", loop, file);
	return sh(cmd);
}

/* What write(2) and WRITE (direct, and COMPAT) said to a 4 KiB write. */
struct refusals {
	int pwrite, write, compat;
};

/*
 * Writes 4 KiB at @at of the block device open as @fd every way; -1: setup
 * failed. Closes @fd.
 */
static int try_writes(int dev, const struct gpu *g, int fd, __u64 at, struct refusals *r)
{
	struct p2pdirect_alloc a;
	int ret = -1;
	void *buf;
	__u8 *m;

	if (alloc_on(dev, g, 64 * KiB, &a))
		return -1;
	m = map_alloc(dev, &a);
	if (m != MAP_FAILED && fd >= 0 && !posix_memalign(&buf, 4096, 4096)) {
		memset(buf, 0, 4096);
		r->pwrite = pwrite(fd, buf, 4096, at) < 0 ? errno : 0;
		r->write = -io(dev, true, fd, 0, (uintptr_t)m, 4096, at, NULL);
		r->compat = -io(dev, true, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 4096, at, NULL);
		free(buf);
		ret = 0;
	}
	if (fd >= 0)
		close(fd);
	if (m != MAP_FAILED)
		munmap(m, a.size);
	free_handle(dev, a.handle);
	return ret;
}

/* A loop device over a file in /tmp, made into active swap: ETXTBSY. */
TEST_F(hd, active_swap_device_etxtbsy)
{
	char loop[64] = "", cmd[200];
	struct refusals r;

	ASSERT_EQ(0, sh("dd if=/dev/zero of=/tmp/swap.img bs=1M count=8 2>/dev/null"));
	ASSERT_EQ(0, new_loop("/tmp/swap.img", loop, sizeof(loop)));
	snprintf(cmd, sizeof(cmd), "mkswap %s >/dev/null && swapon %s", loop, loop);
	ASSERT_EQ(0, sh(cmd)) TH_LOG("swapon %s failed", loop);
	EXPECT_EQ(0, try_writes(self->dev, &self->gpu[0], open(loop, O_RDWR | O_DIRECT), 1 * MiB,
				&r));
	EXPECT_EQ(ETXTBSY, r.pwrite);
	EXPECT_EQ(ETXTBSY, r.write);
	EXPECT_EQ(ETXTBSY, r.compat);
	snprintf(cmd, sizeof(cmd), "swapoff %s && losetup -d %s && rm -f /tmp/swap.img", loop, loop);
	EXPECT_EQ(0, sh(cmd));
}

/*
 * A file's end is found by its file system, in the read: a READ at or past
 * it is checked like any other (the header's word). On a loop device, whose
 * queue takes no P2PDMA pages, it is refused like a READ of data, and with
 * COMPAT it moves 0 bytes.
 */
TEST_F(hd, file_read_at_eof_is_checked_like_any_read)
{
	char loop[64] = "", cmd[300];
	struct p2pdirect_io out;
	struct p2pdirect_alloc a;
	__u8 *m;
	int fd;

	ASSERT_EQ(0, sh("dd if=/dev/zero of=/tmp/eof.img bs=1M count=8 2>/dev/null"));
	ASSERT_EQ(0, new_loop("/tmp/eof.img", loop, sizeof(loop)));
	snprintf(cmd, sizeof(cmd), "mke2fs -q %s >/dev/null 2>&1", loop);
	ASSERT_EQ(0, sh(cmd)) TH_LOG("mke2fs %s failed", loop);
	snprintf(cmd, sizeof(cmd), "mkdir -p /tmp/eofmnt && mount -t ext4 %s /tmp/eofmnt", loop);
	ASSERT_EQ(0, sh(cmd)) TH_LOG("mount of %s failed", loop);
	ASSERT_EQ(0, sh("dd if=/dev/zero of=/tmp/eofmnt/f bs=4096 count=2 2>/dev/null && sync"));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	fd = open("/tmp/eofmnt/f", O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	EXPECT_EQ(-EOPNOTSUPP, io(self->dev, false, fd, 0, (uintptr_t)m, 4096, 0, NULL));
	for (__u64 at = 8192; at <= MiB; at += MiB - 8192) {
		EXPECT_EQ(-EOPNOTSUPP, io(self->dev, false, fd, 0, (uintptr_t)m, 4096, at, NULL));
		EXPECT_EQ(0, io(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 4096, at,
				&out)) TH_LOG("COMPAT at %llu", (unsigned long long)at);
		EXPECT_EQ(0u, out.bytes);
		EXPECT_EQ(0u, out.bounce_bytes);
	}
	/* The memory is checked first: host memory is refused there too. */
	EXPECT_EQ(-ENXIO, io(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)cmd & ~4095ull,
			     4096, 8192, NULL));
	close(fd);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	snprintf(cmd, sizeof(cmd), "umount /tmp/eofmnt && losetup -d %s && rm -f /tmp/eof.img", loop);
	EXPECT_EQ(0, sh(cmd));
}

static int sigio_seen;	/* atomic: a signal handler counts */

static void on_sigio(int sig)
{
	(void)sig;
	__atomic_fetch_add(&sigio_seen, 1, __ATOMIC_SEQ_CST);
}

/*
 * A file whose only opener holds a write lease on it: read(2) breaks no
 * lease, and neither does READ (since ABI 1.16). The private open that
 * counts a READ's holes would break it: SIGIO to the caller (whose default
 * action kills) and a wait for itself. With a lease the holes are not
 * counted; without one they are.
 */
TEST_F(hd, file_read_keeps_the_callers_lease)
{
	static const char *const files[] = { "/mnt/ext4/lease.bin", "/mnt/xfs/lease.bin" };
	struct sigaction sa = { .sa_handler = on_sigio };
	struct p2pdirect_io out;
	struct p2pdirect_alloc a;
	void *zeros;
	__u8 *m;

	ASSERT_EQ(0, sigaction(SIGIO, &sa, NULL));
	ASSERT_EQ(0, posix_memalign(&zeros, 4096, 64 * KiB));
	memset(zeros, 0, 64 * KiB);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 128 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	for (int i = 0; i < 2; i++) {
		int fd = open(files[i], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);

		ASSERT_GE(fd, 0) TH_LOG("%s: %s", files[i], strerror(errno));
		/* [0, 64K) data (zeros: the memory stays as ALLOC left it), then a hole. */
		ASSERT_EQ((ssize_t)(64 * KiB), pwrite(fd, zeros, 64 * KiB, 0));
		ASSERT_EQ(0, ftruncate(fd, 128 * KiB));
		ASSERT_EQ(0, fsync(fd));
		ASSERT_EQ(0, fcntl(fd, F_SETLEASE, F_WRLCK)) TH_LOG("%s: %s", files[i],
								  strerror(errno));
		__atomic_store_n(&sigio_seen, 0, __ATOMIC_SEQ_CST);
		ASSERT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 128 * KiB, 0, &out));
		EXPECT_EQ(128 * KiB, out.bytes);
		EXPECT_EQ(0u, out.zeroed_bytes);
		EXPECT_EQ(128 * KiB, out.p2p_bytes);
		EXPECT_EQ(0, __atomic_load_n(&sigio_seen, __ATOMIC_SEQ_CST))
			TH_LOG("%s: the READ broke the caller's lease", files[i]);
		EXPECT_EQ(F_WRLCK, fcntl(fd, F_GETLEASE)) TH_LOG("%s", files[i]);
		ASSERT_EQ((ssize_t)(128 * KiB), pread(fd, m, 128 * KiB, 0));
		EXPECT_EQ(0, __atomic_load_n(&sigio_seen, __ATOMIC_SEQ_CST));
		EXPECT_EQ(F_WRLCK, fcntl(fd, F_GETLEASE));
		/* Without the lease the hole is counted. */
		ASSERT_EQ(0, fcntl(fd, F_SETLEASE, F_UNLCK));
		ASSERT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 128 * KiB, 0, &out));
		EXPECT_EQ(64 * KiB, out.zeroed_bytes);
		EXPECT_EQ(64 * KiB, out.p2p_bytes);
		/*
		 * The file stays: its blocks, written from host memory and then
		 * freed, could go to a later test's file, whose DMACHECK of the
		 * same blocks would find that write in the NVMe trace.
		 */
		close(fd);
	}
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	free(zeros);
}

/* A read-only block device: write(2) says EPERM, so does WRITE. */
TEST_F(hd, read_only_block_device_eperm)
{
	char loop[64] = "", cmd[200];
	struct refusals r;
	int fd;

	ASSERT_EQ(0, sh("dd if=/dev/zero of=/tmp/ro.img bs=1M count=4 2>/dev/null"));
	ASSERT_EQ(0, new_loop("/tmp/ro.img", loop, sizeof(loop)));
	/* Opened for writing while it still could be. */
	fd = open(loop, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	snprintf(cmd, sizeof(cmd), "blockdev --setro %s", loop);
	ASSERT_EQ(0, sh(cmd));
	EXPECT_EQ(0, try_writes(self->dev, &self->gpu[0], fd, 0, &r));
	EXPECT_EQ(EPERM, r.pwrite);
	EXPECT_EQ(EPERM, r.write);
	EXPECT_EQ(EPERM, r.compat);
	snprintf(cmd, sizeof(cmd), "losetup -d %s && rm -f /tmp/ro.img", loop);
	EXPECT_EQ(0, sh(cmd));
}

/* DMA_PROBE of a loop device: no PCI device does its DMA, ENODEV. */
TEST_F(hd, dma_probe_loop_device_enodev)
{
	char loop[64] = "", cmd[200];
	struct p2pdirect_alloc a;
	__u8 *m;
	int fd;

	ASSERT_EQ(0, sh("dd if=/dev/zero of=/tmp/probe.img bs=1M count=4 2>/dev/null"));
	ASSERT_EQ(0, new_loop("/tmp/probe.img", loop, sizeof(loop)));
	fd = open(loop, O_RDWR);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(-ENODEV, probe(self->dev, fd, m, 64 * KiB));
	close(fd);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	snprintf(cmd, sizeof(cmd), "losetup -d %s && rm -f /tmp/probe.img", loop);
	EXPECT_EQ(0, sh(cmd));
}

/* The /dev name of the block device with number @dev (its uevent's DEVNAME). */
static int bdev_name(dev_t dev, char *name, size_t len)
{
	char path[96], line[128];
	int ret = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/uevent", major(dev), minor(dev));
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "DEVNAME=", 8)) {
			line[strcspn(line, "\n")] = 0;
			snprintf(name, len, "/dev/%s", line + 8);
			ret = 0;
		}
	fclose(f);
	return ret;
}

/*
 * A file whose file system's block device was set read-only after the
 * mount: WRITE, direct and COMPAT, is refused with EROFS before any data
 * moves (the block layer itself would only log a write to it); READ still
 * works.
 */
TEST_F(hd, file_on_read_only_device_erofs)
{
	const char *path = "/mnt/ext4/ro-dev.bin";
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	char dev[160], cmd[200];
	struct stat st;
	void *buf;
	__u8 *m;
	int fd;

	ASSERT_EQ(0, stat("/mnt/ext4", &st));
	ASSERT_EQ(0, bdev_name(st.st_dev, dev, sizeof(dev)));
	ASSERT_EQ(0, posix_memalign(&buf, 4096, 64 * KiB));
	memset(buf, 0x5a, 64 * KiB);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	ASSERT_GE(fd, 0);
	ASSERT_EQ((ssize_t)(64 * KiB), pwrite(fd, buf, 64 * KiB, 0));
	ASSERT_EQ(0, fsync(fd));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	snprintf(cmd, sizeof(cmd), "blockdev --setro %s", dev);
	ASSERT_EQ(0, sh(cmd));
	EXPECT_EQ(-EROFS, io(self->dev, true, fd, 0, (uintptr_t)m, 64 * KiB, 0, &out));
	EXPECT_EQ(-EROFS, io(self->dev, true, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 64 * KiB, 0,
			      &out));
	/* The device's read-only state comes before the alignment (since ABI 1.21). */
	EXPECT_EQ(-EROFS, io(self->dev, true, fd, 0, (uintptr_t)m, 1000, 0, &out));
	EXPECT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 64 * KiB, 0, &out));
	EXPECT_EQ(64 * KiB, out.bytes);
	snprintf(cmd, sizeof(cmd), "blockdev --setrw %s", dev);
	EXPECT_EQ(0, sh(cmd));
	/* Nothing was written: the file still holds its bytes. */
	memset(buf, 0, 64 * KiB);
	EXPECT_EQ((ssize_t)(64 * KiB), pread(fd, buf, 64 * KiB, 0));
	EXPECT_EQ(0x5a, ((__u8 *)buf)[0]);
	EXPECT_EQ(0, memcmp(buf, (__u8 *)buf + 1, 64 * KiB - 1));
	EXPECT_EQ(0, memcmp(m, buf, 64 * KiB));
	/* Put the GPU memory back to the zeros the host expects. */
	memset(m, 0, a.size);
	/*
	 * The file stays: its blocks, written from host memory and then
	 * freed, could go to a later test's file, whose DMACHECK of the same
	 * blocks would find that write in the NVMe trace.
	 */
	close(fd);
	free(buf);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/* The events queued on inotify descriptor @in (non-blocking) after 1 ms, or-ed. */
static __u32 events_of(int in)
{
	char ev[4096];
	__u32 seen = 0;
	ssize_t n;

	usleep(1000);
	while ((n = read(in, ev, sizeof(ev))) > 0)
		for (char *e = ev; e < ev + n;) {
			struct inotify_event *ie = (struct inotify_event *)e;

			seen |= ie->mask;
			e += sizeof(*ie) + ie->len;
		}
	return seen;
}

/* READ and WRITE on a raw namespace send the events read(2)/write(2) send. */
TEST_F(hd, raw_io_sends_fsnotify_events)
{
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	__u32 seen;
	__u8 *m;
	int in, fd;

	in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	ASSERT_GE(in, 0);
	ASSERT_GE(inotify_add_watch(in, self->ns1, IN_ACCESS | IN_MODIFY), 0);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	/* Zeros at 140 MiB of NSID 1, a range no other test reads or writes. */
	ASSERT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 64 * KiB, 140 * MiB, &out));
	EXPECT_EQ(64 * KiB, out.bytes);
	EXPECT_EQ(64 * KiB, out.p2p_bytes);
	seen = events_of(in);
	EXPECT_NE(0u, seen & IN_ACCESS) TH_LOG("no IN_ACCESS after READ (mask %#x)", seen);
	EXPECT_EQ(0u, seen & IN_MODIFY) TH_LOG("IN_MODIFY after a READ (mask %#x)", seen);
	/* The same zeros written back: IN_MODIFY. */
	ASSERT_EQ(0, io(self->dev, true, fd, 0, (uintptr_t)m, 64 * KiB, 140 * MiB, &out));
	EXPECT_EQ(64 * KiB, out.bytes);
	seen = events_of(in);
	EXPECT_NE(0u, seen & IN_MODIFY) TH_LOG("no IN_MODIFY after WRITE (mask %#x)", seen);
	close(fd);
	close(in);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/* --- 6. complete invalidation ---------------------------------------------------- */

/*
 * Two allocations mapped side by side: a range over both is refused with
 * EFAULT by REGISTER, DMA_PROBE and READ alike, never claimed as one.
 */
TEST_F(hd, range_over_two_allocations_efault)
{
	struct p2pdirect_alloc a, b;
	struct p2pdirect_io out;
	__u8 *m, *n;
	int ns;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 64 * KiB, &b));
	/* Reserve room for both, then map each at its place. */
	m = mmap(NULL, 128 * KiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(m, mmap(m, a.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self->dev,
			  a.mmap_offset));
	n = m + a.size;
	ASSERT_EQ(n, mmap(n, b.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self->dev,
			  b.mmap_offset));
	ns = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(ns, 0);
	EXPECT_EQ(-EFAULT, reg(self->dev, m + 60 * KiB, 8 * KiB, NULL));
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m + 60 * KiB, 8 * KiB));
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)m + 60 * KiB, 8 * KiB, 0, &out));
	/* Each alone is fine. */
	EXPECT_EQ(0, probe(self->dev, ns, m, a.size));
	EXPECT_EQ(0, probe(self->dev, ns, n, b.size));
	close(ns);
	munmap(m, 128 * KiB);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
}

/* The NVMe CMB's sysfs mapping right before a GPU mapping: EFAULT too. */
TEST_F(hd, range_from_cmb_into_gpu_mapping_efault)
{
	char path[300];
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	__u8 *m;
	int f, ns;

	snprintf(path, sizeof(path), "%s/p2pmem/allocate", self->sw_pci);
	f = open(path, O_RDWR);
	ASSERT_GE(f, 0);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = mmap(NULL, 128 * KiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(m, mmap(m, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, f, 0));
	ASSERT_EQ(m + 64 * KiB, mmap(m + 64 * KiB, a.size, PROT_READ | PROT_WRITE,
				     MAP_SHARED | MAP_FIXED, self->dev, a.mmap_offset));
	ns = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(ns, 0);
	EXPECT_EQ(-EFAULT, reg(self->dev, m + 60 * KiB, 8 * KiB, NULL));
	EXPECT_EQ(-EFAULT, probe(self->dev, ns, m + 60 * KiB, 8 * KiB));
	EXPECT_EQ(-EFAULT, io(self->dev, false, ns, 0, (uintptr_t)m + 60 * KiB, 8 * KiB, 0, &out));
	close(ns);
	munmap(m, 128 * KiB);
	close(f);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/*
 * FREE with registrations on the memory, one of another file: returns at
 * once (never EBUSY), and every registration is dead afterwards.
 */
TEST_F(hd, free_never_waits_for_registrations)
{
	struct p2pdirect_alloc a, b;
	struct timespec t0, t1;
	__u64 mine = 0, theirs = 0;
	int other;
	__u8 *m;

	other = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(other, 0);
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 256 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, reg(self->dev, m, a.size, &mine));
	ASSERT_EQ(0, reg(other, m + 4096, 8192, &theirs));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	TH_LOG("FREE took %ld us",
	       (long)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(self->dev, mine));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(other, theirs));
	/* The memory comes back: the same size fits at the same place. */
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 256 * KiB, &b));
	EXPECT_EQ(a.provider_offset, b.provider_offset);
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
	munmap(m, a.size);
	close(other);
}

/*
 * A registration made dead by FREE does not block registering the same
 * range again once new memory is mapped there (it stays until DEREGISTER).
 */
TEST_F(hd, dead_registration_does_not_block_the_range)
{
	struct p2pdirect_alloc a, b;
	__u64 old = 0, id = 0;
	__u8 *m;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, reg(self->dev, m, a.size, &old));
	ASSERT_EQ(0, free_handle(self->dev, a.handle));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(self->dev, old));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &b));
	ASSERT_EQ(m, mmap(m, b.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self->dev,
			  b.mmap_offset));
	EXPECT_EQ(0, reg(self->dev, m, b.size, &id));
	EXPECT_EQ(-EEXIST, reg(self->dev, m, b.size, NULL));
	EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(self->dev, id));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(self->dev, old));
	munmap(m, b.size);
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
}

/* --- 7. no side effect on a failed call ---------------------------------------- */

/* READ whose argument is read-only: EFAULT, and no byte moved. */
TEST_F(hd, read_with_read_only_argument_moves_nothing)
{
	struct p2pdirect_alloc a;
	struct p2pdirect_io req;
	void *ro;
	__u8 *m;
	int fd;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	memset(&req, 0, sizeof(req));
	req.fd = fd;
	req.addr = (uintptr_t)m;
	req.size = 64 * KiB;
	/*
	 * Data (fill(o, 1)) that no other test reads: had the READ run, the
	 * allocation would hold it.
	 */
	req.file_offset = 31 * MiB;
	ro = ro_page(&req, sizeof(req));
	ASSERT_NE(NULL, ro);
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_READ, ro));
	EXPECT_EQ(EFAULT, errno);
	EXPECT_EQ(0u, nonzero(m, a.size)) TH_LOG("the data moved although READ failed");
	munmap(ro, 4096);
	close(fd);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

static __u64 total_reads(int dev)
{
	struct p2pdirect_stat rows[32];
	struct p2pdirect_stats s = { .entries = (uintptr_t)rows, .capacity = 32 };
	__u64 n = 0;

	if (ioctl(dev, P2PDIRECT_IOC_STATS, &s))
		return 0;
	for (__u32 i = 0; i < s.count && i < 32; i++)
		n += rows[i].reads;
	return n;
}

/* STATS with RESET that cannot report: the counters stay. */
TEST_F(hd, stats_reset_that_cannot_report_keeps_counters)
{
	struct p2pdirect_stat rows[32];
	struct p2pdirect_stats s = {
		.entries = (uintptr_t)rows, .capacity = 32, .flags = P2PDIRECT_STATS_RESET,
	};
	struct p2pdirect_alloc a;
	__u64 before;
	void *ro;
	__u8 *m;
	int fd;

	/* At least one READ counted. */
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	/* Zeros, from a range no other test reads or writes. */
	ASSERT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 4096, 141 * MiB, NULL));
	close(fd);
	before = total_reads(self->dev);
	ASSERT_GT(before, 0u);
	/* The struct itself read-only. */
	ro = ro_page(&s, sizeof(s));
	ASSERT_NE(NULL, ro);
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, ro));
	EXPECT_EQ(EFAULT, errno);
	EXPECT_EQ(before, total_reads(self->dev));
	munmap(ro, 4096);
	/* The rows' buffer read-only. */
	ro = ro_page(rows, 16);
	ASSERT_NE(NULL, ro);
	s.entries = (uintptr_t)ro;
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, &s));
	EXPECT_EQ(EFAULT, errno);
	EXPECT_EQ(before, total_reads(self->dev));
	munmap(ro, 4096);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/* --- 8. resource bounds ------------------------------------------------------------ */

/* Handles are recycled, and a refused ALLOC consumes none. */
TEST_F(hd, handles_recycled_refused_alloc_consumes_nothing)
{
	struct p2pdirect_alloc a, big = { .provider = self->gpu[0].index, .size = 1ull << 40 };
	__u64 first, highest = 0;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 4096, &a));
	first = a.handle;
	ASSERT_EQ(0, free_handle(self->dev, a.handle));
	for (int i = 0; i < 20; i++) {
		EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &big));
		EXPECT_EQ(ENOMEM, errno);
	}
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 4096, &a));
	EXPECT_EQ(first, a.handle);
	ASSERT_EQ(0, free_handle(self->dev, a.handle));
	for (int i = 0; i < 2000; i++) {
		memset(&a, 0, sizeof(a));
		a.provider = self->gpu[0].index;
		a.size = 4096;
		ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &a));
		if (a.handle > highest)
			highest = a.handle;
		ASSERT_EQ(0, free_handle(self->dev, a.handle));
	}
	EXPECT_LT(highest, first + 64) TH_LOG("handles grow: %llu after 2000 rounds",
					      (unsigned long long)highest);
	printf("# HOSTCHECK gpu=%s off=%llu len=4096 zero guard=0\n", self->gpu[0].bdf,
	       (unsigned long long)a.provider_offset);
}

static __u64 pinned_of(int dev, __u32 pci)
{
	struct p2pdirect_stat rows[32];
	struct p2pdirect_stats s = { .entries = (uintptr_t)rows, .capacity = 32 };

	if (ioctl(dev, P2PDIRECT_IOC_STATS, &s))
		return ~0ull;
	for (__u32 i = 0; i < s.count && i < 32; i++)
		if (rows[i].kind == P2PDIRECT_STAT_PROVIDER && rows[i].id == pci)
			return rows[i].pinned_bytes;
	return 0;
}

/* The cap counts the pages a registration pins, not the bytes asked for. */
TEST_F(hd, pin_cap_counts_pinned_pages)
{
	struct p2pdirect_alloc a, b;
	struct p2pdirect_reg_id d;
	__u64 before, id = 0;
	__u8 *m, *n;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 48 * MiB, &a));
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 48 * MiB, &b));
	m = map_alloc(self->dev, &a);
	n = map_alloc(self->dev, &b);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_NE(MAP_FAILED, n);
	/* Two bytes across a page boundary pin two pages. */
	before = pinned_of(self->dev, self->gpu[0].pci);
	ASSERT_EQ(0, reg(self->dev, m + 4095, 2, &id));
	EXPECT_EQ(before + 8192, pinned_of(self->dev, self->gpu[0].pci));
	/*
	 * 8 KiB + 44 MiB + 48 MiB + (4 MiB - 4 KiB) passes the 96 MiB cap by
	 * 4 KiB; counting the 2 bytes asked for instead, it would fit.
	 */
	ASSERT_EQ(0, reg(self->dev, m + 4 * MiB, 44 * MiB, NULL));
	ASSERT_EQ(0, reg(self->dev, n, 48 * MiB, NULL));
	EXPECT_EQ(-EDQUOT, reg(self->dev, m, 4 * MiB - 4096, NULL));
	memset(&d, 0, sizeof(d));
	d.id = id;
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER, &d));
	EXPECT_EQ(0, reg(self->dev, m, 4 * MiB - 4096, NULL));
	munmap(m, a.size);
	munmap(n, b.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	EXPECT_EQ(0, free_handle(self->dev, b.handle));
}

/*
 * A file holds at most 4096 registrations, live or invalidated: the next
 * gets ENOSPC, until a DEREGISTER (also of an invalidated one) frees a place.
 */
TEST_F_TIMEOUT(hd, registrations_per_file_bounded, 300)
{
	struct p2pdirect_alloc a, b;
	struct p2pdirect_reg_id first = { 0 };
	int dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	__u8 *m, *n;

	ASSERT_GE(dev, 0);
	ASSERT_EQ(0, alloc_on(dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, reg(dev, m, 1, &first.id));
	for (int i = 1; i < MAX_REGS; i++)
		ASSERT_EQ(0, reg(dev, m + i, 1, NULL));
	EXPECT_EQ(-ENOSPC, reg(dev, m + 8192, 1, NULL));
	/* What the file holds comes before the memory: RAM, not ENXIO. */
	EXPECT_EQ(-ENOSPC, reg(dev, &a, sizeof(a), NULL));
	munmap(m, a.size);
	/* Invalidated by FREE, they still hold their places. */
	EXPECT_EQ(0, free_handle(dev, a.handle));
	ASSERT_EQ(0, alloc_on(dev, &self->gpu[0], 64 * KiB, &b));
	n = map_alloc(dev, &b);
	ASSERT_NE(MAP_FAILED, n);
	EXPECT_EQ(-ENOSPC, reg(dev, n, 1, NULL));
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(dev, first.id));
	EXPECT_EQ(0, ioctl(dev, P2PDIRECT_IOC_DEREGISTER, &first));
	EXPECT_EQ(0, reg(dev, n, 1, NULL));
	munmap(n, b.size);
	/* Closing drops them all. */
	close(dev);
}

static __u64 used_on(int dev, __u32 pci)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };

	if (ioctl(dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return ~0ull;
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].pci_addr == pci)
			return p[i].bytes_used;
	return ~0ull;
}

/* A process killed while it registers gives everything back. */
TEST_F(hd, killed_while_registering_gives_everything_back)
{
	__u64 before = used_on(self->dev, self->gpu[0].pci);
	pid_t pid;
	int st;

	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct p2pdirect_alloc a;
		int dev = open(DEV_PATH, O_RDWR);
		__u8 *m;

		if (dev < 0 || alloc_on(dev, &self->gpu[0], 64 * KiB, &a))
			_exit(1);
		m = map_alloc(dev, &a);
		if (m == MAP_FAILED)
			_exit(2);
		for (int i = 0;; i = (i + 1) % 4000)
			reg(dev, m + i, 1 + i % 8192, NULL);
	}
	usleep(300000);
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_TRUE(WIFSIGNALED(st));
	EXPECT_EQ(before, used_on(self->dev, self->gpu[0].pci));
}

/*
 * Many files' registrations of one allocation (4 x 4096): each leaves the
 * allocation's list on its own when its file closes, and FREE tells every
 * one still there. Closing two of the files is timed for the log (each
 * registration leaves in logarithmic time since ABI 1.18; before, by a
 * linear search of all the allocation's subscribers).
 */
TEST_F_TIMEOUT(hd, many_files_registrations_of_one_allocation, 300)
{
	struct p2pdirect_alloc a;
	struct timespec t0, t1;
	__u64 before = used_on(self->dev, self->gpu[0].pci);
	__u64 first[4] = { 0 }, last[4] = { 0 };
	int fds[4];
	__u8 *m;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[0], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	for (int f = 0; f < 4; f++) {
		fds[f] = open(DEV_PATH, O_RDWR | O_CLOEXEC);
		ASSERT_GE(fds[f], 0);
		ASSERT_EQ(0, reg(fds[f], m, 1, &first[f]));
		for (int i = 1; i < MAX_REGS - 1; i++)
			ASSERT_EQ(0, reg(fds[f], m + i, 1, NULL));
		ASSERT_EQ(0, reg(fds[f], m + MAX_REGS - 1, 1, &last[f]));
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	close(fds[0]);
	close(fds[2]);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("# closing 2 files of %d registrations of one allocation (of %d): %.1f ms\n",
	       MAX_REGS, 4 * MAX_REGS,
	       (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
	/* The others' are live, the first and last of each; FREE tells them all. */
	for (int f = 1; f < 4; f += 2) {
		EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(fds[f], first[f]));
		EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(fds[f], last[f]));
	}
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
	for (int f = 1; f < 4; f += 2) {
		EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(fds[f], first[f]));
		EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(fds[f], last[f]));
		close(fds[f]);
	}
	EXPECT_EQ(before, used_on(self->dev, self->gpu[0].pci));
}

/*
 * More registrations of another provider's P2PDMA pages (the CMB, mapped
 * through sysfs p2pmem/allocate) than 131072, from 264 files of 500: each
 * one watches that provider's driver for its unbind. As one array, that
 * watch list outgrew 4 MiB here and its next growth asked the page
 * allocator for an order past its limit: a kernel WARN, and ENOMEM for that
 * REGISTER. Now every REGISTER goes, and closing the files ends them all.
 *
 * The first 132 files register one page 66000 times: past
 * P2PDIRECT_PAGE_PINS_MAX pins it is refused with ETOOMANYREFS (since ABI
 * 1.21; before, nothing bounded a page's pins, whose count overflows at
 * about two million and then makes the next pin warn). The page's mapping
 * holds one reference, which does not make a pin. The other 132 files
 * register two more pages, 33000 times each, so 131535 registrations live.
 * (Many files of few registrations: a REGISTER looks through its file's
 * list, which under TCG and KASAN costs about a microsecond an entry.)
 */
TEST_F_TIMEOUT(hd, registrations_of_another_providers_memory_past_131072, 1200)
{
	enum { FILES = 264, PER_FILE = 500, FULL = 132, HALF = (FILES - FULL) / 2 };
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct timespec t0, t1, t2;
	__u64 before;
	__u32 cmb = 0;
	char path[PATH_MAX + 32];
	int fds[FILES], pf, failed = 0, first_err = 0, refused = 0, first_refused = -1;
	int ok[3] = { 0 };
	struct rlimit nofile;
	__u64 last = 0, id = 0;
	__u8 *um;

	ASSERT_EQ(0, getrlimit(RLIMIT_NOFILE, &nofile));
	if (nofile.rlim_cur < FILES + 64) {
		nofile.rlim_cur = FILES + 64;
		if (nofile.rlim_max < nofile.rlim_cur)
			nofile.rlim_max = nofile.rlim_cur;
		ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &nofile));
	}
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_PUBLISHED)
			cmb = p[i].pci_addr;
	ASSERT_NE(0u, cmb) TH_LOG("no published provider (the CMB)");
	before = pinned_of(self->dev, cmb);
	snprintf(path, sizeof(path), "%s/p2pmem/allocate", self->sw_pci);
	pf = open(path, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, pf) TH_LOG("open %s: %s", path, strerror(errno));
	um = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pf, 0);
	ASSERT_NE(MAP_FAILED, um) TH_LOG("mmap %s: %s", path, strerror(errno));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int f = 0; f < FILES; f++) {
		int pg = f < FULL ? 0 : f < FULL + HALF ? 1 : 2;

		fds[f] = open(DEV_PATH, O_RDWR | O_CLOEXEC);
		ASSERT_GE(fds[f], 0);
		for (int i = 0; i < PER_FILE; i++) {
			int r = reg(fds[f], um + pg * 4096 + i, 1, &id);

			if (!r) {
				ok[pg]++;
				last = id;
			} else if (r == -ETOOMANYREFS && pg == 0) {
				if (!refused++)
					first_refused = f * PER_FILE + i;
			} else if (!failed++) {
				first_err = r;
				TH_LOG("REGISTER %d: %s", f * PER_FILE + i + 1, strerror(-r));
			}
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	EXPECT_EQ(0, failed) TH_LOG("%d REGISTERs failed, the first with %s", failed,
				    strerror(-first_err));
	/* The first page: P2PDIRECT_PAGE_PINS_MAX, then none. */
	EXPECT_EQ(P2PDIRECT_PAGE_PINS_MAX, ok[0]);
	EXPECT_EQ(P2PDIRECT_PAGE_PINS_MAX, first_refused);
	EXPECT_EQ(FULL * PER_FILE - P2PDIRECT_PAGE_PINS_MAX, refused);
	EXPECT_EQ(HALF * PER_FILE, ok[1]);
	EXPECT_EQ(HALF * PER_FILE, ok[2]);
	EXPECT_LT(131072, ok[0] + ok[1] + ok[2]);
	EXPECT_EQ(before + (__u64)(ok[0] + ok[1] + ok[2]) * 4096, pinned_of(self->dev, cmb));
	EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(fds[FILES - 1], last));
	/* A file's close lets the first page's pins go: it registers again. */
	close(fds[0]);
	EXPECT_EQ(0, reg(fds[FULL - 1], um + PER_FILE - 1, 1, &id));
	EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(fds[FULL - 1], id));
	for (int f = 1; f < FILES; f++)
		close(fds[f]);
	clock_gettime(CLOCK_MONOTONIC, &t2);
	printf("# %d registrations of three CMB pages from %d files (%d refused): %.1f s; "
	       "closing them: %.1f s\n",
	       FILES * PER_FILE, FILES, refused,
	       (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
	       (t2.tv_sec - t1.tv_sec) + (t2.tv_nsec - t1.tv_nsec) / 1e9);
	/* Every registration let its pin go, and the pages register again. */
	EXPECT_EQ(before, pinned_of(self->dev, cmb));
	EXPECT_EQ(0, reg(self->dev, um, 3 * 4096, &last));
	EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(self->dev, last));
	munmap(um, 3 * 4096);
	close(pf);
}

/*
 * A process killed while it allocates gives everything back, also when the
 * kill finds ALLOC zeroing its memory (which then stops, since ABI 1.18):
 * the provider's used bytes and the handles are as before. (A guard of the
 * stop's undo path: that the zeroing stopped early is not seen from here,
 * and the old ALLOC, which zeroed to the end, passed it too.)
 */
TEST_F(hd, killed_while_allocating_gives_everything_back)
{
	__u64 before = used_on(self->dev, self->gpu[1].pci);
	struct p2pdirect_alloc a;
	__u64 lowest;
	pid_t pid;
	int st;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 64 * KiB, &a));
	lowest = a.handle;
	ASSERT_EQ(0, free_handle(self->dev, a.handle));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int dev = open(DEV_PATH, O_RDWR);

		if (dev < 0)
			_exit(1);
		for (;;) {
			struct p2pdirect_alloc b = { .provider = self->gpu[1].index,
						     .size = 32 * MiB };

			if (!ioctl(dev, P2PDIRECT_IOC_ALLOC, &b))
				free_handle(dev, b.handle);
		}
	}
	usleep(500000);
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_TRUE(WIFSIGNALED(st));
	EXPECT_EQ(before, used_on(self->dev, self->gpu[1].pci));
	/*
	 * The lowest free handle is still the one it was before. The memory
	 * the child took (the lowest free 32 MiB), zeroed in part: zeroed
	 * whole again, and the host told so.
	 */
	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 32 * MiB, &a));
	EXPECT_EQ(lowest, a.handle);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/* --- 9. honest accounting ---------------------------------------------------------- */

/*
 * Opens @path O_RDWR | O_DIRECT into *@fd and allocates 64 KiB of @g's
 * memory (zeroed) into *@a: its mapping, or MAP_FAILED.
 */
static __u8 *open_with_memory(int dev, const struct gpu *g, const char *path, int *fd,
			      struct p2pdirect_alloc *a)
{
	*fd = open(path, O_RDWR | O_DIRECT);
	if (*fd < 0 || alloc_on(dev, g, 64 * KiB, a))
		return MAP_FAILED;
	return map_alloc(dev, a);
}

/*
 * ext4 with journalled data (chattr +j; /mnt/ext4 is mounted nodelalloc)
 * serves O_DIRECT through the page cache: refused without COMPAT, counted
 * as bounced bytes with it, never as P2P.
 */
TEST_F(hd, dio_through_page_cache_is_not_p2p)
{
	const char *path = "/mnt/ext4/journalled.bin";
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	int fd, attr = FS_JOURNAL_DATA_FL;
	__u8 *m, buf[4096];

	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ioctl(fd, FS_IOC_SETFLAGS, &attr)) TH_LOG("chattr +j: %s", strerror(errno));
	memset(buf, 0x3c, sizeof(buf));
	for (int i = 0; i < 16; i++)
		ASSERT_EQ((ssize_t)sizeof(buf), write(fd, buf, sizeof(buf)));
	fsync(fd);
	close(fd);
	m = open_with_memory(self->dev, &self->gpu[0], path, &fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(-EOPNOTSUPP, io(self->dev, false, fd, 0, (uintptr_t)m, 64 * KiB, 0, &out));
	/* The offset's sign comes before the file system's path (since ABI 1.21). */
	EXPECT_EQ(-EINVAL, io(self->dev, false, fd, 0, (uintptr_t)m, 64 * KiB, 1ull << 63, &out));
	EXPECT_EQ(0u, nonzero(m, a.size));
	ASSERT_EQ(0, io(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 64 * KiB, 0,
			&out));
	EXPECT_EQ(64 * KiB, out.bytes);
	EXPECT_EQ(64 * KiB, out.bounce_bytes);
	EXPECT_EQ(0u, out.p2p_bytes);
	for (__u64 i = 0; i < 64 * KiB; i++)
		if (m[i] != 0x3c) {
			EXPECT_EQ(0x3c, m[i]) TH_LOG("byte %llu", (unsigned long long)i);
			break;
		}
	/*
	 * A hole bounced: its bytes are zeroed by the CPU, counted once, in
	 * zeroed_bytes (p2p + bounce + zeroed = bytes, as on the direct path).
	 */
	ASSERT_EQ(0, ftruncate(fd, 128 * KiB));
	ASSERT_EQ(0, io(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 64 * KiB,
			64 * KiB, &out));
	EXPECT_EQ(64 * KiB, out.bytes);
	EXPECT_EQ(64 * KiB, out.zeroed_bytes);
	EXPECT_EQ(0u, out.bounce_bytes);
	EXPECT_EQ(0u, out.p2p_bytes);
	/* Put the GPU memory back to the zeros the host expects. */
	memset(m, 0, a.size);
	/* The file stays (see file_on_read_only_device_erofs). */
	close(fd);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/*
 * A WRITE to a file opened O_APPEND appends, whatever file_offset says, as
 * pwrite(2) does on Linux (the header's struct p2pdirect_io); the offset
 * must still be a multiple of the logical block size, as xfs's O_DIRECT
 * pwrite(2) requires.
 */
TEST_F(hd, write_to_an_append_file_appends)
{
	const char *path = "/mnt/ext4/append.bin";
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	__u8 *m, buf[4096];
	struct stat sb;
	int fd, afd;

	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ASSERT_GE(fd, 0);
	memset(buf, 0x11, sizeof(buf));
	ASSERT_EQ((ssize_t)sizeof(buf), write(fd, buf, sizeof(buf)));
	fsync(fd);
	close(fd);
	m = open_with_memory(self->dev, &self->gpu[0], path, &fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	close(fd);
	afd = open(path, O_WRONLY | O_APPEND | O_DIRECT);
	ASSERT_GE(afd, 0);
	memset(m, 0x22, 4096);
	ASSERT_EQ(0, io(self->dev, true, afd, 0, (uintptr_t)m, 4096, 0, &out));
	EXPECT_EQ(4096u, out.bytes);
	EXPECT_EQ(4096u, out.p2p_bytes);
	ASSERT_EQ(0, fstat(afd, &sb));
	EXPECT_EQ(8192, sb.st_size);
	memset(m, 0x33, 4096);
	ASSERT_EQ(0, io(self->dev, true, afd, 0, (uintptr_t)m, 4096, 64 * MiB, &out));
	EXPECT_EQ(4096u, out.bytes);
	EXPECT_EQ(4096u, out.p2p_bytes);
	/* Its offset, size and memory are still checked. */
	EXPECT_EQ(-EINVAL, io(self->dev, true, afd, 0, (uintptr_t)m, 4096, 12345, &out));
	EXPECT_EQ(-EINVAL, io(self->dev, true, afd, 0, (uintptr_t)m, 1000, 0, &out));
	EXPECT_EQ(-EINVAL, io(self->dev, true, afd, 0, (uintptr_t)m + 256, 4096, 0, &out));
	ASSERT_EQ(0, fstat(afd, &sb));
	EXPECT_EQ(12288, sb.st_size);
	close(afd);
	fd = open(path, O_RDONLY);
	ASSERT_GE(fd, 0);
	ASSERT_EQ((ssize_t)sizeof(buf), pread(fd, buf, sizeof(buf), 0));
	EXPECT_TRUE(buf[0] == 0x11 && buf[4095] == 0x11) TH_LOG("offset 0 overwritten");
	ASSERT_EQ((ssize_t)sizeof(buf), pread(fd, buf, sizeof(buf), 4096));
	EXPECT_TRUE(buf[0] == 0x22 && buf[4095] == 0x22) TH_LOG("not appended");
	ASSERT_EQ((ssize_t)sizeof(buf), pread(fd, buf, sizeof(buf), 8192));
	EXPECT_TRUE(buf[0] == 0x33 && buf[4095] == 0x33) TH_LOG("not appended");
	close(fd);
	/* The file stays (its blocks are not handed to another test's file). */
	memset(m, 0, a.size);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/*
 * xfs writes a copy-on-write file (a reflinked one) in whole allocation
 * units and serves an O_DIRECT write off them through the page cache, which
 * statx reports (dio_offset_align): such a WRITE is refused without COMPAT
 * and bounced with it, never counted as P2P; aligned writes and reads at
 * the logical block size (dio_read_offset_align) stay device to device.
 */
TEST_F(hd, xfs_reflinked_write_off_its_allocation_unit_is_not_p2p)
{
	const char *src = "/mnt/xfs/data.bin", *path = "/mnt/xfs/reflinked.bin";
	struct p2pdirect_alloc a;
	struct p2pdirect_io out;
	int s, fd;
	__u8 *m;

	s = open(src, O_RDONLY);
	ASSERT_GE(s, 0);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ASSERT_GE(fd, 0);
	/* ci/make-disks.sh makes the xfs with reflink=1. */
	ASSERT_EQ(0, ioctl(fd, FICLONE, s)) TH_LOG("FICLONE on xfs: %s", strerror(errno));
	close(s);
	close(fd);
	/* Zeros from the GPU: its memory stays what the host expects. */
	m = open_with_memory(self->dev, &self->gpu[0], path, &fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(-EOPNOTSUPP, io(self->dev, true, fd, 0, (uintptr_t)m, 512, 512, &out));
	ASSERT_EQ(0, io(self->dev, true, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)m, 512, 512, &out));
	EXPECT_EQ(512u, out.bytes);
	EXPECT_EQ(512u, out.bounce_bytes);
	EXPECT_EQ(0u, out.p2p_bytes);
	ASSERT_EQ(0, io(self->dev, true, fd, 0, (uintptr_t)m, 4096, 8192, &out));
	EXPECT_EQ(4096u, out.p2p_bytes);
	ASSERT_EQ(0, io(self->dev, false, fd, 0, (uintptr_t)m, 512, 512, &out));
	EXPECT_EQ(512u, out.p2p_bytes);
	EXPECT_EQ(0u, nonzero(m, a.size));
	/*
	 * The file stays: a block the bounce wrote from host memory, once
	 * freed, could go to a later test's file, whose DMACHECK of the same
	 * blocks would then find that write in the NVMe trace.
	 */
	EXPECT_EQ(0, fsync(fd));
	close(fd);
	munmap(m, a.size);
	EXPECT_EQ(0, free_handle(self->dev, a.handle));
}

/* --- 10. a live mapping refaults ------------------------------------------------- */

TEST_F(hd, madv_dontneed_refaults_live_memory)
{
	struct p2pdirect_alloc a;
	__u64 want = 0, got = 0;
	__u8 *m;

	ASSERT_EQ(0, alloc_on(self->dev, &self->gpu[1], 64 * KiB, &a));
	m = map_alloc(self->dev, &a);
	ASSERT_NE(MAP_FAILED, m);
	for (__u64 i = 0; i < a.size; i++) {
		m[i] = (__u8)(i * 7 + 3);
		want += (__u8)(i * 7 + 3) * (i + 1);
	}
	ASSERT_EQ(0, madvise(m, a.size, MADV_DONTNEED));
	EXPECT_EQ(-1, read_all(m, a.size, &got))
		TH_LOG("SIGBUS on a live allocation after MADV_DONTNEED");
	EXPECT_EQ(want, got);
	/* Once freed, the same mapping gives SIGBUS. */
	memset(m, 0, a.size);
	ASSERT_EQ(0, free_handle(self->dev, a.handle));
	EXPECT_EQ(SIGBUS, read_all(m, 4096, &got));
	munmap(m, a.size);
}

/* --- 11. kernel memory charged to the caller's memory cgroup --------------- */

#define CG_ROOT "/sys/fs/cgroup"
/* Open files the charge test fills, and the most the limit test tries. */
#define CG_FILES 8
#define CG_LIMIT_FILES 16
#define CG_LIMIT (8 * MiB)
#define OOM_BEGIN "<5>p2pdirect-memcg: out-of-memory kills expected\n"
#define OOM_END "<5>p2pdirect-memcg: out-of-memory window over\n"

/*
 * A cgroup v2 directory of its own at @dir with the memory controller
 * (cgroup2 mounted on /sys/fs/cgroup if the guest has not): 0 or -errno.
 */
static int cg_make(char *dir, size_t len, const char *name)
{
	if (access(CG_ROOT "/cgroup.controllers", F_OK) &&
	    mount("cgroup2", CG_ROOT, "cgroup2", 0, NULL))
		return -errno;
	if (sysfs_write(CG_ROOT "/cgroup.subtree_control", "+memory"))
		return -EIO;
	snprintf(dir, len, CG_ROOT "/%s-%d", name, getpid());
	return mkdir(dir, 0755) ? -errno : 0;
}

/* The number @fmt matches in @dir's @file, or -1. */
static long cg_number(const char *dir, const char *file, const char *fmt)
{
	char path[192];

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	return file_number(path, fmt);
}

/* Moves the calling process into @dir: 0 or -errno. */
static int cg_enter(const char *dir)
{
	char path[192];

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	return sysfs_write(path, "0");
}

/*
 * Gives open file @dev @small one-byte registrations of @m's first page,
 * and two of 44 MiB of it when @big (96 MiB less 4 KiB pinned with 2048
 * small ones, within the guest's 96 MiB cap): 0, or -errno of the first
 * refusal.
 */
static int fill_file(int dev, const __u8 *m, bool big, int small)
{
	int r = 0;

	if (big)
		r = reg(dev, m, 44 * MiB, NULL);
	if (big && !r)
		r = reg(dev, m + 4096, 44 * MiB - 4096, NULL);
	for (int i = 0; !r && i < small; i++)
		r = reg(dev, m + i, 1, NULL);
	return r;
}

/*
 * A new open file with 64 KiB of @g's memory of its own and MAX_REGS
 * one-byte registrations of it: 0, or -errno of the first refusal.
 */
static int fill_own_file(const struct gpu *g)
{
	struct p2pdirect_alloc a = { .provider = g->index, .size = 64 * KiB };
	int dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	__u8 *m;

	if (dev < 0 || ioctl(dev, P2PDIRECT_IOC_ALLOC, &a))
		return -errno;
	m = map_alloc(dev, &a);
	if (m == MAP_FAILED)
		return -errno;
	return fill_file(dev, m, false, MAX_REGS);
}

/* What the charge test's child reports. */
struct cg_charge {
	int err;
	long charged;	/* memory.current's rise with the files open */
	long left;	/* and what stays of it once all is given back */
	long slack;	/* what memory.current may show of nothing */
};

static void cg_charge_child(const struct gpu *g, const char *dir, int out)
{
	struct cg_charge res = { 0 };
	struct p2pdirect_alloc a;
	int fds[CG_FILES], dev;
	long base;
	__u8 *m;

	/* Never outlives the test (a timeout kills the test, not its child). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	res.err = cg_enter(dir);
	if (!res.err && dev < 0)
		res.err = -errno;
	if (!res.err)
		res.err = alloc_on(dev, g, 44 * MiB, &a);
	m = res.err ? MAP_FAILED : map_alloc(dev, &a);
	if (!res.err && m == MAP_FAILED)
		res.err = -errno;
	base = cg_number(dir, "memory.current", "%ld");
	for (int i = 0; !res.err && i < CG_FILES; i++) {
		fds[i] = open(DEV_PATH, O_RDWR | O_CLOEXEC);
		res.err = fds[i] < 0 ? -errno : fill_file(fds[i], m, true, 2048);
		if (!res.err)
			res.charged = cg_number(dir, "memory.current", "%ld") - base;
	}
	/*
	 * memory.current counts what each CPU's charge stock holds in advance
	 * (64 pages), whoever uses it; and a page or two of page tables.
	 */
	res.slack = (sysconf(_SC_NPROCESSORS_ONLN) + 1) * 256 * (long)KiB;
	if (!res.err) {
		for (int i = 0; i < CG_FILES; i++)
			close(fds[i]);
		/* All of it: the allocation's list of registrations goes too. */
		munmap(m, a.size);
		free_handle(dev, a.handle);
		close(dev);
		/* DEREGISTER frees after an RCU grace period: give it 10 s. */
		for (int t = 0; t < 100; t++) {
			res.left = cg_number(dir, "memory.current", "%ld") - base;
			if (res.left < res.slack)
				break;
			usleep(100000);
		}
	}
	if (write(out, &res, sizeof(res)) != sizeof(res))
		_exit(2);
	_exit(0);
}

/*
 * What a user's REGISTERs keep in the kernel (the records, the page arrays,
 * the index) is charged to their memory cgroup, and given back when they
 * end: 8 files of 2050 registrations each, 96 MiB pinned each.
 */
TEST_F_TIMEOUT(hd, registrations_charged_to_callers_memory_cgroup, 300)
{
	struct cg_charge res = { .err = -ECHILD };
	char dir[128];
	int pipefd[2], st;
	pid_t pid;

	ASSERT_EQ(0, cg_make(dir, sizeof(dir), "p2pd-charge"));
	ASSERT_EQ(0, pipe(pipefd));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0)
		cg_charge_child(&self->gpu[0], dir, pipefd[1]);
	close(pipefd[1]);
	EXPECT_EQ((ssize_t)sizeof(res), read(pipefd[0], &res, sizeof(res)));
	close(pipefd[0]);
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_EQ(0, rmdir(dir));
	ASSERT_EQ(0, res.err) TH_LOG("%s", strerror(-res.err));
	printf("# %d files of 2050 registrations: %ld KiB charged, %ld KiB left after close (%ld KiB of slack)\n",
	       CG_FILES, res.charged / 1024, res.left / 1024, res.slack / 1024);
	/* Per file at least 2 x 88 KiB of page arrays and 2050 records. */
	EXPECT_GE(res.charged, 2 * (long)MiB);
	EXPECT_LT(res.left, res.slack);
}

/*
 * memory.max bounds it: a process whose cgroup may hold 8 MiB cannot keep
 * 16 files of 4096 registrations (some 48 MiB of records in the debug
 * kernel, where the charge test measures about 3 MiB a file).
 * It is refused (ENOMEM) or, as any task past its limit, killed by the
 * cgroup's OOM killer (whose report the console scan accepts between the
 * markers); its memory and its charge are given back either way.
 */
TEST_F_TIMEOUT(hd, memory_cgroup_limit_bounds_registrations, 300)
{
	__u64 before = used_on(self->dev, self->gpu[0].pci);
	int pipefd[2], st, files = 0;
	long peak, events;
	char dir[128], path[192], max[32], c;
	pid_t pid;

	ASSERT_EQ(0, cg_make(dir, sizeof(dir), "p2pd-limit"));
	snprintf(path, sizeof(path), "%s/memory.max", dir);
	snprintf(max, sizeof(max), "%llu", CG_LIMIT);
	ASSERT_EQ(0, sysfs_write(path, max));
	ASSERT_EQ(0, pipe(pipefd));
	log_kernel(OOM_BEGIN);
	pid = fork();
	if (pid < 0)
		log_kernel(OOM_END);
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int r;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (cg_enter(dir))
			_exit(3);
		/*
		 * Each file registers memory of its own: what closing a file
		 * costs stays per file (an allocation's registrations are told
		 * of its end one by one).
		 */
		for (int i = 0; i < CG_LIMIT_FILES; i++) {
			r = fill_own_file(&self->gpu[0]);
			if (r < 0)
				_exit(r == -ENOMEM ? 0 : 5);
			/* One byte per file kept open. */
			if (write(pipefd[1], "f", 1) != 1)
				_exit(6);
		}
		_exit(1);
	}
	close(pipefd[1]);
	while (read(pipefd[0], &c, 1) == 1)
		files++;
	close(pipefd[0]);
	/* The child's end (its pipe closed), so the window closes whatever comes. */
	EXPECT_EQ(pid, waitpid(pid, &st, 0));
	log_kernel(OOM_END);
	peak = cg_number(dir, "memory.peak", "%ld");
	events = cg_number(dir, "memory.events", "max %ld");
	EXPECT_EQ(0, rmdir(dir));
	printf("# %d files of %d registrations kept under memory.max 8 MiB; peak %ld KiB, %ld times at the limit, %s\n",
	       files, MAX_REGS, peak / 1024, events,
	       WIFSIGNALED(st) ? "then killed" :
	       WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "then ENOMEM" : "never refused");
	EXPECT_TRUE((WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ||
		    (WIFEXITED(st) && WEXITSTATUS(st) == 0))
		TH_LOG("child status %#x: %s", st,
		       WIFEXITED(st) && WEXITSTATUS(st) == 1 ? "never refused" : "failed");
	EXPECT_LT(files, CG_LIMIT_FILES);
	/* At most a MiB over: charges the kernel forces through for a task it kills. */
	EXPECT_LE(peak, (long)(CG_LIMIT + MiB));
	EXPECT_GT(events, 0);
	EXPECT_EQ(before, used_on(self->dev, self->gpu[0].pci));
}

/* --- 12. published memory goes with its driver -------------------------------- */

static int write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, s, strlen(s));
	close(fd);
	return n == (ssize_t)strlen(s) ? 0 : -errno;
}

/*
 * Unbinding the NVMe driver of the controller whose CMB p2pdirect allocated
 * from: the unbind completes (p2pdirect revokes its allocations first: the
 * registration is dead, the mapping gives SIGBUS; a registration of the
 * CMB's own P2PDMA pages, mapped through sysfs p2pmem/allocate, is
 * invalidated too, where the unbind used to wait for its DEREGISTER or
 * close), and after a rebind the
 * CMB is a provider again. A READ of NSID 1 (on that controller) into GPU
 * memory before, through the same /dev/p2pdirect file, leaves the file's
 * hint of the namespace's DMA device: the old namespace's fd then moves
 * nothing (its capacity is 0: end of device, as pread(2) finds it, or an
 * error), and the namespace that comes back (a new disk) reads the same
 * bytes. Run alone at teardown (the namespaces of
 * that controller go away meanwhile):
 * harden_test -t cmb_unbind_revokes_allocations.
 */
static int read_ns1(int dev, const char *ns, void *gpu, __u64 len, int *err)
{
	struct p2pdirect_io io = { .addr = (uintptr_t)gpu, .size = len };
	int ret;

	io.fd = open(ns, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (io.fd < 0)
		return -errno;
	ret = ioctl(dev, P2PDIRECT_IOC_READ, &io);
	*err = ret ? errno : 0;
	close(io.fd);
	return ret ? -*err : (int)io.bytes;
}

/* Writes @bdf to the NVMe driver's unbind file, in a child. */
static pid_t unbind_nvme_async(const char *bdf)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(write_str("/sys/bus/pci/drivers/nvme/unbind", bdf) ? 1 : 0);
	return pid;
}

/* The exit status of child @pid, or -ETIMEDOUT if it runs @secs longer. */
static int wait_child(pid_t pid, int secs)
{
	for (int i = 0; i < secs * 10; i++) {
		int st;

		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		usleep(100000);
	}
	return -ETIMEDOUT;
}

TEST(cmb_unbind_revokes_allocations)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_alloc a = { .size = 64 * KiB }, g = { .size = 64 * KiB };
	char ns[64], ns1[64], pci_dir[256], bdf[32], path[300], *slash;
	__u64 id = 0, uid = 0, sum;
	__u8 *m, *gm, *um;
	struct p2pdirect_io old_io = {};
	int dev, found = 0, err, old_fd, pf, peer, r;
	struct tm_state st;
	pid_t child;

	ASSERT_TRUE(find_nvme("p2pnvme-sw", ns, sizeof(ns), pci_dir));
	slash = strrchr(pci_dir, '/');
	ASSERT_NE(NULL, slash);
	snprintf(bdf, sizeof(bdf), "%s", slash + 1);
	dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(dev, 0);
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_PUBLISHED) {
			a.provider = p[i].index;
			found = 1;
		}
	ASSERT_TRUE(found) TH_LOG("no published provider (the CMB)");
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR)
			g.provider = p[i].index;
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_ALLOC, &g));
	gm = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, dev, g.mmap_offset);
	ASSERT_NE(MAP_FAILED, gm);
	ASSERT_TRUE(find_nvme_nsid(1, ns1, sizeof(ns1), NULL));
	ASSERT_EQ((int)g.size, read_ns1(dev, ns1, gm, g.size, &err)) TH_LOG("%s", strerror(err));
	EXPECT_EQ(0ull, fill_diff(gm, g.size, 0, 1));
	old_fd = open(ns1, O_RDONLY | O_DIRECT | O_CLOEXEC);
	ASSERT_LE(0, old_fd);
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_ALLOC, &a));
	m = mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, dev, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, reg(dev, m, a.size, &id));
	snprintf(path, sizeof(path), "%s/p2pmem/allocate", pci_dir);
	pf = open(path, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, pf) TH_LOG("open %s: %s", path, strerror(errno));
	um = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, pf, 0);
	ASSERT_NE(MAP_FAILED, um);
	ASSERT_EQ(0, reg(dev, um, 64 * KiB, &uid));
	/* And a kernel consumer of them (mapped for the controller itself). */
	peer = open("/sys/kernel/debug/p2pd_importer/peer", O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, peer) TH_LOG("p2pd_importer's peer file: %s", strerror(errno));
	ASSERT_EQ(0, tm_cmd(peer, "acquire %lx %llx %s", (unsigned long)um, 64 * KiB, bdf));
	/*
	 * The unbind must wait neither for p2pdirect's allocation nor for the
	 * registration of the CMB's pages (it takes well under a second). If
	 * it waits, DEREGISTER lets it go on, and the test fails (within the
	 * harness's 30 s).
	 */
	child = unbind_nvme_async(bdf);
	ASSERT_LT(0, child);
	r = wait_child(child, 10);
	EXPECT_NE(-ETIMEDOUT, r) TH_LOG("the unbind still waits after 10 s");
	if (r == -ETIMEDOUT) {
		struct p2pdirect_reg_id d = { .id = uid };

		ioctl(dev, P2PDIRECT_IOC_DEREGISTER, &d);
		tm_cmd(peer, "release");
		r = wait_child(child, 10);
		uid = 0;
	}
	ASSERT_EQ(0, r);
	EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(dev, id));
	if (uid) {
		EXPECT_EQ(P2PDIRECT_REG_DEAD, reg_state(dev, uid));
		/* The consumer was told, and its range is stale. */
		ASSERT_EQ(0, tm_state(peer, &st));
		EXPECT_EQ(1u, st.invalidations);
		EXPECT_EQ(-ESTALE, tm_cmd(peer, "map"));
		EXPECT_EQ(0, tm_cmd(peer, "release"));
	}
	close(peer);
	munmap(um, 64 * KiB);
	close(pf);
	EXPECT_EQ(SIGBUS, read_all(m, 4096, &sum));
	/* The deleted namespace, through the fd opened before. */
	old_io.fd = old_fd;
	old_io.addr = (uintptr_t)gm;
	old_io.size = g.size;
	memset(gm, 0, g.size);
	err = ioctl(dev, P2PDIRECT_IOC_READ, &old_io) ? errno : 0;
	printf("# READ of the deleted namespace: %s, %llu bytes\n", strerror(err),
	       (unsigned long long)old_io.bytes);
	EXPECT_TRUE(err || old_io.bytes == 0);
	EXPECT_EQ(0u, nonzero(gm, g.size));
	close(old_fd);
	/* FREE of the revoked allocation is still fine. */
	EXPECT_EQ(0, free_handle(dev, a.handle));
	munmap(m, a.size);
	ASSERT_EQ(0, write_str("/sys/bus/pci/drivers/nvme/bind", bdf));
	/* The CMB comes back as a provider once the driver published it again. */
	found = 0;
	for (int t = 0; t < 100 && !found; t++) {
		req.capacity = 8;
		ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
		for (unsigned int i = 0; i < req.count && i < 8; i++)
			found |= p[i].kind == P2PDIRECT_PROVIDER_PUBLISHED;
		if (!found)
			usleep(100000);
	}
	EXPECT_TRUE(found);
	/* The CMB's pages register again: nothing is left marked as unbinding. */
	pf = open(path, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, pf) TH_LOG("open %s: %s", path, strerror(errno));
	um = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, pf, 0);
	ASSERT_NE(MAP_FAILED, um);
	EXPECT_EQ(0, reg(dev, um, 64 * KiB, &uid));
	EXPECT_EQ(P2PDIRECT_REG_LIVE, reg_state(dev, uid));
	EXPECT_EQ(0, ioctl(dev, P2PDIRECT_IOC_DEREGISTER, &(struct p2pdirect_reg_id){ .id = uid }));
	munmap(um, 64 * KiB);
	close(pf);
	/* The namespace is a new disk: it is read from its new node. */
	found = 0;
	for (int t = 0; t < 100 && !found; t++) {
		found = find_nvme_nsid(1, ns1, sizeof(ns1), NULL);
		if (!found)
			usleep(100000);
	}
	ASSERT_TRUE(found);
	memset(gm, 0, g.size);
	EXPECT_EQ((int)g.size, read_ns1(dev, ns1, gm, g.size, &err)) TH_LOG("%s", strerror(err));
	EXPECT_EQ(0ull, fill_diff(gm, g.size, 0, 1));
	/* What the host finds of this memory: zeros, as ALLOC left it. */
	memset(gm, 0, g.size);
	munmap(gm, g.size);
	EXPECT_EQ(0, free_handle(dev, g.handle));
	close(dev);
}

TEST_HARNESS_MAIN
