// SPDX-License-Identifier: GPL-2.0
/*
 * Direct storage I/O tests of /dev/p2pdirect (kselftest harness, TAP on
 * stdout): READ and WRITE between NVMe namespaces or ext4/xfs files and the
 * emulated GPUs' memory, COMPAT bounce, registrations, concurrency, bad input.
 *
 * The test VM's disks (ci/make-disks.sh): NSID 1 raw and NSID 2 ext4 and
 * NSID 3 xfs on the controller behind the switch (P2P-reachable from the
 * GPUs), NSID 4 raw on the controller on its own root port (not reachable).
 * The first 32 MiB of NSIDs 1 and 4, and /mnt/{ext4,xfs}/data.bin, hold the
 * fill pattern with seed = NSID. Read tests check the data in the guest and
 * leave records for the host, which proves where the bytes went:
 *   # HOSTCHECK gpu=BDF off=N len=N (fill=S pos=P | ns=NSID nsoff=N | zero) guard=N
 *   # NVMECHECK ns=NSID off=N len=N fill=S pos=P
 *   # DMACHECK ns=NSID off=N len=N where=(gpu:BDF | ram)
 * (ci/hostcheck.py and ci/dmacheck.py). Regions of the namespaces are split
 * so that one GPU's P2P I/O never shares blocks with another GPU's or with
 * the bounce path: NSID 1 reads [0, 16M) gpu0, [24M, 32M) gpu1 (devmem_test
 * writes at 16M and 20M); writes from 64M ([112M, 113M) the O_DSYNC test);
 * [158M, 159M) the page-cache test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"

#define DEV_PATH "/dev/p2pdirect"
#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GUARD (64 * KiB)

/* --- small helpers --------------------------------------------------------- */

struct gpu {
	__u32 index;		/* provider index */
	__u32 pci;		/* P2PDIRECT_PCI_ADDR */
	char bdf[32];
};

/* An allocation of device memory, mapped, with GUARD bytes on each side. */
struct dbuf {
	struct p2pdirect_alloc a;
	__u8 *map;		/* whole allocation */
	__u8 *p;		/* usable part, after the front guard */
	__u64 len;		/* usable bytes */
	const struct gpu *g;
};

static int dbuf_new(int fd, const struct gpu *g, __u64 len, struct dbuf *b)
{
	memset(b, 0, sizeof(*b));
	b->a.provider = g->index;
	b->a.size = len + 2 * GUARD;
	if (ioctl(fd, P2PDIRECT_IOC_ALLOC, &b->a))
		return -errno;
	b->map = mmap(NULL, b->a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		      b->a.mmap_offset);
	if (b->map == MAP_FAILED)
		return -errno;
	b->p = b->map + GUARD;
	b->len = len;
	b->g = g;
	/* Start from a known state, and tell the host. */
	memset(b->map, 0, b->a.size);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)b->a.provider_offset, (unsigned long long)b->a.size);
	return 0;
}

static int dbuf_free(int fd, struct dbuf *b)
{
	struct p2pdirect_free f = { .handle = b->a.handle };

	munmap(b->map, b->a.size);
	return ioctl(fd, P2PDIRECT_IOC_FREE, &f) ? -errno : 0;
}

/* Offset in the GPU's BAR of byte @off of the usable part. */
/* A new allocation of @len bytes, all of it registered for devices to write into. */
static int dbuf_registered(int fd, const struct gpu *g, __u64 len, struct dbuf *b,
			   struct p2pdirect_register *reg)
{
	int r = dbuf_new(fd, g, len, b);

	if (r)
		return r;
	*reg = (struct p2pdirect_register){
		.addr = (uintptr_t)b->p, .size = len, .flags = P2PDIRECT_REG_WRITE,
	};
	return ioctl(fd, P2PDIRECT_IOC_REGISTER, reg) ? -errno : 0;
}

static __u64 gpu_off(const struct dbuf *b, __u64 off)
{
	return b->a.provider_offset + GUARD + off;
}

static int do_io(int dev, unsigned long cmd, struct p2pdirect_io *io)
{
	return ioctl(dev, cmd, io) ? -errno : 0;
}

static int rw(int dev, bool write, int fd, __u32 flags, __u64 addr, __u64 size, __u64 foff,
	      __u64 boff, struct p2pdirect_io *out)
{
	struct p2pdirect_io io = {
		.fd = fd, .flags = flags, .addr = addr, .size = size,
		.file_offset = foff, .buf_offset = boff,
	};
	int r = do_io(dev, write ? P2PDIRECT_IOC_WRITE : P2PDIRECT_IOC_READ, &io);

	if (out)
		*out = io;
	return r;
}

static __u64 nonzero(const __u8 *p, __u64 len)
{
	__u64 n = 0;

	for (__u64 i = 0; i < len; i++)
		n += p[i] != 0;
	return n;
}

static void rec_fill(const struct dbuf *b, __u64 off, __u64 len, __u64 seed, __u64 pos)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu fill=%llu pos=%llu guard=0\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len,
	       (unsigned long long)seed, (unsigned long long)pos);
}

static void rec_ns(const struct dbuf *b, __u64 off, __u64 len, int nsid, __u64 nsoff,
		   __u64 guard)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu ns=%d nsoff=%llu guard=%llu\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len, nsid,
	       (unsigned long long)nsoff, (unsigned long long)guard);
}

static void rec_zero(const struct dbuf *b, __u64 off, __u64 len)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", b->g->bdf,
	       (unsigned long long)gpu_off(b, off), (unsigned long long)len);
}

static void rec_nvme(int nsid, __u64 off, __u64 len, __u64 seed, __u64 pos)
{
	printf("# NVMECHECK ns=%d off=%llu len=%llu fill=%llu pos=%llu\n", nsid,
	       (unsigned long long)off, (unsigned long long)len, (unsigned long long)seed,
	       (unsigned long long)pos);
}

/* DMACHECK of the commands on a range; @op "read" or "write" only those (NULL: all). */
static void rec_dma_op(int nsid, __u64 off, __u64 len, const char *gpu_bdf, const char *op)
{
	printf("# DMACHECK ns=%d off=%llu len=%llu where=%s%s%s%s\n", nsid,
	       (unsigned long long)off, (unsigned long long)len, gpu_bdf ? "gpu:" : "ram",
	       gpu_bdf ? gpu_bdf : "", op ? " op=" : "", op ? op : "");
}

static void rec_dma(int nsid, __u64 off, __u64 len, const char *gpu_bdf)
{
	rec_dma_op(nsid, off, len, gpu_bdf, NULL);
}

/*
 * Physical pieces of [pos, pos + len) of the file @fd: calls @fn(logical,
 * physical, len, unwritten, ctx) for each. Returns the bytes mapped.
 */
static __u64 walk_extents(int fd, __u64 pos, __u64 len,
			     void (*fn)(__u64 logical, __u64 physical, __u64 len, int unwritten,
					void *ctx),
			     void *ctx)
{
	size_t sz = sizeof(struct fiemap) + 64 * sizeof(struct fiemap_extent);
	struct fiemap *fm = calloc(1, sz);
	__u64 mapped = 0;

	if (!fm)
		return 0;
	fm->fm_start = pos;
	fm->fm_length = len;
	fm->fm_flags = FIEMAP_FLAG_SYNC;
	fm->fm_extent_count = 64;
	if (ioctl(fd, FS_IOC_FIEMAP, fm) == 0) {
		for (unsigned int i = 0; i < fm->fm_mapped_extents; i++) {
			struct fiemap_extent *e = &fm->fm_extents[i];
			__u64 lo = e->fe_logical > pos ? e->fe_logical : pos;
			__u64 hi = e->fe_logical + e->fe_length;

			if (hi > pos + len)
				hi = pos + len;
			if (lo >= hi)
				continue;
			fn(lo, e->fe_physical + (lo - e->fe_logical), hi - lo,
			   !!(e->fe_flags & FIEMAP_EXTENT_UNWRITTEN), ctx);
			mapped += hi - lo;
		}
	}
	free(fm);
	return mapped;
}

/* Records for a READ of a file at @pos into @b at @boff. */
struct read_rec {
	const struct dbuf *b;
	__u64 pos, boff;
	int nsid;
};

static void read_rec_fn(__u64 logical, __u64 physical, __u64 len, int unwritten, void *ctx)
{
	struct read_rec *r = ctx;
	__u64 at = r->boff + (logical - r->pos);

	if (unwritten) {
		rec_zero(r->b, at, len);
		return;
	}
	rec_ns(r->b, at, len, r->nsid, physical, 0);
	rec_dma(r->nsid, physical, len, r->b->g->bdf);
}

/* Records for a WRITE of fill(seed) bytes, pattern position = file offset. */
struct write_rec {
	int nsid;
	__u64 seed;
	const char *bdf;
};

static void write_rec_fn(__u64 logical, __u64 physical, __u64 len, int unwritten, void *ctx)
{
	struct write_rec *w = ctx;

	if (unwritten)
		return;
	rec_nvme(w->nsid, physical, len, w->seed, logical);
	rec_dma(w->nsid, physical, len, w->bdf);
}

/* --- fixture --------------------------------------------------------------- */

FIXTURE(st) {
	int dev;
	struct gpu gpu[2];
	char ns1[64], ns4[64];
};

FIXTURE_SETUP(st)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	int g = 0;

	/* Records reach the host line by line, and forks never duplicate them. */
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
	ASSERT_TRUE(find_nvme_nsid(4, self->ns4, sizeof(self->ns4), NULL));
}

FIXTURE_TEARDOWN(st)
{
	close(self->dev);
}

/* --- raw namespace --------------------------------------------------------- */

/* NSID 1 -> each GPU: 4 MiB, the data checked in the guest and by the host. */
TEST_F(st, raw_read_both_gpus)
{
	for (int g = 0; g < 2; g++) {
		__u64 foff = g * 24 * MiB + 3 * MiB, len = 4 * MiB;
		struct p2pdirect_io out;
		struct dbuf b;
		int fd;

		ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[g], len, &b));
		fd = open(self->ns1, O_RDONLY | O_DIRECT);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, foff, 0, &out));
		EXPECT_EQ(len, out.bytes);
		EXPECT_EQ(len, out.p2p_bytes);
		EXPECT_EQ(0u, out.bounce_bytes);
		EXPECT_EQ(0u, out.zeroed_bytes);
		EXPECT_NE(0u, out.dma_pci_addr);
		EXPECT_EQ(0u, fill_diff(b.p, len, foff, 1));
		EXPECT_EQ(0u, nonzero(b.map, GUARD));
		EXPECT_EQ(0u, nonzero(b.p + len, GUARD));
		rec_ns(&b, 0, len, 1, foff, GUARD);
		rec_dma(1, foff, len, b.g->bdf);
		close(fd);
		/*
		 * Not freed here: the host reads it after the run, unless the
		 * fixture's close frees it and a later test's ALLOC zeroes it
		 * (then the host reports the record as superseded, a SKIP).
		 */
	}
}

/* Each GPU -> NSID 1, then back into the other half of the buffer. */
TEST_F(st, raw_write_both_gpus)
{
	for (int g = 0; g < 2; g++) {
		__u64 foff = 64 * MiB + g * 16 * MiB, len = 2 * MiB + 512 * KiB;
		__u64 seed = 0x100 + g;
		struct p2pdirect_io out;
		struct dbuf b;
		int fd;

		ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[g], 2 * len, &b));
		fill_buf(b.p, len, foff, seed);
		rec_fill(&b, 0, len, seed, foff);
		fd = open(self->ns1, O_RDWR | O_DIRECT);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, foff, 0, &out));
		EXPECT_EQ(len, out.bytes);
		EXPECT_EQ(len, out.p2p_bytes);
		rec_nvme(1, foff, len, seed, foff);
		ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, foff, len, &out));
		EXPECT_EQ(len, out.bytes);
		EXPECT_EQ(0u, fill_diff(b.p + len, len, foff, seed));
		rec_ns(&b, len, len, 1, foff, 0);
		rec_dma(1, foff, len, b.g->bdf);
		close(fd);
	}
}

/* Cache flushes the block device open as @fd completed (stat field 16), or -1. */
static long flushes(int fd)
{
	struct stat st;

	return fstat(fd, &st) || !S_ISBLK(st.st_mode) ? -1 : blk_stat(st.st_rdev, 16);
}

/* queue/write_cache of the block device open as @fd, into @buf ("" if none). */
static void cache_mode(int fd, char *buf, size_t size)
{
	struct stat st;
	char path[96];

	buf[0] = 0;
	if (fstat(fd, &st))
		return;
	blk_attr(st.st_rdev, "queue/write_cache", path, sizeof(path));
	if (!nvme_read_attr(path, buf, size))
		buf[0] = 0;
}

/*
 * A WRITE to a namespace opened O_DSYNC is durable when it returns, as
 * write(2)'s is: FUA bios, then a flush of the device's cache, so the
 * device's flush count moves by what an O_DSYNC pwrite moves it by (FUA
 * writes are not flushes); without O_DSYNC it does not move. NSID 1
 * [112 MiB, +768 KiB): a WRITE, a pwrite, an O_DSYNC WRITE.
 */
TEST_F(st, dsync_write_flushes_as_pwrite_does)
{
	__u64 pos = 112 * MiB, len = 256 * KiB, seed = 0x600;
	long before, plain, theirs, ours;
	struct p2pdirect_io out;
	char cache[32] = "";
	struct dbuf b;
	int fd, sfd;
	void *ram;

	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	sfd = open(self->ns1, O_RDWR | O_DIRECT | O_DSYNC);
	ASSERT_GE(sfd, 0);
	cache_mode(fd, cache, sizeof(cache));
	ASSERT_EQ(0, strncmp(cache, "write back", 10))
		TH_LOG("NSID 1 has no volatile write cache (%s): no flush to see", cache);
	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	ASSERT_EQ(0, posix_memalign(&ram, 4096, len));

	fill_buf(b.p, len, pos, seed);
	before = flushes(fd);
	ASSERT_LE(0, before);
	ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, pos, 0, &out));
	EXPECT_EQ(len, out.bytes);
	plain = flushes(fd) - before;

	fill_buf(ram, len, pos + len, seed);
	before = flushes(fd);
	ASSERT_EQ((ssize_t)len, pwrite(sfd, ram, len, pos + len));
	theirs = flushes(fd) - before;

	fill_buf(b.p, len, pos + 2 * len, seed);
	before = flushes(fd);
	ASSERT_EQ(0, rw(self->dev, true, sfd, 0, (uintptr_t)b.p, len, pos + 2 * len, 0, &out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(len, out.p2p_bytes);
	ours = flushes(fd) - before;

	EXPECT_EQ(0, plain) TH_LOG("a WRITE without O_DSYNC flushed the device");
	EXPECT_LE(1, theirs) TH_LOG("an O_DSYNC pwrite did not flush the device");
	EXPECT_EQ(theirs, ours)
		TH_LOG("an O_DSYNC WRITE flushed %ld times, pwrite %ld", ours, theirs);
	rec_fill(&b, 0, len, seed, pos + 2 * len);
	rec_nvme(1, pos, 3 * len, seed, pos);
	rec_dma_op(1, pos, len, b.g->bdf, "write");
	rec_dma_op(1, pos + len, len, NULL, "write");
	rec_dma_op(1, pos + 2 * len, len, b.g->bdf, "write");
	free(ram);
	EXPECT_EQ(0, dbuf_free(self->dev, &b));
	close(sfd);
	close(fd);
}

/*
 * The page cache of the raw namespace, NSID 1 [158, 159) MiB: a READ sees
 * data a buffered writer left dirty in the cache (written back first), and
 * a buffered reader sees what a WRITE put on the device (the cached pages
 * of its range dropped). Through a registration, whose pages I/O finds
 * with no lock.
 */
TEST_F(st, raw_io_and_the_page_cache)
{
	__u64 pos = 158 * MiB, len = 256 * KiB, wpos = pos + 512 * KiB;
	struct p2pdirect_register reg = { 0 };
	struct p2pdirect_io out;
	__u8 *dirty, *cached;
	struct dbuf b;
	int fd, bfd;

	ASSERT_EQ(0, dbuf_registered(self->dev, &self->gpu[0], 2 * len, &b, &reg));
	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	bfd = open(self->ns1, O_RDWR);
	ASSERT_GE(bfd, 0);
	dirty = malloc(len);
	cached = malloc(len);
	ASSERT_NE(NULL, dirty);
	ASSERT_NE(NULL, cached);

	/* Dirty in the cache only: no fsync, so the device still has old bytes. */
	fill_buf(dirty, len, pos, 0x158);
	ASSERT_EQ((ssize_t)len, pwrite(bfd, dirty, len, pos));
	ASSERT_EQ(0, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg.id, len, pos, 0, &out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(len, out.p2p_bytes);
	EXPECT_EQ(0u, fill_diff(b.p, len, pos, 0x158))
		TH_LOG("the READ did not see the data left dirty in the page cache");
	rec_ns(&b, 0, len, 1, pos, 0);
	rec_nvme(1, pos, len, 0x158, pos);
	rec_dma_op(1, pos, len, b.g->bdf, "read");

	/* Cached and clean: a buffered read brings the old bytes in. */
	ASSERT_EQ((ssize_t)len, pread(bfd, cached, len, wpos));
	fill_buf(b.p + len, len, wpos, 0x159);
	ASSERT_EQ(0, rw(self->dev, true, fd, P2PDIRECT_IO_REGISTERED, reg.id, len, wpos, len,
			&out));
	EXPECT_EQ(len, out.bytes);
	ASSERT_EQ((ssize_t)len, pread(bfd, cached, len, wpos));
	EXPECT_EQ(0u, fill_diff(cached, len, wpos, 0x159))
		TH_LOG("a buffered read after the WRITE saw stale cached data");
	rec_fill(&b, len, len, 0x159, wpos);
	rec_nvme(1, wpos, len, 0x159, wpos);
	rec_dma_op(1, wpos, len, b.g->bdf, "write");
	free(dirty);
	free(cached);
	close(bfd);
	close(fd);
	/*
	 * Not freed here: the host reads it after the run, unless the
	 * fixture's close frees it and a later test's ALLOC zeroes it
	 * (then the host reports the record as superseded, a SKIP).
	 */
}

/* One I/O bigger than a bio: the engine splits by the queue limits. */
TEST_F(st, raw_read_spans_many_bios)
{
	__u64 foff = 8 * MiB, len = 6 * MiB + 4 * KiB;
	struct p2pdirect_io out;
	struct dbuf b;
	int fd;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, foff, 0, &out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(0u, fill_diff(b.p, len, foff, 1));
	EXPECT_EQ(0u, nonzero(b.p + len, GUARD));
	rec_ns(&b, 0, len, 1, foff, GUARD);
	rec_dma(1, foff, len, b.g->bdf);
	close(fd);
}

/* pread semantics at the end of the namespace. */
TEST_F(st, raw_end_of_device)
{
	struct p2pdirect_io out;
	struct dbuf b;
	__u64 size;
	int fd;

	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, ioctl(fd, BLKGETSIZE64, &size));
	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[1], MiB, &b));
	/* Crossing the end: stops there. */
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, MiB, size - 8 * KiB, 0, &out));
	EXPECT_EQ(8 * KiB, out.bytes);
	/* At the end: 0 bytes; a write there: ENOSPC. */
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, MiB, size, 0, &out));
	EXPECT_EQ(0u, out.bytes);
	EXPECT_EQ(-ENOSPC, rw(self->dev, true, fd, 0, (uintptr_t)b.p, MiB, size, 0, NULL));
	/*
	 * There, and past it, the memory is checked first (since ABI 1.11), as
	 * before a transfer and as for a file: host memory, an unknown
	 * registration.
	 */
	for (int w = 0; w < 2; w++) {
		__u64 at = size + w * MiB;

		EXPECT_EQ(-ENXIO, rw(self->dev, w, fd, 0, (uintptr_t)&size & ~4095ull, 4096, at,
				     0, NULL));
		EXPECT_EQ(-ENOENT, rw(self->dev, w, fd, P2PDIRECT_IO_REGISTERED, 12345, 4096, at,
				      0, NULL));
	}
	close(fd);
	EXPECT_EQ(0u, nonzero(b.p + 8 * KiB, MiB - 8 * KiB));
	rec_zero(&b, 8 * KiB, MiB - 8 * KiB);
	EXPECT_EQ(0, dbuf_free(self->dev, &b));
}

/* --- files ------------------------------------------------------------------ */

static const char *const mnt[] = { "/mnt/ext4", "/mnt/xfs" };

/* data.bin of ext4 (NSID 2) and xfs (NSID 3) -> both GPUs. */
TEST_F(st, file_read_ext4_xfs_both_gpus)
{
	for (int fs = 0; fs < 2; fs++) {
		for (int g = 0; g < 2; g++) {
			int nsid = 2 + fs;
			__u64 pos = (g ? 4 : 1) * MiB, len = 2 * MiB;
			struct p2pdirect_io out;
			struct read_rec r;
			char path[64];
			struct dbuf b;
			int fd;

			snprintf(path, sizeof(path), "%s/data.bin", mnt[fs]);
			fd = open(path, O_RDONLY | O_DIRECT);
			ASSERT_GE(fd, 0) TH_LOG("%s: %s", path, strerror(errno));
			ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[g], len, &b));
			ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, pos, 0, &out));
			EXPECT_EQ(len, out.bytes);
			EXPECT_EQ(len, out.p2p_bytes);
			EXPECT_EQ(0u, out.zeroed_bytes);
			EXPECT_EQ(0u, fill_diff(b.p, len, pos, nsid)) TH_LOG("%s gpu%d", path, g);
			EXPECT_EQ(0u, nonzero(b.p + len, GUARD));
			r = (struct read_rec){ .b = &b, .pos = pos, .boff = 0, .nsid = nsid };
			EXPECT_EQ(len, walk_extents(fd, pos, len, read_rec_fn, &r));
			close(fd);
		}
	}
}

/* Each GPU -> a new file on ext4 and xfs: extends it, leaves a hole. */
TEST_F(st, file_write_extends_ext4_xfs_both_gpus)
{
	for (int fs = 0; fs < 2; fs++) {
		for (int g = 0; g < 2; g++) {
			int nsid = 2 + fs;
			__u64 len = MiB + 256 * KiB, hole_at = 3 * MiB;
			__u64 seed = 0x200 + fs * 2 + g;
			struct write_rec w = { .nsid = nsid, .seed = seed, .bdf = self->gpu[g].bdf };
			struct p2pdirect_io out;
			char path[64];
			struct dbuf b;
			struct stat st;
			int fd;

			snprintf(path, sizeof(path), "%s/w-gpu%d.bin", mnt[fs], g);
			fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
			ASSERT_GE(fd, 0) TH_LOG("%s: %s", path, strerror(errno));
			ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[g], 2 * len, &b));
			/* Pattern position = file offset, for both pieces. */
			fill_buf(b.p, len, 0, seed);
			fill_buf(b.p + len, len, hole_at, seed);
			rec_fill(&b, 0, len, seed, 0);
			rec_fill(&b, len, len, seed, hole_at);
			ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, 0, 0, &out));
			EXPECT_EQ(len, out.bytes);
			EXPECT_EQ(len, out.p2p_bytes);
			ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, hole_at, len,
					&out));
			EXPECT_EQ(len, out.bytes);
			ASSERT_EQ(0, fsync(fd));
			ASSERT_EQ(0, fstat(fd, &st));
			EXPECT_EQ(hole_at + len, (__u64)st.st_size);
			EXPECT_EQ(len, walk_extents(fd, 0, len, write_rec_fn, &w));
			EXPECT_EQ(len, walk_extents(fd, hole_at, len, write_rec_fn, &w));
			close(fd);
		}
	}
}

/*
 * A hole, an unwritten (fallocated) extent and data, read in one READ: the
 * first two arrive as zeros the file system wrote with the CPU (counted as
 * zeroed_bytes), the data by DMA; at EOF the read is short.
 */
TEST_F(st, file_holes_unwritten_and_eof)
{
	for (int fs = 0; fs < 2; fs++) {
		int nsid = 2 + fs, g = fs;
		__u64 seed = 0x300 + fs, part = MiB;
		struct p2pdirect_io out;
		struct read_rec r;
		char path[64];
		struct dbuf b;
		int fd;

		snprintf(path, sizeof(path), "%s/holes.bin", mnt[fs]);
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(0, ftruncate(fd, part));			/* [0, 1M): hole */
		ASSERT_EQ(0, fallocate(fd, 0, part, part));		/* [1M, 2M): unwritten */
		/* Room for the 3.5 MiB the READ asks for, after the first MiB. */
		ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[g], 5 * part, &b));
		fill_buf(b.p, part, 2 * part, seed);			/* [2M, 3M): data */
		rec_fill(&b, 0, part, seed, 2 * part);
		ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, part, 2 * part, 0, &out));
		ASSERT_EQ(part, out.bytes);
		ASSERT_EQ(0, fsync(fd));
		/* Fill the target with non-zero bytes, so the zeros must come from the read. */
		fill_buf(b.p + part, 3 * part, 0, 0x3ff);
		rec_fill(&b, part, 3 * part, 0x3ff, 0);
		/* Asks for 3 MiB + 512 KiB: the file ends at 3 MiB. */
		ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, 3 * part + 512 * KiB, 0,
				part, &out));
		EXPECT_EQ(3 * part, out.bytes);
		EXPECT_EQ(2 * part, out.zeroed_bytes);
		EXPECT_EQ(part, out.p2p_bytes);
		EXPECT_EQ(0u, nonzero(b.p + part, 2 * part));
		EXPECT_EQ(0u, fill_diff(b.p + 3 * part, part, 2 * part, seed));
		rec_zero(&b, part, part);		/* the hole: no extent */
		r = (struct read_rec){ .b = &b, .pos = 0, .boff = part, .nsid = nsid };
		walk_extents(fd, 0, 3 * part, read_rec_fn, &r);
		/* At EOF: 0 bytes. */
		ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, part, 3 * part, 0, &out));
		EXPECT_EQ(0u, out.bytes);
		close(fd);
	}
}

/* --- reachability and COMPAT ------------------------------------------------ */

/* NSID 4 sits on its own root port: not reachable without COMPAT. */
TEST_F(st, unreachable_nvme_and_compat)
{
	__u64 foff = 2 * MiB, len = 3 * MiB, wpos = 64 * MiB, seed = 0x400;
	struct p2pdirect_io out;
	struct dbuf b;
	int fd;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], 2 * len, &b));
	fd = open(self->ns4, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	EXPECT_EQ(-EREMOTEIO, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, foff, 0, NULL));
	EXPECT_EQ(-EREMOTEIO, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, wpos, 0, NULL));
	EXPECT_EQ(0u, nonzero(b.map, b.a.size));
	ASSERT_EQ(0, rw(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)b.p, len, foff, 0,
			&out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(len, out.bounce_bytes);
	EXPECT_EQ(0u, out.p2p_bytes);
	EXPECT_EQ(0u, fill_diff(b.p, len, foff, 4));
	rec_ns(&b, 0, len, 4, foff, 0);
	rec_dma(4, foff, len, NULL);
	fill_buf(b.p + len, len, wpos, seed);
	rec_fill(&b, len, len, seed, wpos);
	ASSERT_EQ(0, rw(self->dev, true, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)b.p, len, wpos, len,
			&out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(len, out.bounce_bytes);
	rec_nvme(4, wpos, len, seed, wpos);
	rec_dma(4, wpos, len, NULL);
	close(fd);
}

/* --- registrations ---------------------------------------------------------- */

TEST_F(st, registered_buffers)
{
	struct p2pdirect_register reg = { 0 }, ro = { 0 };
	__u64 len = MiB, foff = 12 * MiB;
	struct p2pdirect_io out;
	struct dbuf b;
	int fd;

	ASSERT_EQ(0, dbuf_registered(self->dev, &self->gpu[0], 2 * len, &b, &reg));
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg.id, len, foff, len,
			&out));
	EXPECT_EQ(len, out.bytes);
	EXPECT_EQ(0u, fill_diff(b.p + len, len, foff, 1));
	EXPECT_EQ(0u, nonzero(b.p, len));
	rec_ns(&b, len, len, 1, foff, 0);
	rec_dma(1, foff, len, b.g->bdf);
	/* Past the registration; unknown id. */
	EXPECT_EQ(-ERANGE, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg.id, len, foff,
			      len + 4096, NULL));
	EXPECT_EQ(-ENOENT, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg.id + 1000, len,
			      foff, 0, NULL));
	/* A registration devices may not write into: no READ into it. */
	ro.addr = (uintptr_t)b.p;
	ro.size = len;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &ro));
	EXPECT_EQ(-EPERM, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, ro.id, len, foff, 0,
			     NULL));
	close(fd);
	/* Freed memory: the registration is dead, I/O through it ESTALE. */
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_EQ(0, dbuf_free(self->dev, &b));
	EXPECT_EQ(-ESTALE, rw(self->dev, false, fd, P2PDIRECT_IO_REGISTERED, reg.id, len, foff, 0,
			      NULL));
	close(fd);
}

/* --- statistics -------------------------------------------------------------- */

static int stats(int dev, struct p2pdirect_stat *rows, unsigned int cap, __u32 flags)
{
	struct p2pdirect_stats req = { .entries = (uintptr_t)rows, .capacity = cap,
				       .flags = flags };

	if (ioctl(dev, P2PDIRECT_IOC_STATS, &req))
		return -errno;
	return req.count;
}

static struct p2pdirect_stat *stat_row(struct p2pdirect_stat *rows, int n, __u32 kind, __u32 id)
{
	for (int i = 0; i < n; i++)
		if (rows[i].kind == kind && rows[i].id == id)
			return &rows[i];
	return NULL;
}

/*
 * STATS into @rows; *@prov and *@blk point to the rows of provider @pci and
 * of the block device @st is (NULL if there is none). Returns the count.
 */
static int stat_rows(int dev, struct p2pdirect_stat *rows, __u32 pci, const struct stat *st,
		     struct p2pdirect_stat **prov, struct p2pdirect_stat **blk)
{
	int n = stats(dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, 0);

	*prov = stat_row(rows, n, P2PDIRECT_STAT_PROVIDER, pci);
	*blk = stat_row(rows, n, P2PDIRECT_STAT_BLOCK,
			(major(st->st_rdev) << 20) | minor(st->st_rdev));
	return n;
}

/*
 * STATS counts per provider and per block device: operations, bytes by
 * path, errors, latency; RESET zeroes them; the debugfs file shows the same
 * rows and a write to it resets too.
 */
TEST_F(st, statistics)
{
	struct p2pdirect_stat rows[P2PDIRECT_STATS_MAX_ENTRIES], *prov, *blk;
	struct p2pdirect_stats bad = { .flags = 0x80 };
	__u64 len = 256 * KiB, size;
	struct p2pdirect_io out;
	char line[512];
	struct dbuf b;
	struct stat st;
	int fd, n, found = 0;
	FILE *f;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, fstat(fd, &st));
	ASSERT_GE(stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, P2PDIRECT_STATS_RESET), 0);
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, 2 * MiB, 0, &out));
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, 2 * MiB + len, 0, &out));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, fd, 0, (uintptr_t)b.p, 100, 0, 0, NULL));
	/* A READ at the end moves nothing and is not counted (it neither moved data nor failed). */
	ASSERT_EQ(0, ioctl(fd, BLKGETSIZE64, &size));
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, size, 0, &out));
	EXPECT_EQ(0u, out.bytes);
	rec_ns(&b, 0, len, 1, 2 * MiB + len, 0);
	rec_dma(1, 2 * MiB, 2 * len, b.g->bdf);
	n = stat_rows(self->dev, rows, self->gpu[0].pci, &st, &prov, &blk);
	ASSERT_GT(n, 0);
	EXPECT_LE(n, P2PDIRECT_STATS_MAX_ENTRIES);
	ASSERT_NE(NULL, prov);
	ASSERT_NE(NULL, blk);
	EXPECT_EQ(2u, prov->reads);
	EXPECT_EQ(2 * len, prov->bytes_read);
	EXPECT_EQ(2 * len, prov->p2p_bytes);
	EXPECT_EQ(0u, prov->bounce_bytes);
	EXPECT_EQ(3u, blk->reads);		/* the refused one counts, as an error */
	EXPECT_EQ(1u, blk->errors);
	EXPECT_EQ(2 * len, blk->bytes_read);
	EXPECT_LT(0u, blk->lat_min_ns);
	EXPECT_LE(blk->lat_min_ns, blk->lat_avg_ns);
	EXPECT_LE(blk->lat_avg_ns, blk->lat_max_ns);
	/* The debugfs file shows the rows; a write resets. */
	f = fopen("/sys/kernel/debug/p2pdirect/stats", "r");
	ASSERT_NE(NULL, f);
	while (fgets(line, sizeof(line), f))
		found += !strncmp(line, "provider", 8) || !strncmp(line, "block", 5);
	fclose(f);
	EXPECT_LE(2, found);
	f = fopen("/sys/kernel/debug/p2pdirect/stats", "w");
	ASSERT_NE(NULL, f);
	fputs("0\n", f);
	EXPECT_EQ(0, fclose(f));
	n = stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	for (int i = 0; i < n; i++)
		EXPECT_EQ(0u, rows[i].reads + rows[i].writes + rows[i].bytes_read);
	/* Counting only; bad flags. */
	EXPECT_EQ(n, stats(self->dev, NULL, 0, 0));
	EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_STATS, &bad));
	EXPECT_EQ(EINVAL, errno);
	close(fd);
}

/*
 * A WRITE at a raw namespace's end fails once its memory was found: it
 * counts as a failed WRITE in the provider's row as well as the block
 * device's, as the header says (until 1.17 only in the block device's).
 */
/*
 * The rows count bytes by path: a COMPAT READ's in @bounce_bytes, a file
 * READ's holes in @zeroed_bytes and the rest in @p2p_bytes, in the
 * provider's row and the block device's alike; a READ refused for its fd
 * (no O_DIRECT) counts in no row.
 */
TEST_F(st, statistics_count_bounced_and_zeroed_bytes)
{
	struct p2pdirect_stat rows[P2PDIRECT_STATS_MAX_ENTRIES], *prov, *blk;
	__u64 len = MiB, foff = 6 * MiB, seed = 0x3a1;
	struct p2pdirect_io out;
	struct read_rec r;
	struct stat st;
	struct dbuf b;
	int fd, nod;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], 2 * len, &b));
	fd = open(self->ns4, O_RDONLY | O_DIRECT);
	nod = open(self->ns4, O_RDONLY);
	ASSERT_GE(fd, 0);
	ASSERT_GE(nod, 0);
	ASSERT_EQ(0, fstat(fd, &st));
	ASSERT_GE(stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, P2PDIRECT_STATS_RESET), 0);
	EXPECT_EQ(-EINVAL, rw(self->dev, false, nod, 0, (uintptr_t)b.p, len, foff, 0, NULL));
	ASSERT_EQ(0, rw(self->dev, false, fd, P2PDIRECT_IO_COMPAT, (uintptr_t)b.p, len, foff, 0,
			&out));
	EXPECT_EQ(len, out.bounce_bytes);
	rec_ns(&b, 0, len, 4, foff, 0);
	rec_dma(4, foff, len, NULL);
	ASSERT_GT(stat_rows(self->dev, rows, self->gpu[0].pci, &st, &prov, &blk), 0);
	ASSERT_NE(NULL, prov);
	ASSERT_NE(NULL, blk);
	EXPECT_EQ(1u, blk->reads);		/* the refused READ is not there */
	EXPECT_EQ(0u, blk->errors);
	EXPECT_EQ(len, blk->bounce_bytes);
	EXPECT_EQ(0u, blk->p2p_bytes);
	EXPECT_EQ(1u, prov->reads);
	EXPECT_EQ(len, prov->bounce_bytes);
	EXPECT_EQ(len, prov->bytes_read);
	close(nod);
	close(fd);

	/* xfs: a file of a hole, then a MiB of data. */
	fd = open("/mnt/xfs/stats-holes.bin", O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	ASSERT_GE(fd, 0);
	fill_buf(b.p, len, len, seed);
	rec_fill(&b, 0, len, seed, len);
	ASSERT_EQ(0, rw(self->dev, true, fd, 0, (uintptr_t)b.p, len, len, 0, &out));
	ASSERT_EQ(len, out.bytes);
	ASSERT_EQ(0, fsync(fd));
	ASSERT_EQ(0, fstat(fd, &st));
	st.st_rdev = st.st_dev;			/* the row of the file system's device */
	fill_buf(b.p, 2 * len, 0, 0x3a2);
	rec_fill(&b, 0, 2 * len, 0x3a2, 0);
	ASSERT_GE(stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, P2PDIRECT_STATS_RESET), 0);
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, 2 * len, 0, 0, &out));
	EXPECT_EQ(2 * len, out.bytes);
	EXPECT_EQ(len, out.zeroed_bytes);
	EXPECT_EQ(len, out.p2p_bytes);
	EXPECT_EQ(0u, nonzero(b.p, len));
	EXPECT_EQ(0u, fill_diff(b.p + len, len, len, seed));
	rec_zero(&b, 0, len);
	r = (struct read_rec){ .b = &b, .pos = len, .boff = len, .nsid = 3 };
	walk_extents(fd, len, len, read_rec_fn, &r);
	ASSERT_GT(stat_rows(self->dev, rows, self->gpu[0].pci, &st, &prov, &blk), 0);
	ASSERT_NE(NULL, prov);
	ASSERT_NE(NULL, blk);
	EXPECT_EQ(1u, blk->reads);
	EXPECT_EQ(2 * len, blk->bytes_read);
	EXPECT_EQ(len, blk->zeroed_bytes);
	EXPECT_EQ(len, blk->p2p_bytes);
	EXPECT_EQ(0u, blk->bounce_bytes);
	EXPECT_EQ(len, prov->zeroed_bytes);
	EXPECT_EQ(len, prov->p2p_bytes);
	/*
	 * The file stays: its blocks, freed, would be written by later tests,
	 * whose commands the host's check of this range would then count.
	 */
	close(fd);
	EXPECT_EQ(0, dbuf_free(self->dev, &b));
}

TEST_F(st, statistics_write_at_the_end_counts_for_the_provider)
{
	struct p2pdirect_stat rows[P2PDIRECT_STATS_MAX_ENTRIES], *prov, *blk;
	struct dbuf b;
	struct stat st;
	__u64 size;
	int fd;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], 64 * KiB, &b));
	fd = open(self->ns1, O_RDWR | O_DIRECT);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(0, fstat(fd, &st));
	ASSERT_EQ(0, ioctl(fd, BLKGETSIZE64, &size));
	ASSERT_GE(stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, P2PDIRECT_STATS_RESET), 0);
	EXPECT_EQ(-ENOSPC, rw(self->dev, true, fd, 0, (uintptr_t)b.p, 4096, size, 0, NULL));
	ASSERT_GT(stat_rows(self->dev, rows, self->gpu[0].pci, &st, &prov, &blk), 0);
	ASSERT_NE(NULL, prov);
	ASSERT_NE(NULL, blk);
	EXPECT_EQ(1u, prov->writes);
	EXPECT_EQ(1u, prov->errors);
	EXPECT_EQ(0u, prov->bytes_written);
	EXPECT_EQ(1u, blk->writes);
	EXPECT_EQ(1u, blk->errors);
	close(fd);
	EXPECT_EQ(0, dbuf_free(self->dev, &b));
}

/*
 * STATS with RESET resets the entries it copied out: the ones past the
 * caller's capacity keep their counts (ABI 1.10).
 */
TEST_F(st, statistics_reset_keeps_what_it_did_not_return)
{
	struct p2pdirect_stat before[P2PDIRECT_STATS_MAX_ENTRIES];
	struct p2pdirect_stat after[P2PDIRECT_STATS_MAX_ENTRIES];
	struct p2pdirect_stat first;
	__u64 len = 64 * KiB;
	int fd, n, m, kept = 0;
	struct dbuf b;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(fd, 0);
	/* At least two rows with counts: the GPU's and NSID 1's. */
	ASSERT_EQ(0, rw(self->dev, false, fd, 0, (uintptr_t)b.p, len, 0, 0, NULL));
	rec_ns(&b, 0, len, 1, 0, GUARD);
	close(fd);
	n = stats(self->dev, before, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	ASSERT_GE(n, 2);
	ASSERT_EQ(n, stats(self->dev, &first, 1, P2PDIRECT_STATS_RESET));
	EXPECT_EQ(before[0].kind, first.kind);
	EXPECT_EQ(before[0].id, first.id);
	EXPECT_EQ(before[0].reads, first.reads);
	m = stats(self->dev, after, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	ASSERT_EQ(n, m);
	EXPECT_EQ(0u, after[0].reads + after[0].writes + after[0].bytes_read);
	for (int i = 1; i < n; i++) {
		kept += before[i].reads != 0;
		EXPECT_EQ(before[i].kind, after[i].kind);
		EXPECT_EQ(before[i].id, after[i].id);
		EXPECT_EQ(before[i].reads, after[i].reads);
		EXPECT_EQ(before[i].writes, after[i].writes);
		EXPECT_EQ(before[i].bytes_read, after[i].bytes_read);
	}
	/* The I/O above counted in two rows, so at least one is past the first. */
	EXPECT_LT(0, kept);
}

/* --- bad input --------------------------------------------------------------- */

/*
 * Every refusal leaves the target untouched: the whole allocation is zero
 * afterwards (checked here and by the host), and so is the NVMe region a
 * refused WRITE aimed at.
 */
TEST_F(st, bad_input)
{
	__u64 len = 256 * KiB, wpos = 128 * MiB, top;
	int rd, wr, nod, pipefd[2], sock[2], dir, tmp, closed;
	struct p2pdirect_io io;
	void *ram;
	struct dbuf b;
	__u64 p;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[1], len, &b));
	p = (uintptr_t)b.p;
	rd = open(self->ns1, O_RDONLY | O_DIRECT);
	wr = open(self->ns1, O_WRONLY | O_DIRECT);
	nod = open(self->ns1, O_RDWR);
	ASSERT_GE(rd, 0);
	ASSERT_GE(wr, 0);
	ASSERT_GE(nod, 0);
	ASSERT_EQ(0, pipe(pipefd));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sock));
	dir = open("/mnt/ext4", O_RDONLY | O_DIRECTORY);
	ASSERT_GE(dir, 0);
	tmp = open("/tmp/odirect.bin", O_RDWR | O_CREAT | O_DIRECT, 0600);
	ASSERT_GE(tmp, 0) TH_LOG("tmpfs O_DIRECT open: %s", strerror(errno));
	ASSERT_EQ(0, ftruncate(tmp, MiB));
	closed = dup(rd);
	close(closed);

	/* Sizes and offsets. */
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 0, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 4096 + 100, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 100, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 0, 100, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p + 100, 4096, 0, 0, NULL));
	EXPECT_EQ(-EFAULT, rw(self->dev, false, rd, 0, p, len + GUARD + 4096, 0, 0, NULL));
	EXPECT_EQ(-EFAULT, rw(self->dev, false, rd, 0, p, 8192, 0, len + GUARD - 4096, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 0, (__u64)-4096, NULL));
	/* A file offset that is a negative loff_t, block-aligned: pread's EINVAL. */
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 1ull << 63, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, true, wr, 0, p, 4096, (__u64)-4096, 0, NULL));
	/* Flags and padding. */
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0x80, p, 4096, 0, 0, NULL));
	io = (struct p2pdirect_io){ .fd = rd, .addr = p, .size = 4096, .pad = 1 };
	EXPECT_EQ(-EINVAL, do_io(self->dev, P2PDIRECT_IOC_READ, &io));
	/* File descriptors. */
	EXPECT_EQ(-EBADF, rw(self->dev, false, closed, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EBADF, rw(self->dev, false, -1, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EBADF, rw(self->dev, true, rd, 0, p, 4096, wpos, 0, NULL));
	EXPECT_EQ(-EBADF, rw(self->dev, false, wr, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, nod, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, true, nod, 0, p, 4096, wpos, 0, NULL));
	EXPECT_EQ(-ESPIPE, rw(self->dev, false, pipefd[0], 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-ESPIPE, rw(self->dev, true, pipefd[1], 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-ESPIPE, rw(self->dev, false, sock[0], 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EISDIR, rw(self->dev, false, dir, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, false, self->dev, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EOPNOTSUPP, rw(self->dev, false, tmp, 0, p, 4096, 0, 0, NULL));
	EXPECT_EQ(-EOPNOTSUPP, rw(self->dev, true, tmp, 0, p, 4096, 0, 0, NULL));
	/* Memory that is not device memory. */
	ASSERT_EQ(0, posix_memalign(&ram, 4096, len));
	memset(ram, 0x5a, len);
	EXPECT_EQ(-ENXIO, rw(self->dev, false, rd, 0, (uintptr_t)ram, 4096, 0, 0, NULL));
	EXPECT_EQ(-ENXIO, rw(self->dev, true, wr, 0, (uintptr_t)ram, 4096, wpos, 0, NULL));
	for (__u64 i = 0; i < len; i++)
		ASSERT_EQ(0x5a, ((__u8 *)ram)[i]);
	/*
	 * Past the device's end, a range whose end overflows loff_t: read(2)
	 * and write(2) refuse it in rw_verify_area() before they test the end,
	 * and so do READ and WRITE (since ABI 1.16; before, 0 bytes and ENOSPC).
	 * Inside loff_t it is the end: 0 bytes and ENOSPC.
	 */
	top = (1ull << 63) - 8192;
	errno = 0;
	EXPECT_EQ(-1, pread(rd, ram, 8192, (off_t)top));
	EXPECT_EQ(EINVAL, errno);
	errno = 0;
	EXPECT_EQ(-1, pwrite(wr, ram, 8192, (off_t)top));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(-EINVAL, rw(self->dev, false, rd, 0, p, 8192, top, 0, NULL));
	EXPECT_EQ(-EINVAL, rw(self->dev, true, wr, 0, p, 8192, top, 0, NULL));
	EXPECT_EQ(0, pread(rd, ram, 4096, (off_t)top));
	errno = 0;
	EXPECT_EQ(-1, pwrite(wr, ram, 4096, (off_t)top));
	EXPECT_EQ(ENOSPC, errno);
	EXPECT_EQ(0, rw(self->dev, false, rd, 0, p, 4096, top, 0, NULL));
	EXPECT_EQ(-ENOSPC, rw(self->dev, true, wr, 0, p, 4096, top, 0, NULL));
	free(ram);
	/* Nothing was written anywhere. */
	EXPECT_EQ(0u, nonzero(b.map, b.a.size));
	close(rd);
	close(wr);
	close(nod);
	close(pipefd[0]);
	close(pipefd[1]);
	close(sock[0]);
	close(sock[1]);
	close(dir);
	close(tmp);
	unlink("/tmp/odirect.bin");
	/* The host: the allocation is still all zero (dbuf_new's record). */
	rec_zero(&b, 0, len);
}

/* --- concurrency -------------------------------------------------------------- */

#define PROCS 3
#define THREADS 4
#define ROUNDS 4
#define SLICE (256 * KiB)

struct worker {
	int dev, fd;
	__u8 *buf;		/* this thread's two slices: read target, write source */
	__u8 *shared;		/* one slice all threads of the process read into */
	__u64 base;		/* this GPU's read region of NSID 1 */
	int proc, thread;
	int failures;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct p2pdirect_io out;

	for (int r = 0; r < ROUNDS; r++) {
		int id = w->proc * THREADS + w->thread;
		__u64 rpos = w->base + ((id * ROUNDS + r) % 32) * SLICE;
		__u64 wpos = 96 * MiB + (id * ROUNDS + r) * SLICE;
		__u64 seed = 0x500 + id;

		/* Own slice: read and check. */
		if (rw(w->dev, false, w->fd, 0, (uintptr_t)w->buf, SLICE, rpos, 0, &out) ||
		    out.bytes != SLICE || fill_diff(w->buf, SLICE, rpos, 1))
			w->failures++;
		/* Shared slice: every thread reads the same blocks into it at once. */
		if (rw(w->dev, false, w->fd, 0, (uintptr_t)w->shared, SLICE, w->base, 0, &out) ||
		    out.bytes != SLICE)
			w->failures++;
		/* Write from device memory, read back into the own slice, check. */
		fill_buf(w->buf + SLICE, SLICE, wpos, seed);
		if (rw(w->dev, true, w->fd, 0, (uintptr_t)w->buf + SLICE, SLICE, wpos, 0, &out) ||
		    out.bytes != SLICE)
			w->failures++;
		if (rw(w->dev, false, w->fd, 0, (uintptr_t)w->buf, SLICE, wpos, 0, &out) ||
		    fill_diff(w->buf, SLICE, wpos, seed))
			w->failures++;
	}
	return NULL;
}

static int run_process(const char *ns, const struct gpu *g, int gi, int proc)
{
	struct worker w[THREADS];
	pthread_t t[THREADS];
	int dev, fd, failures = 0;
	struct dbuf b;

	dev = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	fd = open(ns, O_RDWR | O_DIRECT);
	if (dev < 0 || fd < 0)
		return 100;
	/* Quiet: these allocations are freed at exit; no host record. */
	memset(&b, 0, sizeof(b));
	b.a.provider = g->index;
	b.a.size = (2 * THREADS + 1) * SLICE;
	if (ioctl(dev, P2PDIRECT_IOC_ALLOC, &b.a))
		return 101;
	b.map = mmap(NULL, b.a.size, PROT_READ | PROT_WRITE, MAP_SHARED, dev, b.a.mmap_offset);
	if (b.map == MAP_FAILED)
		return 102;
	for (int i = 0; i < THREADS; i++) {
		w[i] = (struct worker){ .dev = dev, .fd = fd, .proc = proc, .thread = i,
					.base = gi * 24 * MiB,
					.buf = b.map + 2 * i * SLICE,
					.shared = b.map + 2 * THREADS * SLICE };
		if (pthread_create(&t[i], NULL, worker_main, &w[i]))
			return 103;
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		failures += w[i].failures;
	}
	failures += fill_diff(b.map + 2 * THREADS * SLICE, SLICE, gi * 24 * MiB, 1) != 0;
	/* Leave the memory in a state the host knows. */
	memset(b.map, 0, b.a.size);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)b.a.provider_offset, (unsigned long long)b.a.size);
	return failures > 99 ? 99 : failures;
}

/*
 * The module prints at most 10 refusal lines per 5 s (one limit for all):
 * every 8 refusals the test waits the window out, so each gets its line.
 */
static int refusals;

#define EXPECT_SAYS(expected, call, needle)					\
	do {									\
		int before_;							\
										\
		if (refusals++ % 8 == 0)					\
			sleep(6);						\
		before_ = klog_has(needle);					\
		EXPECT_EQ(expected, call);					\
		EXPECT_LT(before_, klog_has(needle))				\
			TH_LOG("no kernel log line with '%s'", needle);		\
	} while (0)

/*
 * Every refusal whose errno alone does not say which rule the call broke
 * leaves a line in the kernel log that does (README "The ABI"). Its pauses
 * take 18 s of the time limit.
 */
TEST_F_TIMEOUT(st, refusals_say_why, 120)
{
	struct p2pdirect_register reg = { 0 }, ro = { 0 };
	struct p2pdirect_alloc a = { .provider = 0xfffff, .size = 4096 };
	struct p2pdirect_dma_probe probe = { 0 };
	int rd, dir, tmp, closed, pipefd[2];
	__u64 len = 256 * KiB, p;
	struct dbuf b;

	ASSERT_EQ(0, dbuf_registered(self->dev, &self->gpu[1], len, &b, &reg));
	p = (uintptr_t)b.p;
	rd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(rd, 0);
	dir = open("/mnt/ext4", O_RDONLY | O_DIRECTORY);
	ASSERT_GE(dir, 0);
	tmp = open("/tmp/odirect-why.bin", O_RDWR | O_CREAT | O_DIRECT, 0600);
	ASSERT_GE(tmp, 0);
	ASSERT_EQ(0, ftruncate(tmp, MiB));
	ASSERT_EQ(0, pipe(pipefd));
	closed = dup(rd);
	close(closed);

	/* The argument. */
	EXPECT_SAYS(-EINVAL, rw(self->dev, false, rd, 0, p, 0, 0, 0, NULL),
		    "READ: size 0: nothing to move");
	EXPECT_SAYS(-EINVAL, rw(self->dev, false, rd, 0x80, p, 4096, 0, 0, NULL),
		    "READ: unknown flags 0x80");
	EXPECT_SAYS(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 1ull << 63, 0, NULL),
		    "is negative as a loff_t");
	EXPECT_SAYS(-EINVAL, rw(self->dev, false, rd, 0, p, 4096, 0, (__u64)-4096, NULL),
		    "overflows");
	/* The file descriptor. */
	EXPECT_SAYS(-EBADF, rw(self->dev, false, closed, 0, p, 4096, 0, 0, NULL),
		    "is not an open file descriptor opened for reading");
	EXPECT_SAYS(-EBADF, rw(self->dev, true, rd, 0, p, 4096, 128 * MiB, 0, NULL),
		    "is not an open file descriptor opened for writing");
	EXPECT_SAYS(-EISDIR, rw(self->dev, false, dir, 0, p, 4096, 0, 0, NULL),
		    "is a directory");
	EXPECT_SAYS(-ESPIPE, rw(self->dev, false, pipefd[0], 0, p, 4096, 0, 0, NULL),
		    "is a pipe or socket");
	EXPECT_SAYS(-EOPNOTSUPP, rw(self->dev, false, tmp, 0, p, 4096, 0, 0, NULL),
		    "is a file on a file system without a block device");
	/* Registrations. */
	EXPECT_SAYS(-ERANGE, rw(self->dev, false, rd, P2PDIRECT_IO_REGISTERED, reg.id, 8192, 0,
				len - 4096, NULL), "runs past registration");
	EXPECT_SAYS(-ENOENT, rw(self->dev, false, rd, P2PDIRECT_IO_REGISTERED, reg.id + 1000,
				4096, 0, 0, NULL), "this file has no registration");
	ro.addr = p + len / 2;
	ro.size = len / 2;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &ro));
	EXPECT_SAYS(-EPERM, rw(self->dev, false, rd, P2PDIRECT_IO_REGISTERED, ro.id, 4096, 0, 0,
			       NULL), "was made without P2PDIRECT_REG_WRITE");
	EXPECT_SAYS(-EEXIST, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &reg) ? -errno : 0,
		    "this file has a live registration of");
	/* Memory a READ cannot write: a read-only mapping of device memory. */
	ASSERT_EQ(0, mprotect(b.map, b.a.size, PROT_READ));
	EXPECT_SAYS(-EFAULT, rw(self->dev, false, rd, 0, p, 4096, 0, 0, NULL),
		    "cannot be pinned for writing");
	/* ALLOC of a provider that does not exist; DMA_PROBE of no block device. */
	EXPECT_SAYS(-ENODEV, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &a) ? -errno : 0,
		    "ALLOC refused: no provider 1048575");
	probe.addr = p;
	probe.size = 4096;
	probe.fd = tmp;
	EXPECT_SAYS(-ENOTBLK, ioctl(self->dev, P2PDIRECT_IOC_DMA_PROBE, &probe) ? -errno : 0,
		    "is not a block device");
	/* Freed memory: its registrations are dead. */
	ASSERT_EQ(0, dbuf_free(self->dev, &b));
	EXPECT_SAYS(-ESTALE, rw(self->dev, false, rd, P2PDIRECT_IO_REGISTERED, reg.id, 4096, 0, 0,
				NULL), "went away (FREE");

	close(pipefd[0]);
	close(pipefd[1]);
	close(tmp);
	unlink("/tmp/odirect-why.bin");
	close(dir);
	close(rd);
}

/*
 * Several processes, several threads each, separate and shared buffers; the
 * statistics, which every thread updates at once, count every I/O.
 */
TEST_F(st, concurrent_processes_and_threads)
{
	const __u64 ios = PROCS * THREADS * ROUNDS;
	struct p2pdirect_stat rows[P2PDIRECT_STATS_MAX_ENTRIES], *blk, *prov;
	__u64 prov_reads = 0, prov_writes = 0;
	pid_t pid[PROCS];
	struct stat st;
	int n;

	ASSERT_EQ(0, stat(self->ns1, &st));
	ASSERT_GE(stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, P2PDIRECT_STATS_RESET), 0);
	for (int p = 0; p < PROCS; p++) {
		pid[p] = fork();
		ASSERT_GE(pid[p], 0);
		if (pid[p] == 0)
			_exit(run_process(self->ns1, &self->gpu[p % 2], p % 2, p));
	}
	for (int p = 0; p < PROCS; p++) {
		int status;

		ASSERT_EQ(pid[p], waitpid(pid[p], &status, 0));
		EXPECT_TRUE(WIFEXITED(status));
		EXPECT_EQ(0, WEXITSTATUS(status)) TH_LOG("process %d: %d failures", p,
							 WEXITSTATUS(status));
	}
	/* Per thread and round: three READs and one WRITE of SLICE bytes. */
	n = stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	ASSERT_GT(n, 0);
	blk = stat_row(rows, n, P2PDIRECT_STAT_BLOCK,
		       (major(st.st_rdev) << 20) | minor(st.st_rdev));
	ASSERT_NE(NULL, blk);
	EXPECT_EQ(3 * ios, blk->reads);
	EXPECT_EQ(ios, blk->writes);
	EXPECT_EQ(0u, blk->errors);
	EXPECT_EQ(3 * ios * SLICE, blk->bytes_read);
	EXPECT_EQ(ios * SLICE, blk->bytes_written);
	EXPECT_EQ(4 * ios * SLICE, blk->p2p_bytes);
	for (int g = 0; g < 2; g++) {
		prov = stat_row(rows, n, P2PDIRECT_STAT_PROVIDER, self->gpu[g].pci);
		if (prov) {
			prov_reads += prov->reads;
			prov_writes += prov->writes;
		}
	}
	EXPECT_EQ(3 * ios, prov_reads);
	EXPECT_EQ(ios, prov_writes);
}

struct racer {
	int dev, fd;
	__u64 addr;
	int stop;		/* __atomic accesses */
	int ok, refused, other;
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;

	while (!__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
		int e = rw(r->dev, false, r->fd, 0, r->addr, MiB, 0, 0, NULL);

		if (!e)
			r->ok++;
		else if (e == -EFAULT)
			r->refused++;
		else
			r->other++;
	}
	return NULL;
}

/* READs racing with FREE: the FREE succeeds, the I/O either completes or is refused. */
TEST_F(st, io_racing_free)
{
	struct racer r = { .dev = self->dev };
	struct p2pdirect_alloc a = { .provider = self->gpu[0].index, .size = MiB };
	struct p2pdirect_free f;
	pthread_t t;
	void *m;

	r.fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(r.fd, 0);
	for (int round = 0; round < 4; round++) {
		ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &a));
		record_alloc_zero(self->dev, &a);
		m = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->dev, a.mmap_offset);
		ASSERT_NE(MAP_FAILED, m);
		r.addr = (uintptr_t)m;
		__atomic_store_n(&r.stop, 0, __ATOMIC_RELAXED);
		/* One whole READ first: the memory then holds NSID 1's first MiB. */
		ASSERT_EQ(0, rw(self->dev, false, r.fd, 0, r.addr, MiB, 0, 0, NULL));
		printf("# HOSTCHECK gpu=%s off=%llu len=%llu ns=1 nsoff=0 guard=0\n",
		       self->gpu[0].bdf, (unsigned long long)a.provider_offset,
		       (unsigned long long)MiB);
		ASSERT_EQ(0, pthread_create(&t, NULL, racer_main, &r));
		usleep(20000 * (round + 1));
		f.handle = a.handle;
		EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_FREE, &f)) TH_LOG("FREE: %s",
									    strerror(errno));
		usleep(20000);
		__atomic_store_n(&r.stop, 1, __ATOMIC_RELAXED);
		pthread_join(t, NULL);
		munmap(m, MiB);
	}
	TH_LOG("%d READs completed, %d refused after FREE", r.ok, r.refused);
	EXPECT_EQ(0, r.other);
	EXPECT_LT(0, r.refused);
	close(r.fd);
}

struct dereg_racer {
	int dev, fd;
	__u64 id;		/* __atomic: the registration to READ through */
	int stop;		/* __atomic */
	int ok, gone, other;
};

static void *dereg_racer_main(void *arg)
{
	struct dereg_racer *r = arg;

	while (!__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
		__u64 id = __atomic_load_n(&r->id, __ATOMIC_ACQUIRE);
		int e = rw(r->dev, false, r->fd, P2PDIRECT_IO_REGISTERED, id, 64 * KiB, 0, 0,
			   NULL);

		if (!e)
			__atomic_add_fetch(&r->ok, 1, __ATOMIC_RELAXED);
		else if (e == -ENOENT)
			__atomic_add_fetch(&r->gone, 1, __ATOMIC_RELAXED);
		else
			__atomic_add_fetch(&r->other, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/*
 * Registered READs from two threads racing with REGISTER and DEREGISTER of
 * their registration on the same file: each READ moves the data or finds
 * no registration (ENOENT), nothing else; what the registrations pinned is
 * given back.
 */
TEST_F(st, registered_io_racing_deregister)
{
	struct dereg_racer r = { .dev = self->dev };
	struct p2pdirect_stat rows[P2PDIRECT_STATS_MAX_ENTRIES], *prov;
	__u64 len = 64 * KiB, pinned;
	pthread_t t[2];
	struct dbuf b;
	int n;

	ASSERT_EQ(0, dbuf_new(self->dev, &self->gpu[0], len, &b));
	r.fd = open(self->ns1, O_RDONLY | O_DIRECT);
	ASSERT_GE(r.fd, 0);
	n = stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	ASSERT_GT(n, 0);
	prov = stat_row(rows, n, P2PDIRECT_STAT_PROVIDER, self->gpu[0].pci);
	pinned = prov ? prov->pinned_bytes : 0;
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(0, pthread_create(&t[i], NULL, dereg_racer_main, &r));
	/* The threads use `r` on this frame: no ASSERT until they are joined. */
	for (int round = 0; round < 200; round++) {
		struct p2pdirect_register reg = { .addr = (uintptr_t)b.p, .size = len,
						  .flags = P2PDIRECT_REG_WRITE };
		struct p2pdirect_reg_id q = { 0 };

		if (ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &reg)) {
			EXPECT_EQ(0, errno) TH_LOG("REGISTER in round %d", round);
			break;
		}
		__atomic_store_n(&r.id, reg.id, __ATOMIC_RELEASE);
		usleep(1000);
		q.id = reg.id;
		if (ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER, &q)) {
			EXPECT_EQ(0, errno) TH_LOG("DEREGISTER in round %d", round);
			break;
		}
		EXPECT_EQ((__u32)P2PDIRECT_REG_LIVE, q.state);
		EXPECT_EQ(-1, ioctl(self->dev, P2PDIRECT_IOC_REG_QUERY, &q));
		EXPECT_EQ(ENOENT, errno);
		usleep(300);
	}
	__atomic_store_n(&r.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	TH_LOG("%d READs completed, %d found no registration", r.ok, r.gone);
	EXPECT_LT(0, r.ok);
	EXPECT_EQ(0, r.other);
	/* Every READ put NSID 1's first 64 KiB there. */
	if (r.ok)
		EXPECT_EQ(0u, fill_diff(b.p, len, 0, 1));
	rec_ns(&b, 0, len, 1, 0, GUARD);
	n = stats(self->dev, rows, P2PDIRECT_STATS_MAX_ENTRIES, 0);
	ASSERT_GT(n, 0);
	prov = stat_row(rows, n, P2PDIRECT_STAT_PROVIDER, self->gpu[0].pci);
	ASSERT_NE(NULL, prov);
	EXPECT_EQ(pinned, prov->pinned_bytes);
	close(r.fd);
}

TEST_HARNESS_MAIN
