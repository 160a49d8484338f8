// SPDX-License-Identifier: GPL-2.0
/*
 * io_uring READ and WRITE (P2PDIRECT_URING_CMD_*, ABI 1.8) through liburing
 * (kselftest harness, TAP on stdout): deep queues on a raw namespace, both
 * GPUs, pointer and registered memory, files on ext4 and xfs, the errors in
 * the CQEs, and FREE, close and ring teardown racing commands in flight.
 *
 * NSID 1 [142, 158) MiB belongs to this suite, 4 MiB to each test that moves
 * data (the last 4 MiB to the two teardown tests, which read the same bytes
 * into the same GPU; of [150, 154) MiB, free_races_commands_in_flight uses
 * 2 MiB and the mixed-ring, ring-setup and cancel tests the rest), and
 * [159, 160) MiB to its page-cache test (storage_test has [158, 159)): no
 * other suite touches them (harden_test reads at 140 and 141 MiB,
 * fault_test starts at 160), so the DMACHECK records (every
 * traced NVMe command on a range had its data pointers in the GPU's BAR)
 * prove where the bytes went; HOSTCHECK and NVMECHECK records prove what
 * they were (ci/hostcheck.py).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define BUF (16 * MiB)
#define OWN (142 * MiB)		/* this suite's part of NSID 1: 16 MiB */
#define QD 128
#define CHUNK (32 * KiB)

struct gpu {
	__u32 index;
	__u32 pci;
	char bdf[32];
	struct p2pdirect_alloc a;
	__u8 *map;
};

FIXTURE(ur) {
	int dev;
	int ns1, ns4;
	struct gpu gpu[2];
	struct io_uring ring;
	int unbound;		/* GPU 1 unbound by a test: bind it again */
};

static int gpu_alloc(int dev, struct gpu *g)
{
	memset(&g->a, 0, sizeof(g->a));
	g->a.provider = g->index;
	g->a.size = BUF;
	if (ioctl(dev, P2PDIRECT_IOC_ALLOC, &g->a))
		return -errno;
	record_alloc_zero(dev, &g->a);
	g->map = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_SHARED, dev, g->a.mmap_offset);
	return g->map == MAP_FAILED ? -errno : 0;
}

static void gpu_free(int dev, struct gpu *g)
{
	struct p2pdirect_free f = { .handle = g->a.handle };

	if (g->map && g->map != MAP_FAILED)
		munmap(g->map, BUF);
	g->map = NULL;
	ioctl(dev, P2PDIRECT_IOC_FREE, &f);
}

FIXTURE_SETUP(ur)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	char ns[64];
	int g = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	self->dev = open("/dev/p2pdirect", O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, self->dev);
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8 && g < 2; i++) {
		if (p[i].kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		self->gpu[g].index = p[i].index;
		self->gpu[g].pci = p[i].pci_addr;
		pci_name(p[i].pci_addr, self->gpu[g].bdf, sizeof(self->gpu[g].bdf));
		ASSERT_EQ(0, gpu_alloc(self->dev, &self->gpu[g]));
		g++;
	}
	ASSERT_EQ(2, g) TH_LOG("need two emulated GPUs");
	ASSERT_TRUE(find_nvme_nsid(1, ns, sizeof(ns), NULL));
	self->ns1 = open(ns, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_LE(0, self->ns1);
	ASSERT_TRUE(find_nvme_nsid(4, ns, sizeof(ns), NULL));
	self->ns4 = open(ns, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_LE(0, self->ns4);
	ASSERT_EQ(0, io_uring_queue_init(2 * QD, &self->ring,
					 IORING_SETUP_SQE128 | IORING_SETUP_CQE32));
}

FIXTURE_TEARDOWN(ur)
{
	if (self->unbound)
		sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", self->gpu[1].bdf);
	io_uring_queue_exit(&self->ring);
	for (int g = 0; g < 2; g++)
		gpu_free(self->dev, &self->gpu[g]);
	close(self->ns1);
	close(self->ns4);
	close(self->dev);
}

static __u8 *cmd_area(struct io_uring_sqe *sqe);

/*
 * Queues one READ or WRITE (@write) on @ring; user_data @ud. A @dev below 0
 * names the ring's registered file -@dev - 1 (IOSQE_FIXED_FILE).
 */
static struct io_uring_sqe *prep(struct io_uring *ring, int dev, int write, int fd,
				 __u32 flags, __u64 addr, __u64 size, __u64 foff, __u64 boff,
				 __u64 ud)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct p2pdirect_uring_io io = {
		.fd = fd, .flags = flags, .addr = addr, .size = size,
		.file_offset = foff, .buf_offset = boff,
	};

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
		if (!sqe)
			abort();
	}
	memset(sqe, 0, 2 * sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = dev < 0 ? -dev - 1 : dev;
	sqe->flags = dev < 0 ? IOSQE_FIXED_FILE : 0;
	sqe->cmd_op = write ? P2PDIRECT_URING_CMD_WRITE : P2PDIRECT_URING_CMD_READ;
	memcpy(cmd_area(sqe), &io, sizeof(io));
	sqe->user_data = ud;
	return sqe;
}

/* The command area of a 128-byte SQE (80 bytes). */
static __u8 *cmd_area(struct io_uring_sqe *sqe)
{
	return (__u8 *)sqe + offsetof(struct io_uring_sqe, cmd);
}

struct done {
	int res;
	__u64 p2p, bounce;
};

/* Reaps @n completions into @d[user_data] (user_data < n). */
static int reap(struct io_uring *ring, unsigned int n, struct done *d)
{
	for (unsigned int i = 0; i < n; i++) {
		struct io_uring_cqe *cqe;
		int ret = io_uring_wait_cqe(ring, &cqe);

		if (ret)
			return ret;
		if (cqe->user_data >= n)
			return -ERANGE;
		d[cqe->user_data].res = cqe->res;
		d[cqe->user_data].p2p = cqe->big_cqe[0] & 0xffffffff;
		d[cqe->user_data].bounce = cqe->big_cqe[0] >> 32;
		io_uring_cqe_seen(ring, cqe);
	}
	return 0;
}

/* One command on @ring, submitted and reaped. */
static struct done one(struct io_uring *ring, int dev, int write, int fd, __u32 flags,
		       __u64 addr, __u64 size, __u64 foff, __u64 boff)
{
	struct done d = { .res = -EIO };
	int n;

	prep(ring, dev, write, fd, flags, addr, size, foff, boff, 0);
	n = io_uring_submit(ring);
	/* An awake SQ thread may take the entry before liburing counts it. */
	if (((ring->flags & IORING_SETUP_SQPOLL) ? n < 0 : n != 1) || reap(ring, 1, &d))
		d.res = -EPROTO;
	return d;
}

/* The STATS row of provider @pci (pinned bytes, reads counted), or -1. */
static int stat_of(int dev, __u32 pci, struct p2pdirect_stat *out)
{
	struct p2pdirect_stat st[64];
	struct p2pdirect_stats req = { .entries = (uintptr_t)st, .capacity = 64 };

	if (ioctl(dev, P2PDIRECT_IOC_STATS, &req))
		return -1;
	for (unsigned int i = 0; i < req.count && i < 64; i++)
		if (st[i].kind == P2PDIRECT_STAT_PROVIDER && st[i].id == pci) {
			*out = st[i];
			return 0;
		}
	return -1;
}

/*
 * Whether provider @pci's pinned bytes rise above @before within 10 s (an
 * io_uring worker pins a command's memory when it starts it).
 */
static int pinned_above(int dev, __u32 pci, __u64 before)
{
	struct p2pdirect_stat now;

	for (int i = 0; i < 100000; i++) {
		if (stat_of(dev, pci, &now))
			return 0;
		if (now.pinned_bytes > before)
			return 1;
		usleep(100);
	}
	return 0;
}

static void rec_gpu(const struct gpu *g, __u64 boff, __u64 len, __u64 seed, __u64 pos)
{
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu fill=%llu pos=%llu guard=0\n", g->bdf,
	       (unsigned long long)(g->a.provider_offset + boff), (unsigned long long)len,
	       (unsigned long long)seed, (unsigned long long)pos);
}

static void rec_nvme(__u64 off, __u64 len, __u64 seed)
{
	printf("# NVMECHECK ns=1 off=%llu len=%llu fill=%llu pos=%llu\n",
	       (unsigned long long)off, (unsigned long long)len, (unsigned long long)seed,
	       (unsigned long long)off);
}

static void rec_dma(const struct gpu *g, __u64 off, __u64 len, const char *op)
{
	printf("# DMACHECK ns=1 off=%llu len=%llu where=gpu:%s op=%s\n",
	       (unsigned long long)off, (unsigned long long)len, g->bdf, op);
}

/*
 * QD 128 on the raw namespace: 128 WRITEs of 32 KiB from GPU 0, all in
 * flight at once, then 128 READs of the same blocks into GPU 1.
 */
TEST_F(ur, qd128_write_then_read_both_gpus)
{
	struct gpu *g0 = &self->gpu[0], *g1 = &self->gpu[1];
	__u64 seed = 0x7101, len = QD * CHUNK;
	struct done d[QD];

	fill_buf(g0->map, len, OWN, seed);
	rec_gpu(g0, 0, len, seed, OWN);
	for (int i = 0; i < QD; i++)
		prep(&self->ring, self->dev, 1, self->ns1, 0, (uintptr_t)g0->map, CHUNK,
		     OWN + i * CHUNK, i * CHUNK, i);
	ASSERT_EQ(QD, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, QD, d));
	for (int i = 0; i < QD; i++) {
		EXPECT_EQ((int)CHUNK, d[i].res) TH_LOG("write %d: %s", i, strerror(-d[i].res));
		EXPECT_EQ(CHUNK, d[i].p2p);
		EXPECT_EQ(0ull, d[i].bounce);
	}
	rec_nvme(OWN, len, seed);
	rec_dma(g0, OWN, len, "write");

	for (int i = 0; i < QD; i++)
		prep(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)g1->map, CHUNK,
		     OWN + i * CHUNK, i * CHUNK, i);
	ASSERT_EQ(QD, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, QD, d));
	for (int i = 0; i < QD; i++) {
		EXPECT_EQ((int)CHUNK, d[i].res) TH_LOG("read %d: %s", i, strerror(-d[i].res));
		EXPECT_EQ(CHUNK, d[i].p2p);
	}
	rec_gpu(g1, 0, len, seed, OWN);
	EXPECT_EQ(0ull, fill_diff(g1->map, len, OWN, seed));
	rec_dma(g1, OWN, len, "read");
}

/* Fills GPU bytes [boff, boff + len) and WRITEs them to NSID 1 at @pos (ioctl). */
static int seed_ns(struct _test_data_ur *self, struct gpu *g, __u64 boff, __u64 len, __u64 pos,
		   __u64 seed)
{
	struct p2pdirect_io w = { .fd = self->ns1, .addr = (uintptr_t)g->map, .size = len,
				  .file_offset = pos, .buf_offset = boff };

	fill_buf(g->map + boff, len, pos, seed);
	rec_gpu(g, boff, len, seed, pos);
	if (ioctl(self->dev, P2PDIRECT_IOC_WRITE, &w))
		return -errno;
	rec_nvme(pos, len, seed);
	return w.bytes == len ? 0 : -EIO;
}

/*
 * Registered memory, mixed: 32 READs of 32 KiB and 32 WRITEs of 32 KiB of
 * NSID 1 [OWN + 4, + 4) MiB, interleaved in one submission; the WRITEs then
 * read back by an ioctl.
 */
TEST_F(ur, mixed_read_write_registered)
{
	struct gpu *g = &self->gpu[1];
	struct p2pdirect_register reg = {
		.addr = (uintptr_t)g->map, .size = BUF, .flags = P2PDIRECT_REG_WRITE,
	};
	__u64 rpos = OWN + 4 * MiB, wpos = OWN + 6 * MiB, len = 32 * CHUNK;
	struct p2pdirect_io back;
	struct done d[64];

	ASSERT_EQ(0, seed_ns(self, g, 0, len, rpos, 0x7202));
	memset(g->map, 0, len);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)len);
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &reg));
	fill_buf(g->map + 4 * MiB, len, wpos, 0x7203);
	rec_gpu(g, 4 * MiB, len, 0x7203, wpos);
	for (int i = 0; i < 32; i++) {
		prep(&self->ring, self->dev, 0, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, CHUNK,
		     rpos + i * CHUNK, i * CHUNK, 2 * i);
		prep(&self->ring, self->dev, 1, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, CHUNK,
		     wpos + i * CHUNK, 4 * MiB + i * CHUNK, 2 * i + 1);
	}
	ASSERT_EQ(64, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, 64, d));
	for (int i = 0; i < 64; i++) {
		EXPECT_EQ((int)CHUNK, d[i].res) TH_LOG("cmd %d: %s", i, strerror(-d[i].res));
		EXPECT_EQ(CHUNK, d[i].p2p);
	}
	rec_gpu(g, 0, len, 0x7202, rpos);
	EXPECT_EQ(0ull, fill_diff(g->map, len, rpos, 0x7202));
	rec_nvme(wpos, len, 0x7203);

	back = (struct p2pdirect_io){ .fd = self->ns1, .addr = (uintptr_t)g->map, .size = len,
				      .file_offset = wpos, .buf_offset = 8 * MiB };
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_READ, &back));
	rec_gpu(g, 8 * MiB, len, 0x7203, wpos);
	EXPECT_EQ(0ull, fill_diff(g->map + 8 * MiB, len, wpos, 0x7203));
	for (__u64 at = rpos; at <= wpos; at += wpos - rpos)
		printf("# DMACHECK ns=1 off=%llu len=%llu where=gpu:%s\n", (unsigned long long)at,
		       (unsigned long long)len, g->bdf);
}

/*
 * The page cache of the raw namespace, NSID 1 [159, 160) MiB: a READ
 * command sees data a buffered writer left dirty (written back first, by
 * io_uring's worker if that must wait), and a buffered reader sees what a
 * WRITE command put on the device (its cached pages dropped).
 */
TEST_F(ur, raw_commands_and_the_page_cache)
{
	struct gpu *g = &self->gpu[0];
	__u64 pos = 159 * MiB, len = 256 * KiB, wpos = pos + 512 * KiB;
	__u8 *buf = malloc(len);
	char ns[64];
	struct done d;
	int bfd;

	ASSERT_NE(NULL, buf);
	ASSERT_TRUE(find_nvme_nsid(1, ns, sizeof(ns), NULL));
	bfd = open(ns, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, bfd);

	/* Dirty in the cache only: no fsync, so the device still has old bytes. */
	fill_buf(buf, len, pos, 0x7159);
	ASSERT_EQ((ssize_t)len, pwrite(bfd, buf, len, pos));
	memset(g->map, 0, len);
	d = one(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)g->map, len, pos, 0);
	EXPECT_EQ((int)len, d.res) TH_LOG("READ: %s", strerror(-d.res));
	EXPECT_EQ(len, d.p2p);
	EXPECT_EQ(0ull, fill_diff(g->map, len, pos, 0x7159))
		TH_LOG("the READ did not see the data left dirty in the page cache");
	rec_gpu(g, 0, len, 0x7159, pos);
	rec_nvme(pos, len, 0x7159);
	rec_dma(g, pos, len, "read");

	/* Cached and clean: a buffered read brings the old bytes in. */
	ASSERT_EQ((ssize_t)len, pread(bfd, buf, len, wpos));
	fill_buf(g->map + len, len, wpos, 0x715a);
	d = one(&self->ring, self->dev, 1, self->ns1, 0, (uintptr_t)g->map, len, wpos, len);
	EXPECT_EQ((int)len, d.res) TH_LOG("WRITE: %s", strerror(-d.res));
	ASSERT_EQ((ssize_t)len, pread(bfd, buf, len, wpos));
	EXPECT_EQ(0ull, fill_diff(buf, len, wpos, 0x715a))
		TH_LOG("a buffered read after the WRITE saw stale cached data");
	rec_gpu(g, len, len, 0x715a, wpos);
	rec_nvme(wpos, len, 0x715a);
	rec_dma(g, wpos, len, "write");
	free(buf);
	close(bfd);
}

/* Threads of this process that are io_uring workers ("iou-wrk-<pid>"). */
static int io_workers(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char path[300], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, "iou-wrk", 7))
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

/*
 * 16 READs of @n bytes at @pos of data.bin on ext4 (@k 0, into GPU 0) or xfs
 * (@k 1, into GPU 1), all in flight at once, with the bytes checked. @warm:
 * a synchronous READ ioctl of the range first reads the file's extents in,
 * and then the READs, asynchronous kiocbs issued inline, must start no
 * io_uring worker thread (a synchronous path would run each in a worker; a
 * NOWAIT read must not wait for extents).
 */
static void file_reads(struct __test_metadata *_metadata, struct _test_data_ur *self, int k,
		       __u64 pos, __u64 n, int warm)
{
	static const struct { const char *path; __u64 seed; } f[] = {
		{ "/mnt/ext4/data.bin", 2 }, { "/mnt/xfs/data.bin", 3 },
	};
	struct gpu *g = &self->gpu[k];
	struct done d[16];
	int fd = open(f[k].path, O_RDONLY | O_DIRECT);
	struct p2pdirect_io sync = {
		.fd = fd, .addr = (uintptr_t)g->map, .size = 16 * n, .file_offset = pos,
	};

	ASSERT_LE(0, fd) TH_LOG("open %s: %s", f[k].path, strerror(errno));
	if (warm) {
		ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_READ, &sync));
		ASSERT_EQ(16 * n, sync.bytes);
	}
	for (int i = 0; i < 16; i++)
		prep(&self->ring, self->dev, 0, fd, 0, (uintptr_t)g->map, n, pos + i * n, i * n, i);
	ASSERT_EQ(16, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, 16, d));
	for (int i = 0; i < 16; i++) {
		EXPECT_EQ((int)n, d[i].res) TH_LOG("%s %d: %s", f[k].path, i, strerror(-d[i].res));
		EXPECT_EQ(n, d[i].p2p);
	}
	if (warm)
		EXPECT_EQ(0, io_workers()) TH_LOG("%s: READs ran in io_uring workers", f[k].path);
	rec_gpu(g, 0, 16 * n, f[k].seed, pos);
	EXPECT_EQ(0ull, fill_diff(g->map, 16 * n, pos, f[k].seed));
	close(fd);
}

/* READs of files on ext4 and xfs, as they come (cold or not). */
TEST_F(ur, files_on_ext4_and_xfs)
{
	for (int k = 0; k < 2; k++)
		file_reads(_metadata, self, k, 6 * MiB, 128 * KiB, 0);
}

/*
 * READs of files are asynchronous kiocbs issued inline (see file_reads), of
 * data.bin [3, 4) MiB, which storage_test does not read.
 */
TEST_F(ur, file_reads_need_no_worker)
{
	ASSERT_EQ(0, io_workers());
	for (int k = 0; k < 2; k++)
		file_reads(_metadata, self, k, 3 * MiB, 64 * KiB, 1);
}

/* Reads merged on the block device holding @fd's file (stat field 2), or -1. */
static long read_merges(int fd)
{
	struct stat st;

	return fstat(fd, &st) ? -1 : blk_stat(st.st_dev, 2);
}

/*
 * A file READ's bios never merge with other I/O. In one submission (one
 * plug): READs of data.bin [p, p + n) and [p + 2n, p + 3n) into GPU memory
 * around an O_DIRECT read of [p + n, p + 2n) into host memory, blocks that
 * lie next to each other on the disk. A request is DMA-mapped as a whole by
 * the kind of its first segment (blk_rq_dma_map_iter_start), so host memory
 * merged behind GPU memory would be given to the controller as bus
 * addresses: the block device must count no merge, and every byte arrives.
 */
TEST_F(ur, file_reads_never_merge_with_other_io)
{
	static const struct { const char *path; __u64 seed; } f[] = {
		{ "/mnt/ext4/data.bin", 2 }, { "/mnt/xfs/data.bin", 3 },
	};
	/* storage_test's DMACHECKs cover data.bin [1, 3) and [4, 6) MiB. */
	const __u64 pos = 7 * MiB, n = 64 * KiB, warm = 8 * MiB;

	for (int k = 0; k < 2; k++) {
		struct gpu *g = &self->gpu[k];
		int fd = open(f[k].path, O_RDONLY | O_DIRECT);
		struct p2pdirect_io sync = {
			.fd = fd, .addr = (uintptr_t)g->map, .size = 3 * n,
			.file_offset = pos, .buf_offset = warm,
		};
		struct io_uring_sqe *sqe;
		struct done d[3];
		long before;
		void *ram;

		ASSERT_LE(0, fd) TH_LOG("open %s: %s", f[k].path, strerror(errno));
		ASSERT_EQ(0, posix_memalign(&ram, 4096, n));
		/* The extents read in, so no READ waits for them. */
		ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_READ, &sync));
		before = read_merges(fd);
		ASSERT_LE(0, before);
		prep(&self->ring, self->dev, 0, fd, 0, (uintptr_t)g->map, n, pos, 0, 0);
		sqe = io_uring_get_sqe(&self->ring);
		ASSERT_NE(NULL, sqe);
		memset(sqe, 0, 2 * sizeof(*sqe));
		io_uring_prep_read(sqe, fd, ram, n, pos + n);
		sqe->user_data = 1;
		prep(&self->ring, self->dev, 0, fd, 0, (uintptr_t)g->map, n, pos + 2 * n, 2 * n, 2);
		ASSERT_EQ(3, io_uring_submit(&self->ring));
		ASSERT_EQ(0, reap(&self->ring, 3, d));
		for (int i = 0; i < 3; i++) {
			EXPECT_EQ((int)n, d[i].res)
				TH_LOG("%s, read %d: %s", f[k].path, i, strerror(-d[i].res));
		}
		EXPECT_EQ(before, read_merges(fd))
			TH_LOG("%s: a READ into GPU memory merged with a read into host memory",
			       f[k].path);
		EXPECT_EQ(0ull, fill_diff(g->map, n, pos, f[k].seed));
		EXPECT_EQ(0ull, fill_diff(ram, n, pos + n, f[k].seed));
		EXPECT_EQ(0ull, fill_diff(g->map + 2 * n, n, pos + 2 * n, f[k].seed));
		free(ram);
		close(fd);
	}
}

/*
 * WRITEs to new files on ext4 and xfs, 16 of 128 KiB in flight (the first
 * ones extend the file), then READs of them back into the other half of the
 * buffer.
 */
TEST_F(ur, file_writes_on_ext4_and_xfs)
{
	static const char *const path[] = { "/mnt/ext4/uring-w.bin", "/mnt/xfs/uring-w.bin" };
	__u64 n = 128 * KiB, len = 16 * n;

	for (int k = 0; k < 2; k++) {
		struct gpu *g = &self->gpu[k];
		__u64 seed = 0x7500 + k;
		struct done d[16];
		int bad = 0;
		int fd = open(path[k], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);

		ASSERT_LE(0, fd) TH_LOG("open %s: %s", path[k], strerror(errno));
		fill_buf(g->map, len, 0, seed);
		rec_gpu(g, 0, len, seed, 0);
		for (int i = 0; i < 16; i++)
			prep(&self->ring, self->dev, 1, fd, 0, (uintptr_t)g->map, n, i * n, i * n,
			     i);
		ASSERT_EQ(16, io_uring_submit(&self->ring));
		ASSERT_EQ(0, reap(&self->ring, 16, d));
		for (int i = 0; i < 16; i++) {
			EXPECT_EQ((int)n, d[i].res) TH_LOG("%s write %d: %s", path[k], i,
							   strerror(-d[i].res));
			EXPECT_EQ(n, d[i].p2p);
		}
		ASSERT_EQ(0, fsync(fd));
		for (int i = 0; i < 16; i++)
			prep(&self->ring, self->dev, 0, fd, 0, (uintptr_t)g->map, n, i * n,
			     len + i * n, i);
		ASSERT_EQ(16, io_uring_submit(&self->ring));
		ASSERT_EQ(0, reap(&self->ring, 16, d));
		for (int i = 0; i < 16; i++)
			bad += d[i].res != (int)n;
		EXPECT_EQ(0, bad) TH_LOG("%s: first read %d", path[k], d[0].res);
		rec_gpu(g, len, len, seed, 0);
		EXPECT_EQ(0ull, fill_diff(g->map + len, len, 0, seed));
		close(fd);
		unlink(path[k]);
	}
}

/* The result of a READ on a ring with 64-byte SQEs (no argument fits). */
static int small_sqe_res(int dev)
{
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	struct io_uring small;
	int res = -EPROTO;

	if (io_uring_queue_init(4, &small, 0))
		return res;
	sqe = io_uring_get_sqe(&small);
	if (sqe) {
		memset(sqe, 0, sizeof(*sqe));
		sqe->opcode = IORING_OP_URING_CMD;
		sqe->fd = dev;
		sqe->cmd_op = P2PDIRECT_URING_CMD_READ;
		if (io_uring_submit(&small) == 1 && !io_uring_wait_cqe(&small, &cqe)) {
			res = cqe->res;
			io_uring_cqe_seen(&small, cqe);
		}
	}
	io_uring_queue_exit(&small);
	return res;
}

/*
 * Sets the SQE field @i of those a READ/WRITE command does not use: ioprio
 * (refused by io_uring itself), addr, len, buf_index, file_index.
 */
static void set_unused_sqe_field(struct io_uring_sqe *sqe, unsigned int i)
{
	switch (i) {
	case 0:
		sqe->ioprio = 1;
		break;
	case 1:
		sqe->addr = 1ull << 63;
		break;
	case 2:
		sqe->len = 4096;
		break;
	case 3:
		sqe->buf_index = 1;
		break;
	default:
		sqe->file_index = 1u << 31;
		break;
	}
}

/* Every bad input gets its errno in the CQE, as the ioctls give it. */
TEST_F(ur, errors_in_cqes)
{
	struct gpu *g = &self->gpu[0];
	__u64 a = (uintptr_t)g->map;
	void *ram = aligned_alloc(4096, 64 * KiB);
	/* Of the 40 reserved bytes after the argument (see the header). */
	static const unsigned int reserved[] = { 0, 7, 8, 31, 32, 39 };
	struct io_uring_sqe *sqe;
	unsigned int i;
	struct done d;
	int ro;

	ASSERT_NE(NULL, ram);
	EXPECT_EQ(-EINVAL, one(&self->ring, self->dev, 0, self->ns1, 0, a, 0, 0, 0).res);
	EXPECT_EQ(-EINVAL, one(&self->ring, self->dev, 0, self->ns1, 0, a, 100, 0, 0).res);
	EXPECT_EQ(-EINVAL, one(&self->ring, self->dev, 0, self->ns1, 0x80, a, 4096, 0, 0).res);
	EXPECT_EQ(-EBADF, one(&self->ring, self->dev, 0, -1, 0, a, 4096, 0, 0).res);
	EXPECT_EQ(-ENXIO, one(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)ram, 4096, 0,
			      0).res);
	EXPECT_EQ(-ENOENT, one(&self->ring, self->dev, 0, self->ns1, P2PDIRECT_IO_REGISTERED,
			       12345, 4096, 0, 0).res);
	/* NSID 4's controller sits on the root port: unreachable, or bounced. */
	EXPECT_EQ(-EREMOTEIO, one(&self->ring, self->dev, 0, self->ns4, 0, a, 4096, 0, 0).res);
	d = one(&self->ring, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, a, 64 * KiB, 0, 0);
	EXPECT_EQ((int)(64 * KiB), d.res);
	EXPECT_EQ(0ull, d.p2p);
	EXPECT_EQ(64 * KiB, d.bounce);
	rec_gpu(g, 0, 64 * KiB, 4, 0);
	EXPECT_EQ(0ull, fill_diff(g->map, 64 * KiB, 0, 4));

	/* Unknown command, reserved bytes, command flags. */
	sqe = prep(&self->ring, self->dev, 0, self->ns1, 0, a, 4096, 0, 0, 0);
	sqe->cmd_op = P2PDIRECT_URING_CMD_READ + 0x100;
	ASSERT_EQ(1, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, 1, &d));
	EXPECT_EQ(-ENOTTY, d.res);
	/* Each reserved byte on its own: first, either side of a word, last. */
	for (i = 0; i < ARRAY_SIZE(reserved); i++) {
		sqe = prep(&self->ring, self->dev, 0, self->ns1, 0, a, 4096, 0, 0, 0);
		cmd_area(sqe)[sizeof(struct p2pdirect_uring_io) + reserved[i]] = 0x80;
		ASSERT_EQ(1, io_uring_submit(&self->ring));
		ASSERT_EQ(0, reap(&self->ring, 1, &d));
		EXPECT_EQ(-EINVAL, d.res);
	}
	sqe = prep(&self->ring, self->dev, 0, self->ns1, 0, a, 4096, 0, 0, 0);
	sqe->uring_cmd_flags = IORING_URING_CMD_FIXED;
	ASSERT_EQ(1, io_uring_submit(&self->ring));
	ASSERT_EQ(0, reap(&self->ring, 1, &d));
	EXPECT_EQ(-EINVAL, d.res);
	/* The SQE fields the command does not use (since ABI 1.11), one by one. */
	for (i = 0; i < 5; i++) {
		sqe = prep(&self->ring, self->dev, 0, self->ns1, 0, a, 4096, 0, 0, 0);
		set_unused_sqe_field(sqe, i);
		ASSERT_EQ(1, io_uring_submit(&self->ring));
		ASSERT_EQ(0, reap(&self->ring, 1, &d));
		EXPECT_EQ(-EINVAL, d.res);
	}
	/* With them all 0 the command goes (the bytes the COMPAT READ above put there). */
	EXPECT_EQ(4096, one(&self->ring, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, a, 4096, 0,
			    0).res);
	EXPECT_EQ(0ull, fill_diff(g->map, 64 * KiB, 0, 4));

	/* A ring with 64-byte SQEs has no room for the argument. */
	EXPECT_EQ(-EINVAL, small_sqe_res(self->dev));

	/* /dev/p2pdirect opened read-only may not move data. */
	ro = open("/dev/p2pdirect", O_RDONLY);
	ASSERT_LE(0, ro);
	EXPECT_EQ(-EBADF, one(&self->ring, ro, 0, self->ns1, 0, a, 4096, 0, 0).res);
	close(ro);
	/* Nor opened with access mode 3 (ioctl only), since ABI 1.13. */
	ro = open("/dev/p2pdirect", O_ACCMODE);
	ASSERT_LE(0, ro);
	EXPECT_EQ(-EBADF, one(&self->ring, ro, 0, self->ns1, 0, a, 4096, 0, 0).res);
	close(ro);
	free(ram);
}

/* The ioctl READ or WRITE (@write) of the same request: bytes, or -errno. */
static int ioctl_res(int dev, int write, int fd, __u32 flags, __u64 addr, __u64 size,
		     __u64 foff, __u64 boff)
{
	struct p2pdirect_io r = {
		.fd = fd, .flags = flags, .addr = addr, .size = size,
		.file_offset = foff, .buf_offset = boff,
	};

	if (ioctl(dev, write ? P2PDIRECT_IOC_WRITE : P2PDIRECT_IOC_READ, &r))
		return -errno;
	return (int)r.bytes;
}

/* @exp from the ioctl and in the CQE of the same request through io_uring. */
#define BOTH(exp, write, fd, flags, addr, size, foff, boff)				\
	do {										\
		EXPECT_EQ(exp, ioctl_res(self->dev, write, fd, flags, addr, size, foff,	\
					 boff));					\
		EXPECT_EQ(exp, one(&self->ring, self->dev, write, fd, flags, addr, size,	\
				   foff, boff).res);					\
	} while (0)

/*
 * The rows of the README's READ/WRITE error table that errors_in_cqes does
 * not take through io_uring: the CQE carries the ioctl's errno for each.
 */
TEST_F(ur, errors_match_the_ioctls)
{
	struct gpu *g = &self->gpu[0];
	__u64 a = (uintptr_t)g->map, end = 256 * MiB;	/* NSID 1's size */
	struct p2pdirect_register reg = { .addr = a, .size = MiB };
	struct p2pdirect_reg_id id = { 0 };
	char ns[64];
	int pipefd[2], dir, null, buffered, tmp, ro;

	ASSERT_EQ(0, pipe(pipefd));
	dir = open("/mnt/ext4", O_RDONLY | O_DIRECTORY);
	ASSERT_LE(0, dir);
	null = open("/dev/null", O_RDWR);
	ASSERT_LE(0, null);
	buffered = open("/mnt/ext4/data.bin", O_RDWR);
	ASSERT_LE(0, buffered);
	tmp = open("/tmp/uring-errors", O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
	ASSERT_LE(0, tmp) TH_LOG("tmpfs O_DIRECT: %s", strerror(errno));
	ASSERT_TRUE(find_nvme_nsid(1, ns, sizeof(ns), NULL));
	ro = open(ns, O_RDONLY | O_DIRECT);
	ASSERT_LE(0, ro);
	ASSERT_EQ(0, ftruncate(tmp, MiB));

	BOTH(-ESPIPE, 0, pipefd[0], 0, a, 4096, 0, 0);
	BOTH(-EISDIR, 0, dir, 0, a, 4096, 0, 0);
	BOTH(-EINVAL, 0, null, 0, a, 4096, 0, 0);
	BOTH(-EINVAL, 0, buffered, 0, a, 4096, 0, 0);
	BOTH(-EOPNOTSUPP, 0, tmp, 0, a, 4096, 0, 0);
	BOTH(-EBADF, 1, ro, 0, a, 4096, OWN, 0);
	BOTH(-EINVAL, 0, self->ns1, 0, a, 4096, 1ull << 63, 0);
	BOTH(-EINVAL, 0, self->ns1, 0, a, 4096, OWN, ~0ull - a + 1);
	BOTH(-EFAULT, 0, self->ns1, 0, a + BUF - 4096, 8192, OWN, 0);
	BOTH(-ENOSPC, 1, self->ns1, 0, a, 4096, end, 0);
	BOTH(0, 0, self->ns1, 0, a, 4096, end, 0);
	/* At the end the memory is still checked (since 1.11). */
	BOTH(-ENOENT, 0, self->ns1, P2PDIRECT_IO_REGISTERED, 12345, 4096, end, 0);
	BOTH(-ENOENT, 1, self->ns1, P2PDIRECT_IO_REGISTERED, 12345, 4096, end + MiB, 0);
	BOTH(-EFAULT, 1, self->ns1, 0, a + BUF - 4096, 8192, end, 0);
	/*
	 * Past the end, a range whose end overflows loff_t: rw_verify_area()'s
	 * EINVAL, as pread/pwrite (since 1.16; before, 0 bytes and ENOSPC).
	 */
	BOTH(-EINVAL, 0, self->ns1, 0, a, 8192, (1ull << 63) - 8192, 0);
	BOTH(-EINVAL, 1, self->ns1, 0, a, 8192, (1ull << 63) - 8192, 0);
	BOTH(0, 0, self->ns1, 0, a, 4096, (1ull << 63) - 8192, 0);
	BOTH(-ENOSPC, 1, self->ns1, 0, a, 4096, (1ull << 63) - 8192, 0);

	/* A registration without REG_WRITE, and a range past its end. */
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &reg));
	BOTH(-EPERM, 0, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, 4096, OWN, 0);
	BOTH(-ERANGE, 1, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, 8192, OWN, MiB - 4096);
	id.id = reg.id;
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER, &id));
	BOTH(-ENOENT, 1, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, 4096, OWN, 0);

	close(ro);
	close(tmp);
	unlink("/tmp/uring-errors");
	close(buffered);
	close(null);
	close(dir);
	close(pipefd[0]);
	close(pipefd[1]);
}

/*
 * Mixed rings (kernel 6.18 and later; liburing 2.3's header predates them,
 * so the ABI's values are spelled out): on an IORING_SETUP_SQE_MIXED ring,
 * IORING_OP_URING_CMD128 takes two 64-byte entries and carries the argument
 * as a 128-byte SQE does; on an IORING_SETUP_CQE_MIXED ring a command's
 * CQE is a 32-byte one (IORING_CQE_F_32) with the counts in big_cqe[0].
 */
#define SETUP_CQE_MIXED (1U << 18)
#define SETUP_SQE_MIXED (1U << 19)
#define OP_URING_CMD128 64
#define CQE_F_SKIP (1U << 5)
#define CQE_F_32 (1U << 15)

/*
 * One command of @opcode on the mixed ring @ring; its CQE into @d. prep()
 * fills 128 bytes: the two entries of an IORING_OP_URING_CMD128, or for a
 * 64-byte command the next entry too, which is not submitted.
 */
static int mixed_one(struct io_uring *ring, __u8 opcode, int dev, int write, int fd,
		     __u64 addr, __u64 size, __u64 foff, __u64 boff, struct done *d,
		     int *big)
{
	struct io_uring_sqe *sqe = prep(ring, dev, write, fd, 0, addr, size, foff, boff, 7);
	struct io_uring_cqe *cqe;
	int n = 1, ret;

	sqe->opcode = opcode;
	/* Both halves of a 128-byte command: two entries in a row. */
	if (opcode == OP_URING_CMD128) {
		if (io_uring_get_sqe(ring) != sqe + 1)
			return -EPROTO;
		n = 2;
	}
	ret = io_uring_submit(ring);
	if (ret != n)
		return ret < 0 ? ret : -EPROTO;
	for (;;) {
		ret = io_uring_wait_cqe(ring, &cqe);
		if (ret)
			return ret;
		if (!(cqe->flags & CQE_F_SKIP))
			break;
		io_uring_cq_advance(ring, 1);
	}
	*big = !!(cqe->flags & CQE_F_32);
	d->res = cqe->res;
	d->p2p = *big ? cqe->big_cqe[0] & 0xffffffff : 0;
	d->bounce = *big ? cqe->big_cqe[0] >> 32 : 0;
	ret = cqe->user_data == 7 ? 0 : -EPROTO;
	io_uring_cq_advance(ring, *big ? 2 : 1);
	return ret;
}

/*
 * NSID 1 [OWN + 10 MiB, + 256 KiB) (free_races_commands_in_flight uses the
 * first 2 MiB of its 4): a WRITE from GPU 0 and a READ into GPU 1, each an
 * IORING_OP_URING_CMD128 on a ring with mixed SQEs and CQEs; a plain
 * IORING_OP_URING_CMD there has no room for the argument (-EINVAL, in a
 * 16-byte CQE: refused before the module took the command on).
 */
TEST_F(ur, mixed_sqe_and_cqe_rings)
{
	struct gpu *g0 = &self->gpu[0], *g1 = &self->gpu[1];
	__u64 pos = OWN + 10 * MiB, len = 256 * KiB, seed = 0x7a01;
	struct io_uring mixed;
	struct done d;
	int big = -1;

	ASSERT_EQ(0, io_uring_queue_init(8, &mixed, SETUP_SQE_MIXED | SETUP_CQE_MIXED));
	fill_buf(g0->map, len, pos, seed);
	rec_gpu(g0, 0, len, seed, pos);
	ASSERT_EQ(0, mixed_one(&mixed, OP_URING_CMD128, self->dev, 1, self->ns1,
			       (uintptr_t)g0->map, len, pos, 0, &d, &big));
	EXPECT_EQ((int)len, d.res) TH_LOG("WRITE: %s", strerror(-d.res));
	EXPECT_EQ(1, big);
	EXPECT_EQ(len, d.p2p);
	EXPECT_EQ(0ull, d.bounce);
	rec_nvme(pos, len, seed);
	rec_dma(g0, pos, len, "write");

	memset(g1->map, 0, len);
	ASSERT_EQ(0, mixed_one(&mixed, OP_URING_CMD128, self->dev, 0, self->ns1,
			       (uintptr_t)g1->map, len, pos, 0, &d, &big));
	EXPECT_EQ((int)len, d.res) TH_LOG("READ: %s", strerror(-d.res));
	EXPECT_EQ(1, big);
	EXPECT_EQ(len, d.p2p);
	rec_gpu(g1, 0, len, seed, pos);
	EXPECT_EQ(0ull, fill_diff(g1->map, len, pos, seed));
	rec_dma(g1, pos, len, "read");

	/* A 64-byte command on the same ring: refused at its issue. */
	ASSERT_EQ(0, mixed_one(&mixed, IORING_OP_URING_CMD, self->dev, 0, self->ns1,
			       (uintptr_t)g1->map, 4096, pos, 0, &d, &big));
	EXPECT_EQ(-EINVAL, d.res);
	EXPECT_EQ(0, big);
	io_uring_queue_exit(&mixed);
}

/*
 * On a SINGLE_ISSUER | DEFER_TASKRUN ring, the task work that posts a READ's
 * CQE and counts it in STATS waits for io_uring_enter() with GETEVENTS: 200 ms
 * after the submission (the bios long done) the CQ ring is still empty and
 * GPU 1's reads count unchanged; the wait posts and counts it. NSID 1 [@pos,
 * + @len) holds fill @seed.
 */
static void deferred_completion(struct __test_metadata *_metadata, struct _test_data_ur *self,
				__u64 pos, __u64 len, __u64 seed)
{
	struct gpu *g1 = &self->gpu[1];
	struct p2pdirect_stat before, after;
	struct io_uring_cqe *cqe;
	struct io_uring r;

	ASSERT_EQ(0, io_uring_queue_init(8, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32 |
					 IORING_SETUP_SINGLE_ISSUER |
					 IORING_SETUP_DEFER_TASKRUN));
	memset(g1->map, 0, len);
	ASSERT_EQ(0, stat_of(self->dev, g1->pci, &before));
	prep(&r, self->dev, 0, self->ns1, 0, (uintptr_t)g1->map, len, pos, 0, 0);
	ASSERT_EQ(1, io_uring_submit(&r));
	usleep(200 * 1000);
	EXPECT_EQ(-EAGAIN, io_uring_peek_cqe(&r, &cqe));
	ASSERT_EQ(0, stat_of(self->dev, g1->pci, &after));
	EXPECT_EQ(before.reads, after.reads);
	ASSERT_EQ(0, io_uring_wait_cqe(&r, &cqe));
	EXPECT_EQ((int)len, cqe->res);
	io_uring_cqe_seen(&r, cqe);
	ASSERT_EQ(0, stat_of(self->dev, g1->pci, &after));
	EXPECT_EQ(before.reads + 1, after.reads);
	rec_gpu(g1, 0, len, seed, pos);
	EXPECT_EQ(0ull, fill_diff(g1->map, len, pos, seed));
	io_uring_queue_exit(&r);
}

/*
 * Rings set up the other ways applications use: an SQ polling thread that
 * issues the commands (IORING_SETUP_SQPOLL: the fd is looked up and the
 * memory pinned by that thread, which shares the process's files and
 * memory), a polled ring (IORING_SETUP_IOPOLL: the commands are not polled,
 * they complete by interrupt and the waiter spins until then) and task work
 * run only when the submitter waits (SINGLE_ISSUER | DEFER_TASKRUN), and
 * /dev/p2pdirect as the ring's registered file (IOSQE_FIXED_FILE). On each,
 * a WRITE from GPU 0 and a READ into GPU 1 of 256 KiB at NSID 1
 * [OWN + 10.25 MiB, + 1 MiB), a slice per ring, and a COMPAT READ of
 * NSID 4's first 64 KiB into GPU 1 (io_uring's worker path); then the last
 * slice read once more on a DEFER_TASKRUN ring, to see when it completes.
 */
TEST_F(ur, sqpoll_iopoll_and_defer_taskrun_rings)
{
	static const struct {
		const char *name;
		unsigned int flags;
	} setup[] = {
		{ "SQPOLL", IORING_SETUP_SQPOLL },
		{ "IOPOLL", IORING_SETUP_IOPOLL },
		{ "DEFER_TASKRUN", IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN },
		{ "FIXED_FILE", 0 },
	};
	struct gpu *g0 = &self->gpu[0], *g1 = &self->gpu[1];
	__u64 len = 256 * KiB;

	for (int k = 0; k < 4; k++) {
		__u64 pos = OWN + 10 * MiB + (k + 1) * len, seed = 0x7b01 + k;
		int dev = self->dev;
		struct io_uring r;
		struct done d;

		ASSERT_EQ(0, io_uring_queue_init(8, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32 |
						 setup[k].flags)) TH_LOG("%s", setup[k].name);
		if (k == 3) {
			ASSERT_EQ(0, io_uring_register_files(&r, &self->dev, 1));
			dev = -1;	/* registered file 0 */
		}
		fill_buf(g0->map, len, pos, seed);
		rec_gpu(g0, 0, len, seed, pos);
		d = one(&r, dev, 1, self->ns1, 0, (uintptr_t)g0->map, len, pos, 0);
		EXPECT_EQ((int)len, d.res) TH_LOG("%s WRITE: %s", setup[k].name,
						  strerror(-d.res));
		EXPECT_EQ(len, d.p2p);
		rec_nvme(pos, len, seed);
		rec_dma(g0, pos, len, "write");

		memset(g1->map, 0, len);
		d = one(&r, dev, 0, self->ns1, 0, (uintptr_t)g1->map, len, pos, 0);
		EXPECT_EQ((int)len, d.res) TH_LOG("%s READ: %s", setup[k].name, strerror(-d.res));
		EXPECT_EQ(len, d.p2p);
		rec_gpu(g1, 0, len, seed, pos);
		EXPECT_EQ(0ull, fill_diff(g1->map, len, pos, seed)) TH_LOG("%s", setup[k].name);
		rec_dma(g1, pos, len, "read");

		memset(g1->map, 0, 64 * KiB);
		d = one(&r, dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)g1->map,
			64 * KiB, 0, 0);
		EXPECT_EQ((int)(64 * KiB), d.res) TH_LOG("%s COMPAT: %s", setup[k].name,
							 strerror(-d.res));
		EXPECT_EQ(64 * KiB, d.bounce);
		rec_gpu(g1, 0, 64 * KiB, 4, 0);
		EXPECT_EQ(0ull, fill_diff(g1->map, 64 * KiB, 0, 4)) TH_LOG("%s", setup[k].name);
		io_uring_queue_exit(&r);
	}
	deferred_completion(_metadata, self, OWN + 10 * MiB + 4 * len, len, 0x7b04);
}

/* The calling thread's voluntary context switches so far, or -1. */
static long voluntary_switches(void)
{
	return file_number("/proc/thread-self/status", "voluntary_ctxt_switches: %ld");
}

/*
 * A SINGLE_ISSUER | DEFER_TASKRUN ring whose submitter waits for all of 128
 * commands at once (io_uring_submit_and_wait) sleeps until they are done:
 * each completion wakes it lazily (IOU_F_TWQ_LAZY_WAKE, as io_uring's own
 * reads and NVMe passthrough do), so it is woken about once, not once per
 * completion. The commands are COMPAT READs of NSID 4's first 64 KiB into
 * GPU 1 [0, 8 MiB): io_uring's workers (a few at a time) run them after the
 * submission returned, so their completions come while the submitter
 * sleeps (raw transfers here complete during the submission itself). The
 * thread's voluntary context switches over the call count its sleeps (and
 * the task work that starts workers): at most one per 8 completions. With
 * the lazy wake they were 4, with a wake per completion 118. The bytes are
 * checked here (sqpoll_iopoll_and_defer_taskrun_rings has the host check the
 * same COMPAT READ), then the memory is zeroed again, for the host's replay.
 */
TEST_F(ur, defer_taskrun_waiter_woken_lazily)
{
	struct gpu *g = &self->gpu[1];
	__u64 chunk = 64 * KiB;
	unsigned int n = 128, ok = 0, bad = 0;
	struct io_uring_cqe *cqe;
	struct io_uring r;
	long before, after;

	memset(g->map, 0, n * chunk);
	ASSERT_EQ(0, io_uring_queue_init(n, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32 |
					 IORING_SETUP_SINGLE_ISSUER |
					 IORING_SETUP_DEFER_TASKRUN));
	for (unsigned int i = 0; i < n; i++)
		prep(&r, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)g->map, chunk, 0,
		     i * chunk, i);
	before = voluntary_switches();
	ASSERT_EQ((int)n, io_uring_submit_and_wait(&r, n));
	after = voluntary_switches();
	ASSERT_LE(0, before);
	ASSERT_LE(0, after);
	for (unsigned int i = 0; i < n; i++) {
		ASSERT_EQ(0, io_uring_peek_cqe(&r, &cqe)) TH_LOG("CQE %u of %u missing", i, n);
		EXPECT_EQ((int)chunk, cqe->res) TH_LOG("READ %llu: %s",
						      (unsigned long long)cqe->user_data,
						      strerror(-cqe->res));
		ok += cqe->res == (int)chunk && cqe->big_cqe[0] >> 32 == chunk;
		io_uring_cqe_seen(&r, cqe);
	}
	EXPECT_EQ(n, ok);
	printf("# the waiter slept %ld times for %u completions\n", after - before, n);
	EXPECT_GE((long)n / 8, after - before);
	for (unsigned int i = 0; i < n; i++)
		bad += fill_diff(g->map + i * chunk, chunk, 0, 4) != 0;
	EXPECT_EQ(0u, bad) TH_LOG("%u READs left other bytes", bad);
	memset(g->map, 0, n * chunk);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)(n * chunk));
	io_uring_queue_exit(&r);
}

/*
 * A command issued inline cannot be cancelled: IORING_OP_ASYNC_CANCEL,
 * submitted after 16 READs of NSID 1 [OWN + 11.25 MiB, + 256 KiB) into GPU 1 in
 * the same call (none waits in io_uring's worker: nothing of that range is
 * cached), finds none of them: the READ of its user_data is not found
 * (-ENOENT) and IORING_ASYNC_CANCEL_ANY cancels 0; every READ moves its
 * bytes.
 */
TEST_F(ur, async_cancel_leaves_started_commands)
{
	struct gpu *g0 = &self->gpu[0], *g1 = &self->gpu[1];
	__u64 pos = OWN + 11 * MiB + 256 * KiB, chunk = 16 * KiB, len = 16 * chunk, seed = 0x7c01;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	int reads = 0, one_res = 1, any_res = 1;

	ASSERT_EQ(0, seed_ns(self, g0, 0, len, pos, seed));
	rec_dma(g0, pos, len, "write");
	memset(g1->map, 0, len);
	for (int i = 0; i < 16; i++)
		prep(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)g1->map, chunk,
		     pos + i * chunk, i * chunk, i);
	for (int c = 0; c < 2; c++) {
		sqe = io_uring_get_sqe(&self->ring);
		ASSERT_NE(NULL, sqe);
		memset(sqe, 0, 2 * sizeof(*sqe));
		io_uring_prep_cancel64(sqe, c ? 0 : 5, c ? IORING_ASYNC_CANCEL_ANY : 0);
		sqe->user_data = 100 + c;
	}
	ASSERT_EQ(18, io_uring_submit(&self->ring));
	for (int i = 0; i < 18; i++) {
		ASSERT_EQ(0, io_uring_wait_cqe(&self->ring, &cqe));
		if (cqe->user_data == 100) {
			one_res = cqe->res;
		} else if (cqe->user_data == 101) {
			any_res = cqe->res;
		} else {
			EXPECT_EQ((int)chunk, cqe->res) TH_LOG("READ %llu: %s",
							       (unsigned long long)cqe->user_data,
							       strerror(-cqe->res));
			reads++;
		}
		io_uring_cqe_seen(&self->ring, cqe);
	}
	EXPECT_EQ(16, reads);
	EXPECT_EQ(-ENOENT, one_res);
	EXPECT_EQ(0, any_res);
	rec_gpu(g1, 0, len, seed, pos);
	EXPECT_EQ(0ull, fill_diff(g1->map, len, pos, seed));
	rec_dma(g1, pos, len, "read");
}

/*
 * Submits an IORING_OP_ASYNC_CANCEL of the command @target, posted as
 * @user_data: io_uring_submit()'s result, -ENOSPC with no SQE free.
 */
static int submit_cancel(struct io_uring *r, __u64 target, __u64 user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(r);

	if (!sqe)
		return -ENOSPC;
	memset(sqe, 0, 2 * sizeof(*sqe));
	io_uring_prep_cancel64(sqe, target, 0);
	sqe->user_data = user_data;
	return io_uring_submit(r);
}

/*
 * A command waiting for io_uring's worker is cancelled before it starts. With
 * one worker (IORING_REGISTER_IOWQ_MAX_WORKERS), a COMPAT READ of NSID 4
 * [0, 8 MiB) into GPU 1 [0, 8 MiB) keeps it busy (a bounce of 8 MiB) while a
 * second, of NSID 4's first 64 KiB into GPU 1 [8 MiB, + 64 KiB), waits for
 * it; an IORING_OP_ASYNC_CANCEL of the second, submitted right after, finds
 * it waiting: the cancel gets 0, the command -ECANCELED and its memory stays
 * zero, and the first moves its bytes. The memory is then zeroed again, for
 * the host's replay.
 */
TEST_F(ur, async_cancel_of_a_command_waiting_for_a_worker)
{
	struct gpu *g = &self->gpu[1];
	__u64 big = 8 * MiB, small = 64 * KiB, zeros = 0;
	unsigned int workers[2] = { 1, 1 };
	int first = 1, second = 1, cancel = 1;
	struct io_uring_cqe *cqe;
	struct io_uring r;

	memset(g->map, 0, big + small);
	ASSERT_EQ(0, io_uring_queue_init(8, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32));
	ASSERT_EQ(0, io_uring_register_iowq_max_workers(&r, workers));
	prep(&r, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)g->map, big, 0, 0, 1);
	prep(&r, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)g->map, small, 0, big,
	     2);
	ASSERT_EQ(2, io_uring_submit(&r));
	ASSERT_EQ(1, submit_cancel(&r, 2, 3));
	for (int i = 0; i < 3; i++) {
		ASSERT_EQ(0, io_uring_wait_cqe(&r, &cqe));
		if (cqe->user_data == 1)
			first = cqe->res;
		else if (cqe->user_data == 2)
			second = cqe->res;
		else
			cancel = cqe->res;
		io_uring_cqe_seen(&r, cqe);
	}
	io_uring_queue_exit(&r);
	EXPECT_EQ(0, cancel) TH_LOG("cancel: %s", strerror(-cancel));
	EXPECT_EQ(-ECANCELED, second) TH_LOG("the waiting READ: %d", second);
	EXPECT_EQ((int)big, first) TH_LOG("the running READ: %d", first);
	EXPECT_EQ(0ull, fill_diff(g->map, big, 0, 4));
	for (__u64 i = 0; i < small; i++)
		zeros += g->map[big + i] == 0;
	EXPECT_EQ(small, zeros);
	memset(g->map, 0, big + small);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)(big + small));
}

/*
 * The cancel of a command io_uring's worker is running returns -EALREADY,
 * and the command ends as it would have. With one worker, a COMPAT READ of
 * NSID 4 [0, 16 MiB) into GPU 1 goes to it; once STATS shows its memory
 * pinned (the worker has started it: a command pins its memory when it
 * runs) and its CQE is not there, an IORING_OP_ASYNC_CANCEL of it gets
 * -EALREADY and the READ moves all of its bytes. (Were the bounce to end in
 * the microseconds between the peek and the cancel's look into the worker,
 * the cancel would find nothing: -ENOENT. The bounce of 16 MiB takes
 * milliseconds.)
 */
TEST_F(ur, async_cancel_of_a_command_a_worker_runs)
{
	struct gpu *g = &self->gpu[1];
	unsigned int workers[2] = { 1, 1 };
	int read_res = 1, cancel = 1, started = 0;
	struct p2pdirect_stat before, now;
	struct io_uring_cqe *cqe;
	struct io_uring r;

	memset(g->map, 0, BUF);
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &before));
	ASSERT_EQ(0, io_uring_queue_init(8, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32));
	ASSERT_EQ(0, io_uring_register_iowq_max_workers(&r, workers));
	prep(&r, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)g->map, BUF, 0, 0, 1);
	ASSERT_EQ(1, io_uring_submit(&r));
	/* Up to 10 s for the worker to start it. */
	started = pinned_above(self->dev, g->pci, before.pinned_bytes);
	ASSERT_TRUE(started) TH_LOG("the READ never pinned its memory");
	ASSERT_EQ(-EAGAIN, io_uring_peek_cqe(&r, &cqe)) TH_LOG("the READ ended before the cancel");
	ASSERT_EQ(1, submit_cancel(&r, 1, 2));
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(0, io_uring_wait_cqe(&r, &cqe));
		if (cqe->user_data == 1)
			read_res = cqe->res;
		else
			cancel = cqe->res;
		io_uring_cqe_seen(&r, cqe);
	}
	io_uring_queue_exit(&r);
	EXPECT_EQ(-EALREADY, cancel) TH_LOG("cancel: %s", strerror(-cancel));
	EXPECT_EQ((int)BUF, read_res) TH_LOG("the running READ: %d", read_res);
	EXPECT_EQ(0ull, fill_diff(g->map, BUF, 0, 4));
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &now));
	EXPECT_EQ(before.pinned_bytes, now.pinned_bytes);
	memset(g->map, 0, BUF);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)BUF);
}

/*
 * A process killed with commands waiting for io_uring's worker, on a ring
 * another process keeps open: none of them runs. Exit cancels only tracked
 * and unbound io-wq work, and the ring lives on, so the worker goes on
 * through its queue after the kill; the module refuses a worker issue of a
 * task being killed with -ECANCELED (since ABI 1.20), and the command the
 * worker runs stops at its next 1 MiB chunk, as a killed COMPAT ioctl does.
 * The ring is the parent's, shared over fork(); the child, with one worker,
 * maps GPU 1's buffer through the fixture's file and submits a COMPAT READ
 * of NSID 4 [0, 8 MiB) and then three device-to-device READs of 64 KiB of
 * NSID 1 [OWN + 11.5 MiB, + 192 KiB), written before, into a registration
 * the parent made, with IOSQE_ASYNC (so the worker issues them), and is
 * killed once the first has pinned its memory.
 * The three ranges stay zero and their CQEs carry no bytes (before, the
 * worker read all three into the GPU after the kill; COMPAT ones, and ones
 * whose pointer memory a killed task pins, ended with -EINTR already).
 */
TEST_F(ur, killed_process_runs_none_of_its_waiting_worker_commands)
{
	struct gpu *g = &self->gpu[1];
	__u64 big = 8 * MiB, small = 64 * KiB, zeros = 0, first = 0;
	__u64 pos = OWN + 11 * MiB + 512 * KiB;
	int started = 0, idle = 0, status, sync[2], res[4] = { 0 };
	struct p2pdirect_stat before, now;
	struct __kernel_timespec ts = { .tv_sec = 2 };
	struct p2pdirect_register reg = {
		.addr = (uintptr_t)g->map + big, .size = 3 * small, .flags = P2PDIRECT_REG_WRITE,
	};
	struct io_uring_cqe *cqe;
	struct io_uring r;
	char c;
	pid_t pid;

	ASSERT_EQ(0, seed_ns(self, g, big, 3 * small, pos, 0x7d01));
	memset(g->map, 0, big + 3 * small);
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_REGISTER, &reg));
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &before));
	ASSERT_EQ(0, io_uring_queue_init(8, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32));
	ASSERT_EQ(0, pipe(sync));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		unsigned int workers[2] = { 1, 1 };
		__u8 *m = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_SHARED, self->dev,
			       g->a.mmap_offset);

		/* Gone with the test, whatever stops it. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || m == MAP_FAILED ||
		    io_uring_register_iowq_max_workers(&r, workers))
			_exit(1);
		prep(&r, self->dev, 0, self->ns4, P2PDIRECT_IO_COMPAT, (uintptr_t)m, big, 0, 0, 0);
		for (int i = 0; i < 3; i++)
			prep(&r, self->dev, 0, self->ns1, P2PDIRECT_IO_REGISTERED, reg.id, small,
			     pos + i * small, i * small, i + 1)->flags |= IOSQE_ASYNC;
		if (io_uring_submit(&r) != 4 || write(sync[1], "s", 1) != 1)
			_exit(2);
		for (;;)
			pause();
	}
	close(sync[1]);
	ASSERT_EQ(1, read(sync[0], &c, 1)) TH_LOG("the child did not submit");
	close(sync[0]);
	/* Up to 10 s for the worker to start the first. */
	started = pinned_above(self->dev, g->pci, before.pinned_bytes);
	EXPECT_TRUE(started) TH_LOG("the first READ never pinned its memory");
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	/* Whatever still runs lets its pins go; up to 10 s. */
	for (int i = 0; i < 200 && !idle; i++) {
		ASSERT_EQ(0, stat_of(self->dev, g->pci, &now));
		idle = now.pinned_bytes == before.pinned_bytes;
		if (!idle)
			usleep(50 * 1000);
	}
	EXPECT_TRUE(idle) TH_LOG("pinned bytes: %llu, before %llu",
				 (unsigned long long)now.pinned_bytes,
				 (unsigned long long)before.pinned_bytes);
	for (__u64 i = 0; i < big; i++)
		first += g->map[i] != 0;
	for (__u64 i = 0; i < 3 * small; i++)
		zeros += g->map[big + i] == 0;
	/* The CQEs the child's task work posted (through io_uring's fallback). */
	while (!io_uring_wait_cqe_timeout(&r, &cqe, &ts)) {
		if (cqe->user_data < 4)
			res[cqe->user_data] = cqe->res;
		io_uring_cqe_seen(&r, cqe);
	}
	io_uring_queue_exit(&r);
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_DEREGISTER,
			   &(struct p2pdirect_reg_id){ .id = reg.id }));
	printf("# the running READ moved %llu of %llu bytes before it stopped; CQEs %d %d %d %d\n",
	       (unsigned long long)first, (unsigned long long)big, res[0], res[1], res[2], res[3]);
	EXPECT_EQ(3 * small, zeros) TH_LOG("the waiting READs wrote %llu bytes after the kill",
					   (unsigned long long)(3 * small - zeros));
	EXPECT_TRUE(res[1] == -ECANCELED && res[2] == -ECANCELED && res[3] == -ECANCELED)
		TH_LOG("the waiting READs' CQEs: %d %d %d", res[1], res[2], res[3]);
	/* The running one stopped at a chunk's end (or before its first: EINTR). */
	EXPECT_TRUE(res[0] == -EINTR || (res[0] > 0 && res[0] % MiB == 0 && (__u64)res[0] < big))
		TH_LOG("the running READ's CQE: %d", res[0]);
	memset(g->map, 0, big + 3 * small);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)(big + 3 * small));
}

/*
 * P2PDIRECT_URING_MAX_INFLIGHT: a command's place among the file's commands
 * in flight is given back by the task work that posts its CQE, which runs
 * only after the io_uring_enter that submitted it returns. So of MAX + 1
 * good READs submitted in one call, the last finds every place taken and gets
 * -EBUSY in its CQE; the others move their data device to device. Once the
 * CQEs are reaped the places are free again. The READs are of NSID 1
 * [OWN, + 256 KiB) into GPU 1, as qd128_write_then_read_both_gpus reads it.
 * At the limit a READ with unknown flags or size 0 still gets -EINVAL: the
 * argument's flags come before the command's checks (since ABI 1.16).
 */
TEST_F(ur, inflight_limit_ebusy)
{
	struct gpu *g = &self->gpu[1];
	unsigned int max = P2PDIRECT_URING_MAX_INFLIGHT, n = max + 3, ok = 0, busy = 0;
	__u64 span = 64 * 4 * KiB;
	struct io_uring big;
	struct done *d = calloc(n, sizeof(*d));

	ASSERT_NE(NULL, d);
	ASSERT_EQ(0, io_uring_queue_init(2 * n, &big, IORING_SETUP_SQE128 | IORING_SETUP_CQE32));
	for (unsigned int i = 0; i < n; i++)
		prep(&big, self->dev, 0, self->ns1, i == max ? 0x80 : 0, (uintptr_t)g->map,
		     i == max + 1 ? 0 : 4 * KiB, OWN + (i % 64) * 4 * KiB, (i % 64) * 4 * KiB, i);
	ASSERT_EQ((int)n, io_uring_submit(&big));
	ASSERT_EQ(0, reap(&big, n, d));
	for (unsigned int i = 0; i < n; i++) {
		if (i == max || i == max + 1) {
			EXPECT_EQ(-EINVAL, d[i].res) TH_LOG("bad READ %u: %s", i, strerror(-d[i].res));
			continue;
		}
		if (d[i].res == -EBUSY) {
			busy++;
			continue;
		}
		EXPECT_EQ((int)(4 * KiB), d[i].res) TH_LOG("read %u: %s", i, strerror(-d[i].res));
		EXPECT_EQ(4 * KiB, d[i].p2p);
		ok += d[i].res == (int)(4 * KiB);
	}
	EXPECT_EQ(1u, busy);
	EXPECT_EQ(max, ok);
	/* The places came back with the CQEs. */
	EXPECT_EQ((int)(4 * KiB), one(&big, self->dev, 0, self->ns1, 0, (uintptr_t)g->map,
				      4 * KiB, OWN, 0).res);
	/* GPU 1 reads [OWN, + 4 MiB) in qd128_write_then_read_both_gpus too. */
	rec_dma(g, OWN, span, "read");
	memset(g->map, 0, span);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)span);
	io_uring_queue_exit(&big);
	free(d);
}

/*
 * FREE while 64 READs of NSID 1 [OWN + 8, + 2) MiB into the allocation are
 * in flight: FREE does not wait, every command completes (the pages were
 * pinned at submission), and the memory handed out afterwards is zeroed
 * (the host replays the records: no late DMA landed in it).
 */
TEST_F(ur, free_races_commands_in_flight)
{
	struct gpu *g = &self->gpu[0];
	struct p2pdirect_free f = { .handle = g->a.handle };
	__u64 pos = OWN + 8 * MiB, len = 64 * CHUNK, old_off = g->a.provider_offset;
	struct done d[64];
	__u8 *old = g->map;
	int bad = 0;

	struct p2pdirect_stat before, after;

	ASSERT_EQ(0, seed_ns(self, g, 0, len, pos, 0x7305));
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &before));
	for (int i = 0; i < 64; i++)
		prep(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)old, CHUNK,
		     pos + i * CHUNK, len + i * CHUNK, i);
	ASSERT_EQ(64, io_uring_submit(&self->ring));
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_FREE, &f));
	rec_gpu(g, len, len, 0x7305, pos);
	munmap(old, BUF);
	g->map = NULL;
	ASSERT_EQ(0, reap(&self->ring, 64, d));
	for (int i = 0; i < 64; i++)
		bad += d[i].res != (int)CHUNK;
	EXPECT_EQ(0, bad) TH_LOG("first result %d", d[0].res);
	rec_dma(g, pos, len, "read");
	/* Every command was counted, and gave its pinned bytes back. */
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &after));
	EXPECT_EQ(before.reads + 64, after.reads);
	EXPECT_EQ(before.bytes_read + len, after.bytes_read);
	EXPECT_EQ(0ull, after.pinned_bytes);
	/* The same device memory, handed out again: zeroed. */
	ASSERT_EQ(0, gpu_alloc(self->dev, g));
	EXPECT_EQ(old_off, g->a.provider_offset);
	for (__u64 i = 0; i < BUF; i++)
		if (g->map[i]) {
			EXPECT_EQ(0, g->map[i]) TH_LOG("byte %llu of the new allocation",
						       (unsigned long long)i);
			break;
		}
}

/*
 * Teardown with commands in flight, NSID 1 [OWN + 12, + 4) MiB: the ring
 * closed under 64 READs, then a child process exiting with 128 READs in
 * flight on its own file and ring; all complete (STATS counts them, with no
 * error) and the device stays usable.
 */
TEST_F(ur, teardown_with_commands_in_flight)
{
	struct gpu *g = &self->gpu[1];
	__u64 pos = OWN + 12 * MiB, len = 4 * MiB;
	struct p2pdirect_stat before, after;
	int status;
	pid_t pid;

	ASSERT_EQ(0, seed_ns(self, g, 0, len, pos, 0x7406));
	ASSERT_EQ(0, stat_of(self->dev, g->pci, &before));
	for (int i = 0; i < 64; i++)
		prep(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)g->map, len / 64,
		     pos + i * (len / 64), len + i * (len / 64), i);
	ASSERT_EQ(64, io_uring_submit(&self->ring));
	rec_gpu(g, len, len, 0x7406, pos);
	io_uring_queue_exit(&self->ring);
	ASSERT_EQ(0, io_uring_queue_init(2 * QD, &self->ring,
					 IORING_SETUP_SQE128 | IORING_SETUP_CQE32));

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct io_uring r;
		struct gpu c = { .index = g->index };
		int dev = open("/dev/p2pdirect", O_RDWR);

		memcpy(c.bdf, g->bdf, sizeof(c.bdf));

		if (dev < 0 || gpu_alloc(dev, &c) ||
		    io_uring_queue_init(QD, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32))
			_exit(1);
		rec_gpu(&c, 0, len, 0x7406, pos);
		for (int i = 0; i < QD; i++)
			prep(&r, dev, 0, self->ns1, 0, (uintptr_t)c.map, len / QD,
			     pos + i * (len / QD), i * (len / QD), i);
		_exit(io_uring_submit(&r) == QD ? 0 : 2);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* All 192 READs end, none in error (they may end after their ring). */
	for (int t = 0; t < 200; t++) {
		ASSERT_EQ(0, stat_of(self->dev, g->pci, &after));
		if (after.reads >= before.reads + 64 + QD)
			break;
		usleep(50 * 1000);
	}
	EXPECT_EQ(before.reads + 64 + QD, after.reads);
	EXPECT_EQ(before.errors, after.errors);
	EXPECT_EQ(before.bytes_read + 2 * len, after.bytes_read);
	memset(g->map, 0, CHUNK);
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", g->bdf,
	       (unsigned long long)g->a.provider_offset, (unsigned long long)CHUNK);
	EXPECT_EQ((int)CHUNK, one(&self->ring, self->dev, 0, self->ns1, 0, (uintptr_t)g->map,
				  CHUNK, pos, 0).res);
	rec_gpu(g, 0, CHUNK, 0x7406, pos);
	EXPECT_EQ(0ull, fill_diff(g->map, CHUNK, pos, 0x7406));
	printf("# DMACHECK ns=1 off=%llu len=%llu where=gpu:%s op=read\n",
	       (unsigned long long)pos, (unsigned long long)len, g->bdf);
}

#define RETRIES "/sys/kernel/debug/p2pdirect/file_read_retries"

/* debugfs p2pdirect/file_read_retries, or -1. */
static long read_retries(void)
{
	return file_number(RETRIES, "%ld");
}

/* Extents of @fd's [0, @len), or -1. */
static long extents(int fd, __u64 len)
{
	struct fiemap fm = { .fm_length = len };

	return ioctl(fd, FS_IOC_FIEMAP, &fm) ? -1 : (long)fm.fm_mapped_extents;
}

struct hammer {
	int fd;
	int stop;		/* __atomic */
	void *buf;
};

static int stopped(struct hammer *h)
{
	return __atomic_load_n(&h->stop, __ATOMIC_RELAXED);
}

/*
 * Writes into the holes of retry.bin [1, 2) MiB and punches them out again,
 * until told to stop: each write allocates, and its completion converts the
 * extent, under the inode's extent lock taken exclusively, which an xfs
 * NOWAIT read that meets it gives up.
 */
static void *hammer_main(void *arg)
{
	struct hammer *h = arg;

	while (!stopped(h)) {
		for (__u64 o = MiB; o < 2 * MiB && !stopped(h); o += 4 * KiB)
			if (pwrite(h->fd, h->buf, 4 * KiB, o) != 4 * KiB)
				return (void *)(intptr_t)(errno ? errno : EIO);
		if (fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, MiB, MiB))
			return (void *)(intptr_t)errno;
	}
	return NULL;
}

struct unbind {
	const char *bdf;
	int ret;
	int done;		/* __atomic */
};

static void *unbind_main(void *arg)
{
	struct unbind *u = arg;

	u->ret = sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", u->bdf);
	__atomic_store_n(&u->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * An io_uring READ of a file that the file system gives up after part of it
 * went runs again in a kernel worker, which lets go of its pages, not in
 * the submitter's task work. xfs gives a NOWAIT read up (EAGAIN) at an
 * extent whose mapping lock another thread holds: here retry.bin's first
 * MiB is 256 extents, and a thread writes into and punches holes of its
 * second MiB. 16 READs of 64 KiB into GPU 1 go on a DEFER_TASKRUN ring
 * this thread does not enter, round after round until debugfs
 * p2pdirect/file_read_retries says one was given up mid-way (a failure if
 * none is in 40 rounds: the retry would go untested). Then GPU 1 is unbound from another thread: the
 * unbind waits for the READs' pages, and returns with the CQEs still not
 * posted (before, the retry ran in the task work, so the pages stayed
 * pinned until this thread entered the ring). The READs then complete
 * whole, with the file's bytes (checked on the host). GPU 1 is bound again.
 */
TEST_F_TIMEOUT(ur, file_read_retry_needs_no_task_work, 300)
{
	static const char *const path = "/mnt/xfs/retry.bin", *const pad = "/mnt/xfs/retry-pad.bin";
	const __u64 seed = 0x7e7, n = 64 * KiB;
	struct gpu *g = &self->gpu[1];
	struct p2pdirect_io sync = { .addr = (uintptr_t)g->map, .size = MiB };
	struct p2pdirect_free f = { .handle = g->a.handle };
	struct hammer h = { 0 };
	struct unbind u = { .bdf = g->bdf };
	pthread_t ht, ut;
	struct io_uring r;
	struct done d[16];
	int fd, pfd, round, bad = 0, waited = 0;
	long before = read_retries(), now = before;
	void *hret;

	ASSERT_LE(0, before) TH_LOG("debugfs p2pdirect/file_read_retries: %s", strerror(errno));
	ASSERT_EQ(0, posix_memalign(&h.buf, 4096, MiB));
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
	pfd = open(pad, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
	ASSERT_LE(0, fd);
	ASSERT_LE(0, pfd);
	/* Every other block of the disk: 256 extents. */
	for (__u64 o = 0; o < MiB; o += 4 * KiB) {
		ASSERT_EQ(0, fallocate(fd, 0, o, 4 * KiB));
		ASSERT_EQ(0, fallocate(pfd, 0, o, 4 * KiB));
	}
	fill_buf(h.buf, MiB, 0, seed);
	ASSERT_EQ((ssize_t)MiB, pwrite(fd, h.buf, MiB, 0));
	ASSERT_EQ(0, ftruncate(fd, 2 * MiB));
	ASSERT_EQ(0, fsync(fd));
	ASSERT_LE(128, extents(fd, MiB)) TH_LOG("%s: the blocks were allocated together", path);
	close(fd);
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	ASSERT_LE(0, fd);
	/* Reads the extents in: a NOWAIT read does not wait for them. */
	sync.fd = fd;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_READ, &sync));
	ASSERT_EQ(MiB, sync.bytes);

	h.fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
	ASSERT_LE(0, h.fd);
	ASSERT_EQ(0, pthread_create(&ht, NULL, hammer_main, &h));
	ASSERT_EQ(0, io_uring_queue_init(QD, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32 |
					 IORING_SETUP_SINGLE_ISSUER |
					 IORING_SETUP_DEFER_TASKRUN));
	for (round = 0; round < 40; round++) {
		memset(g->map, 0, MiB);
		for (int i = 0; i < 16; i++)
			prep(&r, self->dev, 0, fd, 0, (uintptr_t)g->map, n, i * n, i * n, i);
		ASSERT_EQ(16, io_uring_submit(&r));
		/* The READs' bios are done long before; their CQEs wait for us. */
		usleep(300 * 1000);
		now = read_retries();
		if (now != before)
			break;
		ASSERT_EQ(0, reap(&r, 16, d));
		for (int i = 0; i < 16; i++)
			bad += d[i].res != (int)n;
		ASSERT_EQ(0, bad) TH_LOG("round %d: first result %d", round, d[0].res);
	}
	__atomic_store_n(&h.stop, 1, __ATOMIC_RELAXED);
	ASSERT_EQ(0, pthread_join(ht, &hret));
	ASSERT_EQ(NULL, hret) TH_LOG("the writes into holes of %s failed: %s", path,
				    strerror((int)(intptr_t)hret));
	close(h.fd);
	/* Seen at once in every run so far (2-7 of the first 16 READs). */
	ASSERT_NE(before, now) TH_LOG("no READ given up mid-way in %d rounds: no retry", round);
	TH_LOG("round %d: %ld READs given up mid-way and run again", round, now - before);

	self->unbound = 1;
	ASSERT_EQ(0, pthread_create(&ut, NULL, unbind_main, &u));
	for (int i = 0; i < 300 && !__atomic_load_n(&u.done, __ATOMIC_ACQUIRE); i++)
		usleep(100 * 1000);
	waited = !__atomic_load_n(&u.done, __ATOMIC_ACQUIRE);
	EXPECT_EQ(0, waited) TH_LOG("the unbind of %s waits for this thread's ring", g->bdf);
	/* Entering the ring runs its task work (and, before, the retries). */
	ASSERT_EQ(0, reap(&r, 16, d));
	ASSERT_EQ(0, pthread_join(ut, NULL));
	EXPECT_EQ(0, u.ret) TH_LOG("unbind: %s", strerror(-u.ret));
	for (int i = 0; i < 16; i++)
		bad += d[i].res != (int)n;
	EXPECT_EQ(0, bad) TH_LOG("first result %d", d[0].res);
	rec_gpu(g, 0, MiB, seed, 0);
	io_uring_queue_exit(&r);
	close(fd);
	unlink(path);
	unlink(pad);
	free(h.buf);

	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_FREE, &f));
	munmap(g->map, BUF);
	g->map = NULL;
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", g->bdf));
	self->unbound = 0;
}

/*
 * GPU 1 unbound from p2pdirect by the very thread whose ring has 64 READs
 * into GPU 1 in flight, a ring that runs completions only when this thread
 * enters it (DEFER_TASKRUN): the unbind waits for the READs' pins, which
 * their bios' completion releases, not the ring's task work, so it returns.
 * The READs then complete whole (their pages stayed pinned until the bios
 * were done). Bound again, GPU 1's memory is handed out zeroed.
 */
TEST_F_TIMEOUT(ur, gpu_unbind_with_own_commands_in_flight, 120)
{
	struct gpu *g = &self->gpu[1];
	__u64 pos = OWN + 12 * MiB, len = 64 * CHUNK, old_off = g->a.provider_offset;
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_free f = { .handle = g->a.handle };
	struct gpu again = *g;
	struct io_uring r;
	struct done d[64];
	int bad = 0;

	ASSERT_EQ(0, seed_ns(self, g, 0, len, pos, 0x7406));
	ASSERT_EQ(0, io_uring_queue_init(QD, &r, IORING_SETUP_SQE128 | IORING_SETUP_CQE32 |
					 IORING_SETUP_SINGLE_ISSUER |
					 IORING_SETUP_DEFER_TASKRUN));
	for (int i = 0; i < 64; i++)
		prep(&r, self->dev, 0, self->ns1, 0, (uintptr_t)g->map, CHUNK, pos + i * CHUNK,
		     len + i * CHUNK, i);
	ASSERT_EQ(64, io_uring_submit(&r));
	rec_gpu(g, len, len, 0x7406, pos);
	self->unbound = 1;
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", g->bdf));
	ASSERT_EQ(0, reap(&r, 64, d));
	for (int i = 0; i < 64; i++)
		bad += d[i].res != (int)CHUNK;
	EXPECT_EQ(0, bad) TH_LOG("first result %d", d[0].res);
	io_uring_queue_exit(&r);
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_FREE, &f));
	munmap(g->map, BUF);
	g->map = NULL;

	/* Bound again: the memory the READs landed in is handed out zeroed. */
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", g->bdf));
	self->unbound = 0;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	again.index = ~0u;
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR && p[i].pci_addr == g->pci)
			again.index = p[i].index;
	ASSERT_NE(~0u, again.index) TH_LOG("%s is no provider after the bind", g->bdf);
	memset(&again.a, 0, sizeof(again.a));
	again.a.size = old_off + BUF;
	again.a.provider = again.index;
	ASSERT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_ALLOC, &again.a));
	record_alloc_zero(self->dev, &again.a);
	EXPECT_EQ(0ull, again.a.provider_offset);
	f.handle = again.a.handle;
	EXPECT_EQ(0, ioctl(self->dev, P2PDIRECT_IOC_FREE, &f));
}

TEST_HARNESS_MAIN
