// SPDX-License-Identifier: GPL-2.0
/*
 * READ and WRITE on stacked block devices and partitions (kselftest harness,
 * TAP on stdout): NVMe native multipath heads, md raid0 and raid1, dm-linear,
 * a partition of a namespace.
 *
 * The guest (ci/guest/guest-lib.sh, stack_setup) builds the devices and
 * names them in the environment:
 *   P2P_MPATH_SW   head of NSID 5: both paths' controllers behind the switch
 *   P2P_MPATH_MIX  head of NSID 6: one path on a root port (unreachable)
 *   P2P_MD_RAID0   raid0, chunk 64 KiB, legs NSID 7 p1, NSID 8 p1 (no superblock)
 *   P2P_MD_RAID1   raid1, legs NSID 7 p2, NSID 8 p2 (no superblock)
 *   P2P_MD_MIXED   raid1, legs NSID 7 p3 and NSID 9 p1 (on the root-port controller)
 *   P2P_DM_LINEAR  dm-linear over all of NSID 8 p3
 *   P2P_PART       NSID 7 p4
 *   P2P_DM_DEEP4, P2P_DM_DEEP5  read-only dm-linear stacks 4 and 5 dm levels
 *                  deep over NSID 8 p3 (the bottom one is P2P_DM_LINEAR)
 *   P2P_DM_WIDE32, P2P_DM_WIDE33  read-only dm-linear over 32 and 33 dm-linear
 *                  legs, each over 4 KiB of NSID 8 p3
 *   P2P_MD_DEEP4, P2P_MD_DEEP5  md5 and md6: raid1 arrays of one leg each
 *                  stacked on P2P_MD_RAID1, 4 and 5 md levels deep
 * Partitions (ci/make-disks.sh): p1 at 1 MiB, p2 at 17 MiB, p3 at 33 MiB,
 * p4 at 49 MiB (15 MiB, to the end of the 64 MiB namespace); each namespace
 * holds fill(o, NSID). The records (HOSTCHECK, NVMECHECK, DMACHECK, see
 * ci/hostcheck.py) let the host prove, from the NVMe trace and the images,
 * that the data went to the right blocks of each leg, by P2P DMA where the
 * call says so and through host memory where it bounced.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/fs.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define BUF (4 * MiB)
#define PART_START(p) ((1 + 16 * ((p) - 1)) * MiB)	/* p1..p4 of NSIDs 7-9 */
#define CHUNK (64 * KiB)

FIXTURE(stk) {
	int dev;
	char bdf[32];
	struct p2pdirect_alloc a;
	__u8 *map;
};

FIXTURE_SETUP(stk)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	unsigned int i;

	self->dev = open("/dev/p2pdirect", O_RDWR);
	ASSERT_LE(0, self->dev);
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR)
			break;
	ASSERT_LT(i, req.count) TH_LOG("no emulated GPU");
	pci_name(p[i].pci_addr, self->bdf, sizeof(self->bdf));
	self->a.provider = p[i].index;
	self->a.size = BUF;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &self->a));
	record_alloc_zero(self->dev, &self->a);
	self->map = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_SHARED, self->dev,
			 self->a.mmap_offset);
	ASSERT_NE(MAP_FAILED, self->map);
}

FIXTURE_TEARDOWN(stk)
{
	struct p2pdirect_free f = { .handle = self->a.handle };

	if (self->map != MAP_FAILED)
		munmap(self->map, BUF);
	ioctl(self->dev, P2PDIRECT_IOC_FREE, &f);
	close(self->dev);
}

/* The block device the guest named in @var, opened with @flags. */
static int open_env_flags(const char *var, int flags)
{
	const char *path = getenv(var);
	int fd;

	if (!path || !*path) {
		printf("# %s is not set (the guest builds the stacked devices)\n", var);
		return -1;
	}
	fd = open(path, flags);
	if (fd < 0)
		printf("# open %s (%s): %s\n", path, var, strerror(errno));
	return fd;
}

/* ... opened O_DIRECT read-write. */
static int open_env(const char *var)
{
	return open_env_flags(var, O_RDWR | O_DIRECT);
}

/* READ or WRITE of @size bytes at @foff of @fd, buffer offset @boff. */
static int io(struct _test_data_stk *self, int write, int fd, __u32 flags, __u64 boff,
	      __u64 size, __u64 foff, struct p2pdirect_io *out)
{
	struct p2pdirect_io r = {
		.fd = fd, .flags = flags, .addr = (uintptr_t)self->map, .size = size,
		.file_offset = foff, .buf_offset = boff,
	};
	int ret = ioctl(self->dev, write ? P2PDIRECT_IOC_WRITE : P2PDIRECT_IOC_READ, &r);

	*out = r;
	return ret ? -errno : 0;
}

static void rec_gpu_fill(struct _test_data_stk *self, __u64 boff, __u64 len, __u64 seed,
			 __u64 pos)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu fill=%llu pos=%llu guard=0\n", self->bdf,
	       (unsigned long long)(self->a.provider_offset + boff), (unsigned long long)len,
	       (unsigned long long)seed, (unsigned long long)pos);
}

/* Buffer bytes [boff, boff + len) hold fill(pos + j, seed): fill and record them. */
static void buf_fill(struct _test_data_stk *self, __u64 boff, __u64 len, __u64 seed, __u64 pos)
{
	fill_buf(self->map + boff, len, pos, seed);
	rec_gpu_fill(self, boff, len, seed, pos);
}

static void rec_nvme(int nsid, __u64 off, __u64 len, __u64 seed, __u64 pos)
{
	printf("# NVMECHECK ns=%d off=%llu len=%llu fill=%llu pos=%llu\n", nsid,
	       (unsigned long long)off, (unsigned long long)len, (unsigned long long)seed,
	       (unsigned long long)pos);
}

/* @where: the GPU's BDF, or NULL for host memory (a bounce). */
static void rec_dma(int nsid, __u64 off, __u64 len, const char *where, const char *op)
{
	printf("# DMACHECK ns=%d off=%llu len=%llu where=%s%s op=%s\n", nsid,
	       (unsigned long long)off, (unsigned long long)len, where ? "gpu:" : "ram",
	       where ? where : "", op);
}

static int not_dot(const struct dirent *d)
{
	return d->d_name[0] != '.';
}

/*
 * The PCI function (dddd:bb:dd.f) of the first path, in name order, of the
 * multipath head at $@var: the DMA device READ and WRITE report for it.
 */
static int first_path_pci(const char *var, char *pci, size_t len)
{
	const char *dev = getenv(var);
	char path[PATH_MAX], real[PATH_MAX], copy[PATH_MAX];
	struct dirent **names;
	int n, ok = 0;

	if (!dev)
		return 0;
	snprintf(copy, sizeof(copy), "%s", dev);
	snprintf(path, sizeof(path), "/sys/block/%s/multipath", basename(copy));
	n = scandir(path, &names, not_dot, alphasort);
	if (n <= 0)
		return 0;
	/* /sys/block/PATH/device: the controller, a child of its PCI function. */
	snprintf(path, sizeof(path), "/sys/block/%s/device", names[0]->d_name);
	if (realpath(path, real)) {
		char *ctrl_dir = dirname(real);		/* .../dddd:bb:dd.f/nvme */

		snprintf(pci, len, "%s", basename(dirname(ctrl_dir)));
		ok = 1;
	}
	while (n--)
		free(names[n]);
	free(names);
	return ok;
}

/* Both paths of the head reach the GPU: P2P, bytes where they belong. */
TEST_F(stk, multipath_all_paths_reachable)
{
	char want[64] = "", got[32];
	struct p2pdirect_io r;
	int fd = open_env("P2P_MPATH_SW");

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, io(self, 0, fd, 0, 0, MiB, 8 * MiB, &r));
	rec_gpu_fill(self, 0, MiB, 5, 8 * MiB);
	EXPECT_EQ(MiB, r.bytes);
	EXPECT_EQ(MiB, r.p2p_bytes);
	EXPECT_EQ(0ull, r.bounce_bytes);
	EXPECT_NE(0u, r.dma_pci_addr);
	/* The DMA device reported is the first path's in name order (the header's word). */
	ASSERT_TRUE(first_path_pci("P2P_MPATH_SW", want, sizeof(want)));
	pci_name(r.dma_pci_addr, got, sizeof(got));
	EXPECT_STREQ(want, got);
	EXPECT_EQ(0ull, fill_diff(self->map, MiB, 8 * MiB, 5));
	rec_dma(5, 8 * MiB, MiB, self->bdf, "read");

	buf_fill(self, MiB, MiB, 0x55, 16 * MiB);
	ASSERT_EQ(0, io(self, 1, fd, 0, MiB, MiB, 16 * MiB, &r));
	EXPECT_EQ(MiB, r.p2p_bytes);
	rec_nvme(5, 16 * MiB, MiB, 0x55, 16 * MiB);
	rec_dma(5, 16 * MiB, MiB, self->bdf, "write");
	ASSERT_EQ(0, io(self, 0, fd, 0, 2 * MiB, MiB, 16 * MiB, &r));
	rec_gpu_fill(self, 2 * MiB, MiB, 0x55, 16 * MiB);
	EXPECT_EQ(MiB, r.p2p_bytes);
	EXPECT_EQ(0ull, fill_diff(self->map + 2 * MiB, MiB, 16 * MiB, 0x55));
	close(fd);
}

/* STATS' bounce_bytes of the block device open as @fd (0 before its first I/O). */
static __u64 stat_bounced(int dev, int fd)
{
	struct p2pdirect_stat e[64];
	struct p2pdirect_stats req = { .entries = (uintptr_t)e, .capacity = 64 };
	struct stat st;

	if (fstat(fd, &st) || ioctl(dev, P2PDIRECT_IOC_STATS, &req))
		return ~0ull;
	for (unsigned int i = 0; i < req.count && i < 64; i++)
		if (e[i].kind == P2PDIRECT_STAT_BLOCK &&
		    e[i].id == (major(st.st_rdev) << 20 | minor(st.st_rdev)))
			return e[i].bounce_bytes;
	return 0;
}

/* One path is on a root port: refused, naming it; COMPAT bounces. */
TEST_F(stk, multipath_one_path_unreachable)
{
	struct p2pdirect_io r;
	int fd = open_env("P2P_MPATH_MIX");
	int before = klog_has("one of 2 paths or legs");
	__u64 bounced;

	ASSERT_LE(0, fd);
	EXPECT_EQ(-EREMOTEIO, io(self, 0, fd, 0, 0, MiB, 8 * MiB, &r));
	EXPECT_EQ(-EREMOTEIO, io(self, 1, fd, 0, 0, MiB, 8 * MiB, &r));
	EXPECT_LT(before, klog_has("one of 2 paths or legs"));

	bounced = stat_bounced(self->dev, fd);
	ASSERT_EQ(0, io(self, 0, fd, P2PDIRECT_IO_COMPAT, 0, MiB, 8 * MiB, &r));
	rec_gpu_fill(self, 0, MiB, 6, 8 * MiB);
	EXPECT_EQ(bounced + MiB, stat_bounced(self->dev, fd));
	EXPECT_EQ(MiB, r.bytes);
	EXPECT_EQ(MiB, r.bounce_bytes);
	EXPECT_EQ(0ull, r.p2p_bytes);
	EXPECT_EQ(0ull, fill_diff(self->map, MiB, 8 * MiB, 6));
	rec_dma(6, 8 * MiB, MiB, NULL, "read");
	close(fd);
}

/*
 * WRITE fill(@seed) from buffer [0, len) to @at of @fd and READ it back into
 * buffer [1 MiB, 1 MiB + len), both by P2P; the records of the legs are the
 * caller's.
 */
static void write_read_back(struct __test_metadata *_metadata, struct _test_data_stk *self,
			    int fd, __u64 seed, __u64 at, __u64 len)
{
	struct p2pdirect_io r;

	buf_fill(self, 0, len, seed, at);
	ASSERT_EQ(0, io(self, 1, fd, 0, 0, len, at, &r));
	EXPECT_EQ(len, r.bytes);
	EXPECT_EQ(len, r.p2p_bytes);
	ASSERT_EQ(0, io(self, 0, fd, 0, MiB, len, at, &r));
	rec_gpu_fill(self, MiB, len, seed, at);
	EXPECT_EQ(len, r.p2p_bytes);
	EXPECT_EQ(0ull, fill_diff(self->map + MiB, len, at, seed));
}

/* raid0 over two reachable legs: each 64 KiB chunk on its leg, by P2P. */
TEST_F(stk, md_raid0_p2p)
{
	const __u64 at = 4 * MiB, len = MiB;
	int fd = open_env("P2P_MD_RAID0");

	ASSERT_LE(0, fd);
	write_read_back(_metadata, self, fd, 0x70, at, len);
	for (__u64 o = at; o < at + len; o += CHUNK) {
		__u64 c = o / CHUNK;

		rec_nvme(c % 2 ? 8 : 7, PART_START(1) + c / 2 * CHUNK, CHUNK, 0x70, o);
	}
	/* Chunks 64-79: the legs' [2 MiB, 2.5 MiB) each, written then read. */
	for (int nsid = 7; nsid <= 8; nsid++)
		rec_dma(nsid, PART_START(1) + 2 * MiB, len / 2, self->bdf, "write");
	for (int nsid = 7; nsid <= 8; nsid++)
		rec_dma(nsid, PART_START(1) + 2 * MiB, len / 2, self->bdf, "read");
	close(fd);
}

/* raid1 over two reachable legs: both copies written by P2P. */
TEST_F(stk, md_raid1_p2p)
{
	const __u64 at = 4 * MiB, len = MiB;
	int fd = open_env("P2P_MD_RAID1");

	ASSERT_LE(0, fd);
	write_read_back(_metadata, self, fd, 0x71, at, len);
	for (int nsid = 7; nsid <= 8; nsid++) {
		rec_nvme(nsid, PART_START(2) + at, len, 0x71, at);
		rec_dma(nsid, PART_START(2) + at, len, self->bdf, "write");
	}
	close(fd);
}

/*
 * raid1 with a leg on the root-port controller: refused before any bio (md
 * would fail that leg), named in the log; COMPAT writes both legs through
 * host memory. The guest checks /proc/mdstat afterwards.
 */
TEST_F(stk, md_raid1_mixed_refused)
{
	const __u64 at = 4 * MiB, len = MiB;
	struct p2pdirect_io r;
	int fd = open_env("P2P_MD_MIXED");
	int before = klog_has("one of 2 paths or legs");
	__u64 bounced;

	ASSERT_LE(0, fd);
	buf_fill(self, 0, len, 0x72, at);
	EXPECT_EQ(-EREMOTEIO, io(self, 1, fd, 0, 0, len, at, &r));
	EXPECT_EQ(-EREMOTEIO, io(self, 0, fd, 0, MiB, len, at, &r));
	EXPECT_LT(before, klog_has("one of 2 paths or legs"));
	bounced = stat_bounced(self->dev, fd);
	ASSERT_EQ(0, io(self, 1, fd, P2PDIRECT_IO_COMPAT, 0, len, at, &r));
	EXPECT_EQ(bounced + len, stat_bounced(self->dev, fd));
	EXPECT_EQ(len, r.bytes);
	EXPECT_EQ(len, r.bounce_bytes);
	EXPECT_EQ(0ull, r.p2p_bytes);
	rec_nvme(7, PART_START(3) + at, len, 0x72, at);
	rec_dma(7, PART_START(3) + at, len, NULL, "write");
	rec_nvme(9, PART_START(1) + at, len, 0x72, at);
	rec_dma(9, PART_START(1) + at, len, NULL, "write");
	close(fd);
}

/*
 * A raid1 of one leg, on the root port (as an array with one member left,
 * or a multipath head with one path): refused, and the log names that leg
 * (P2P_MD_ONE_LEG, nsid 9 p2), as it does one of two.
 */
TEST_F(stk, md_one_leg_unreachable_names_it)
{
	const char *leg = getenv("P2P_MD_ONE_LEG");
	struct p2pdirect_io r;
	int fd = open_env("P2P_MD_ONE_RP");
	char said[96];
	int before;

	ASSERT_LE(0, fd);
	ASSERT_NE(NULL, leg);
	snprintf(said, sizeof(said), "READ: %s at ", leg);
	before = klog_has(said);
	EXPECT_EQ(-EREMOTEIO, io(self, 0, fd, 0, 0, MiB, 4 * MiB, &r));
	EXPECT_LT(before, klog_has(said)) TH_LOG("no log line naming %s", leg);
	EXPECT_LT(0, klog_has("(the only path or leg under fd"));
	close(fd);
}

/* dm does not advertise P2PDMA: EOPNOTSUPP; COMPAT bounces. */
TEST_F(stk, dm_linear_refused)
{
	struct p2pdirect_io r;
	int fd = open_env("P2P_DM_LINEAR");

	ASSERT_LE(0, fd);
	EXPECT_EQ(-EOPNOTSUPP, io(self, 0, fd, 0, 0, MiB, 2 * MiB, &r));
	ASSERT_EQ(0, io(self, 0, fd, P2PDIRECT_IO_COMPAT, 0, MiB, 2 * MiB, &r));
	rec_gpu_fill(self, 0, MiB, 8, PART_START(3) + 2 * MiB);
	EXPECT_EQ(MiB, r.bounce_bytes);
	EXPECT_EQ(0ull, fill_diff(self->map, MiB, PART_START(3) + 2 * MiB, 8));
	rec_dma(8, PART_START(3) + 2 * MiB, MiB, NULL, "read");
	close(fd);
}

/* Offsets on a partition are relative to its start. */
TEST_F(stk, partition_p2p)
{
	const __u64 base = PART_START(4);
	struct p2pdirect_io r;
	int fd = open_env("P2P_PART");

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, io(self, 0, fd, 0, 0, MiB, MiB, &r));
	rec_gpu_fill(self, 0, MiB, 7, base + MiB);
	EXPECT_EQ(MiB, r.p2p_bytes);
	EXPECT_EQ(0ull, fill_diff(self->map, MiB, base + MiB, 7));
	rec_dma(7, base + MiB, MiB, self->bdf, "read");

	buf_fill(self, MiB, MiB, 0x73, 2 * MiB);
	ASSERT_EQ(0, io(self, 1, fd, 0, MiB, MiB, 2 * MiB, &r));
	EXPECT_EQ(MiB, r.p2p_bytes);
	rec_nvme(7, base + 2 * MiB, MiB, 0x73, 2 * MiB);
	rec_dma(7, base + 2 * MiB, MiB, self->bdf, "write");
	close(fd);
}

static int probe(struct _test_data_stk *self, int fd, struct p2pdirect_dma_probe *p)
{
	memset(p, 0, sizeof(*p));
	p->addr = (uintptr_t)self->map;
	p->size = MiB;
	p->fd = fd;
	return ioctl(self->dev, P2PDIRECT_IOC_DMA_PROBE, p) ? -errno : 0;
}

/*
 * DMA_PROBE of the device the guest named in @var, opened with @flags: 0 or
 * -errno; 1 if it does not open.
 */
static int probe_env(struct _test_data_stk *self, const char *var, int flags,
		     struct p2pdirect_dma_probe *p)
{
	int fd = open_env_flags(var, flags), ret;

	if (fd < 0)
		return 1;
	ret = probe(self, fd, p);
	close(fd);
	return ret;
}

#define RW (O_RDWR | O_DIRECT)

/* DMA_PROBE checks every leg and maps for the first. */
TEST_F(stk, dma_probe_stacked)
{
	struct p2pdirect_dma_probe p;

	ASSERT_EQ(0, probe_env(self, "P2P_MD_RAID1", RW, &p));
	EXPECT_LT(0u, p.count);
	EXPECT_NE(0u, p.dma_pci_addr);
	EXPECT_EQ(0, probe_env(self, "P2P_MPATH_SW", RW, &p));
	EXPECT_EQ(-EREMOTEIO, probe_env(self, "P2P_MD_MIXED", RW, &p));
	EXPECT_EQ(-EREMOTEIO, probe_env(self, "P2P_MPATH_MIX", RW, &p));
}

/*
 * DMA_PROBE follows a stack P2PDIRECT_STACK_MAX_DEPTH levels deep and
 * P2PDIRECT_STACK_MAX_LEGS legs wide, and refuses one a level deeper
 * (ELOOP) or a leg wider (E2BIG). The stacks are read-only devices.
 */
TEST_F(stk, dma_probe_stack_limits)
{
	struct p2pdirect_dma_probe p;
	int deep, wide;

	ASSERT_EQ(4, P2PDIRECT_STACK_MAX_DEPTH);
	ASSERT_EQ(32, P2PDIRECT_STACK_MAX_LEGS);
	ASSERT_EQ(0, probe_env(self, "P2P_DM_DEEP4", O_RDONLY, &p));
	EXPECT_LT(0u, p.count);
	EXPECT_NE(0u, p.dma_pci_addr);
	ASSERT_EQ(0, probe_env(self, "P2P_DM_WIDE32", O_RDONLY, &p));
	EXPECT_LT(0u, p.count);
	/*
	 * Each refusal is logged; the module's messages are limited to 10 per
	 * 5 s, and the tests before this one print some: a new window first.
	 */
	sleep(6);
	deep = klog_has("limit: more than 4 levels deep");
	wide = klog_has("limit: more than 32 legs");
	EXPECT_EQ(-ELOOP, probe_env(self, "P2P_DM_DEEP5", O_RDONLY, &p));
	EXPECT_EQ(0u, p.count);
	EXPECT_EQ(-E2BIG, probe_env(self, "P2P_DM_WIDE33", O_RDONLY, &p));
	EXPECT_EQ(0u, p.count);
	EXPECT_LT(deep, klog_has("limit: more than 4 levels deep"));
	EXPECT_LT(wide, klog_has("limit: more than 32 legs"));
}

/*
 * md arrays stacked on md1 (raid1 of one leg each): 4 md levels above the
 * namespaces (md5) carry P2P I/O to both legs of md1; at 5 (md6) READ and
 * WRITE are refused before any bio with EREMOTEIO and a log message that
 * names the limit, DMA_PROBE with ELOOP; COMPAT bounces.
 */
TEST_F(stk, md_stack_limit)
{
	const __u64 at = 8 * MiB, len = 256 * KiB, at2 = 9 * MiB;
	const char *limit = "limit: more than 4 levels deep; set";
	struct p2pdirect_dma_probe p;
	struct p2pdirect_io r;
	int fd4 = open_env("P2P_MD_DEEP4"), fd5 = open_env("P2P_MD_DEEP5");
	int before;
	__u64 bounced;

	ASSERT_LE(0, fd4);
	ASSERT_LE(0, fd5);
	write_read_back(_metadata, self, fd4, 0x74, at, len);
	for (int nsid = 7; nsid <= 8; nsid++) {
		rec_nvme(nsid, PART_START(2) + at, len, 0x74, at);
		rec_dma(nsid, PART_START(2) + at, len, self->bdf, "write");
	}
	EXPECT_EQ(0, probe(self, fd4, &p));
	EXPECT_EQ(-ELOOP, probe(self, fd5, &p));

	/* A new window of the log's rate limit (see dma_probe_stack_limits). */
	sleep(6);
	before = klog_has(limit);
	buf_fill(self, 0, len, 0x75, at2);
	EXPECT_EQ(-EREMOTEIO, io(self, 1, fd5, 0, 0, len, at2, &r));
	EXPECT_EQ(-EREMOTEIO, io(self, 0, fd5, 0, MiB, len, at2, &r));
	EXPECT_LE(before + 2, klog_has(limit));
	bounced = stat_bounced(self->dev, fd5);
	ASSERT_EQ(0, io(self, 1, fd5, P2PDIRECT_IO_COMPAT, 0, len, at2, &r));
	EXPECT_EQ(len, r.bytes);
	EXPECT_EQ(len, r.bounce_bytes);
	EXPECT_EQ(0ull, r.p2p_bytes);
	EXPECT_EQ(bounced + len, stat_bounced(self->dev, fd5));
	for (int nsid = 7; nsid <= 8; nsid++) {
		rec_nvme(nsid, PART_START(2) + at2, len, 0x75, at2);
		rec_dma(nsid, PART_START(2) + at2, len, NULL, "write");
	}
	close(fd5);
	close(fd4);
}

/* The partition's end bounds I/O like the end of a device. */
TEST_F(stk, partition_end)
{
	const __u64 base = PART_START(4), size = 15 * MiB, half = MiB / 2;
	struct p2pdirect_io r;
	int fd = open_env("P2P_PART");

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, io(self, 0, fd, 0, 0, MiB, size - half, &r));
	rec_gpu_fill(self, 0, half, 7, base + size - half);
	EXPECT_EQ(half, r.bytes);
	EXPECT_EQ(0ull, fill_diff(self->map, half, base + size - half, 7));
	ASSERT_EQ(0, io(self, 0, fd, 0, 0, MiB, size, &r));
	EXPECT_EQ(0ull, r.bytes);

	buf_fill(self, MiB, MiB, 0x74, size - half);
	ASSERT_EQ(0, io(self, 1, fd, 0, MiB, MiB, size - half, &r));
	EXPECT_EQ(half, r.bytes);
	rec_nvme(7, base + size - half, half, 0x74, size - half);
	rec_dma(7, base + size - half, half, self->bdf, "write");
	EXPECT_EQ(-ENOSPC, io(self, 1, fd, 0, MiB, MiB, size, &r));
	close(fd);
}

struct reg_call {
	int dev;
	__u64 addr;
	int ret;
	int err;
};

static void *register_thread(void *p)
{
	struct reg_call *c = p;
	struct p2pdirect_register r = { .addr = c->addr, .size = 4096 };

	c->ret = ioctl(c->dev, P2PDIRECT_IOC_REGISTER, &r);
	c->err = errno;
	return NULL;
}

static void *query_thread(void *p)
{
	struct reg_call *c = p;
	struct p2pdirect_reg_id q = { .id = 1ull << 62 };

	c->ret = ioctl(c->dev, P2PDIRECT_IOC_REG_QUERY, &q);
	c->err = errno;
	return NULL;
}

/* dmsetup @verb of the dm device at @path. */
static int dm(const char *verb, const char *path)
{
	char cmd[PATH_MAX + 64];

	snprintf(cmd, sizeof(cmd), "dmsetup %s --noudevsync %s 2>/tmp/dmsetup.err", verb,
		 basename((char *)path));
	return system(cmd);
}

/*
 * REGISTER looks the memory up with no lock of the file held: a REGISTER
 * whose page fault waits (here for a suspended dm device; a FUSE daemon or
 * a userfaultfd handler can make it wait as long as it likes) does not hold
 * up the file's other commands, in another thread or in another process
 * sharing the file. Until ABI 1.17 a REG_QUERY, DEREGISTER or REGISTER
 * waited for that fault, unkillable.
 */
TEST_F(stk, register_fault_does_not_block_the_file)
{
	const char *path = getenv("P2P_DM_LINEAR");
	struct reg_call reg = { .dev = self->dev }, query = { .dev = self->dev };
	struct timespec until;
	pthread_t rt, qt;
	int fd, joined = -1;
	bool r_started, q_started = false;
	void *m;

	ASSERT_NE(NULL, path);
	fd = open(path, O_RDONLY);
	ASSERT_LE(0, fd);
	/* Nothing of it in the page cache: the fault must read the device. */
	ASSERT_EQ(0, ioctl(fd, BLKFLSBUF, 0));
	m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 8 * MiB);
	ASSERT_NE(MAP_FAILED, m);
	reg.addr = (uintptr_t)m;
	ASSERT_EQ(0, dm("suspend", path));
	/* Until the resume: no ASSERT, which would leave the device suspended. */
	r_started = !pthread_create(&rt, NULL, register_thread, &reg);
	EXPECT_TRUE(r_started);
	if (r_started) {
		usleep(500 * 1000);	/* the REGISTER is in its fault, waiting */
		q_started = !pthread_create(&qt, NULL, query_thread, &query);
		EXPECT_TRUE(q_started);
	}
	if (q_started) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 10;
		joined = pthread_timedjoin_np(qt, NULL, &until);
		EXPECT_EQ(0, joined) TH_LOG("REG_QUERY waited for another thread's REGISTER fault");
		/* And the REGISTER was still in its fault meanwhile. */
		EXPECT_EQ(EBUSY, pthread_tryjoin_np(rt, NULL));
	}
	EXPECT_EQ(0, dm("resume", path));
	if (r_started)
		pthread_join(rt, NULL);
	if (q_started && joined)
		pthread_join(qt, NULL);
	EXPECT_EQ(-1, query.ret);
	EXPECT_EQ(ENOENT, query.err);
	/* Page-cache pages: no client claims them. */
	EXPECT_EQ(-1, reg.ret);
	EXPECT_EQ(ENXIO, reg.err);
	munmap(m, 4096);
	close(fd);
}

/* Sectors read from the block device at @path so far (its stat), or -1. */
static long long sectors_read(const char *path)
{
	struct stat st;

	return stat(path, &st) ? -1 : blk_stat(st.st_rdev, 3);
}

/* The state letter of process @pid (/proc/PID/stat), or 0. */
static char proc_state(pid_t pid)
{
	char path[32], buf[256], *p;
	int fd, n;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : 0;
}

/*
 * A COMPAT READ bounces through host memory 1 MiB at a time; a task killed
 * during one stops after that chunk (its result goes nowhere). Before, it
 * read on to the end, as long as the device took: here 4 MiB from a
 * suspended dm device, and an io_uring worker of a dying process doing such
 * a bounce held up the process's exit (which io_uring WARNs about after
 * five minutes). The READ runs in a child sharing the /dev/p2pdirect file
 * (registered memory needs no mapping there); the device's own read count
 * shows how far it went.
 */
TEST_F(stk, killed_compat_read_stops_after_its_chunk)
{
	const char *path = getenv("P2P_DM_LINEAR");
	struct p2pdirect_register rg = {
		.addr = (uintptr_t)self->map, .size = BUF, .flags = P2PDIRECT_REG_WRITE,
	};
	long long before, after;
	int fd, status = 0;
	char state = 0;
	pid_t pid;

	ASSERT_NE(NULL, path);
	fd = open(path, O_RDONLY | O_DIRECT);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &rg));
	before = sectors_read(path);
	ASSERT_LE(0, before);
	ASSERT_EQ(0, dm("suspend", path));
	/* Until the resume: no ASSERT, which would leave the device suspended. */
	pid = fork();
	if (pid == 0) {
		struct p2pdirect_io r = {
			.fd = fd, .flags = P2PDIRECT_IO_REGISTERED | P2PDIRECT_IO_COMPAT,
			.addr = rg.id, .size = BUF, .file_offset = 2 * MiB,
		};

		ioctl(self->dev, P2PDIRECT_IOC_READ, &r);
		_exit(0);
	}
	EXPECT_LT(0, pid);
	for (int i = 0; pid > 0 && i < 200 && state != 'D'; i++) {
		usleep(50 * 1000);
		state = proc_state(pid);
	}
	EXPECT_EQ('D', state) TH_LOG("the READ did not wait for the suspended device");
	if (pid > 0)
		kill(pid, SIGKILL);
	usleep(200 * 1000);
	EXPECT_EQ(0, dm("resume", path));
	if (pid > 0) {
		EXPECT_EQ(pid, waitpid(pid, &status, 0));
		EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	after = sectors_read(path);
	EXPECT_EQ((long long)(MiB / 512), after - before)
		TH_LOG("the killed READ read %lld sectors, not its first chunk's", after - before);
	EXPECT_EQ(0ull, fill_diff(self->map, MiB, PART_START(3) + 2 * MiB, 8));
	rec_gpu_fill(self, 0, MiB, 8, PART_START(3) + 2 * MiB);
	rec_dma(8, PART_START(3) + 2 * MiB, MiB, NULL, "read");
	for (__u64 i = MiB; i < BUF; i++)
		if (self->map[i]) {
			EXPECT_EQ(0, self->map[i]) TH_LOG("device memory at %#llx written",
							  (unsigned long long)i);
			break;
		}
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER,
			   &(struct p2pdirect_reg_id){ .id = rg.id }));
	close(fd);
}

TEST_HARNESS_MAIN
