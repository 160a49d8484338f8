// SPDX-License-Identifier: GPL-2.0
/*
 * P2PDIRECT_IOC_EXPORT_DMABUF tests (kselftest harness, TAP on stdout):
 * device memory exported as a dma-buf and imported by p2pd_importer.ko (a
 * test module playing an RDMA driver on a PCI function of the VM: the NVMe
 * controller behind the GPUs' switch stands in for the NIC).
 *
 * What is checked: the DMA addresses the importer gets lie in the GPU's BAR
 * window (sysfs resource file) at the allocation's bus address, and a DMA
 * through them (QEMU's edu device, driven by the importer) lands there, and
 * after FREE only in memory the importer still holds; importers
 * that cannot reach the memory, refuse P2P or cannot be revoked are refused;
 * FREE, close and process exit revoke (the importer is told, later maps
 * fail, CPU mappings of the dma-buf get SIGBUS); the memory returns to the
 * provider only after the importer unmapped, or its module unloaded; bad
 * input gets its errno.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <pthread.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"
#include "testmod_util.h"

#define DEV_PATH "/dev/p2pdirect"
#define CTL_PATH "/sys/kernel/debug/p2pd_importer/ctl"
#define MiB (1ull << 20)
#define PAGE 4096ull

static int do_alloc(int fd, __u32 provider, __u64 size, struct p2pdirect_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->provider = provider;
	a->size = size;
	if (ioctl(fd, P2PDIRECT_IOC_ALLOC, a))
		return -errno;
	record_alloc_zero(fd, a);
	return 0;
}

static int do_free(int fd, __u64 handle)
{
	struct p2pdirect_free f = { .handle = handle };

	return ioctl(fd, P2PDIRECT_IOC_FREE, &f) ? -errno : 0;
}

/* The dma-buf fd of [off, off + size) of allocation @handle, or -errno. */
static int do_export(int fd, __u64 handle, __u64 off, __u64 size, __u32 flags)
{
	struct p2pdirect_export_dmabuf e = {
		.handle = handle, .offset = off, .size = size, .flags = flags, .fd = -1,
	};

	if (ioctl(fd, P2PDIRECT_IOC_EXPORT_DMABUF, &e))
		return -errno;
	return e.fd;
}

/*
 * The BAR window [start, end] of BAR @bar of PCI function @addr (sysfs: CPU
 * physical addresses, which are the bus addresses on x86).
 */
static int bar_window(__u32 addr, __u32 bar, unsigned long long *start, unsigned long long *end)
{
	char name[32], path[96], line[128];
	unsigned long long flags;
	FILE *f;
	int ok = 0;

	pci_name(addr, name, sizeof(name));
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource", name);
	f = fopen(path, "r");
	if (!f)
		return 0;
	for (__u32 i = 0; fgets(line, sizeof(line), f); i++)
		if (i == bar)
			ok = sscanf(line, "%llx %llx %llx", start, end, &flags) == 3;
	fclose(f);
	return ok;
}

static sigjmp_buf fault_jmp;

static void on_fault(int sig)
{
	siglongjmp(fault_jmp, sig);
}

/* The signal reading the byte at @p raises (SIGBUS, SIGSEGV), or 0. */
static int read_faults(const uint8_t *p)
{
	struct sigaction sa = { .sa_handler = on_fault }, old_bus, old_segv;
	int sig;

	sigaction(SIGBUS, &sa, &old_bus);
	sigaction(SIGSEGV, &sa, &old_segv);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig)
		(void)__atomic_load_n(p, __ATOMIC_RELAXED);
	sigaction(SIGBUS, &old_bus, NULL);
	sigaction(SIGSEGV, &old_segv, NULL);
	return sig;
}

FIXTURE(db) {
	int fd, ctl;
	struct p2pdirect_provider_info gpu;
	char sw[32], rp[32];	/* NVMe functions behind the switch / at a root port */
	int kept;		/* an importer was handed to the module */
	char unbound[32];	/* a GPU the test unbinds */
};

FIXTURE_SETUP(db)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	char ns[64], dir[PATH_MAX];
	int found = 0;

	self->fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->fd, 0) TH_LOG("open %s: %s", DEV_PATH, strerror(errno));
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8 && !found; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR) {
			self->gpu = p[i];
			found = 1;
		}
	ASSERT_TRUE(found) TH_LOG("no emulated GPU");
	ASSERT_TRUE(find_nvme("p2pnvme-sw", ns, sizeof(ns), dir));
	snprintf(self->sw, sizeof(self->sw), "%s", strrchr(dir, '/') + 1);
	ASSERT_TRUE(find_nvme("p2pnvme-rp", ns, sizeof(ns), dir));
	snprintf(self->rp, sizeof(self->rp), "%s", strrchr(dir, '/') + 1);
	self->ctl = open(CTL_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->ctl, 0) TH_LOG("open %s: %s (p2pd_importer.ko loaded?)", CTL_PATH,
				      strerror(errno));
}

FIXTURE_TEARDOWN(db)
{
	close(self->ctl);
	EXPECT_EQ(0, tm_restore(self->kept, self->unbound));
	close(self->fd);
}

/* The importer behind the switch gets the allocation's bus addresses. */
TEST_F(db, map_gives_bus_addresses_in_the_bar_window)
{
	unsigned long long start, end, total = 0;
	struct p2pdirect_alloc a;
	char bdf[32];
	__u64 pinned;
	struct tm_state st;
	int buf;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, 4 * MiB, &a));
	buf = do_export(self->fd, a.handle, MiB, 2 * MiB, 0);
	ASSERT_GE(buf, 0) TH_LOG("export: %s", strerror(-buf));
	ASSERT_EQ((off_t)(2 * MiB), lseek(buf, 0, SEEK_END));
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	pinned = pinned_bytes(self->fd, self->gpu.pci_addr);
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	/* A mapping counts as pinned device memory in STATS. */
	EXPECT_EQ(pinned + 2 * MiB, pinned_bytes(self->fd, self->gpu.pci_addr));
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1, st.mapped);
	ASSERT_GE(st.segs, 1u);
	ASSERT_TRUE(bar_window(self->gpu.pci_addr, self->gpu.bar, &start, &end));
	pci_name(self->gpu.pci_addr, bdf, sizeof(bdf));
	for (unsigned int i = 0; i < st.segs; i++) {
		/* The host checks it against the BAR window too (hostcheck.py). */
		printf("# DMAADDR gpu=%s addr=%#llx len=%#llx off=%#llx\n", bdf, st.addr[i],
		       st.len[i], (unsigned long long)(a.provider_offset + MiB + total));
		EXPECT_GE(st.addr[i], start);
		EXPECT_LE(st.addr[i] + st.len[i] - 1, end);
		EXPECT_EQ(a.bus_addr + MiB + total, st.addr[i]);
		total += st.len[i];
	}
	EXPECT_EQ(2 * MiB, total);
	EXPECT_EQ(0, tm_cmd(self->ctl, "unmap"));
	EXPECT_EQ(pinned, pinned_bytes(self->fd, self->gpu.pci_addr));
	EXPECT_EQ(0, tm_cmd(self->ctl, "detach"));
	close(buf);
	EXPECT_EQ(0, do_free(self->fd, a.handle));
}

/* The PCI address of the edu device p2pd_importer.ko drives, in @bdf. */
static int edu_bdf(char *bdf, size_t size)
{
	glob_t g;
	int ok;

	if (glob("/sys/bus/pci/drivers/p2pd_importer/0000:*", 0, NULL, &g))
		return 0;
	ok = g.gl_pathc == 1;
	if (ok)
		snprintf(bdf, size, "%s", strrchr(g.gl_pathv[0], '/') + 1);
	globfree(&g);
	return ok;
}

/* Whether the 4 KiB at @p hold the importer's "dma" pattern of @seed. */
static int holds_pattern(const uint8_t *p, uint8_t seed)
{
	for (unsigned int j = 0; j < PAGE; j++)
		if (p[j] != pattern_byte(j, seed))
			return 0;
	return 1;
}

static int all_zero(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return 0;
	return 1;
}

/*
 * A peer's DMA through its mapping (an RDMA write: the edu device behind the
 * switch, driven by the importer) lands in the allocation at the offset it
 * was aimed at. After FREE an importer slow to unmap may still write: that
 * lands in the memory it holds, never in memory handed to a new allocation.
 * The host checks the GPU file (HOSTCHECK records).
 */
TEST_F(db, peer_dma_lands_in_the_allocation_never_in_reused_memory)
{
	struct p2pdirect_provider_info g = { 0 };
	struct p2pdirect_alloc low, a, b;
	char edu[32], gpu[32];
	uint8_t *m, *q;
	int buf;

	ASSERT_TRUE(edu_bdf(edu, sizeof(edu))) TH_LOG("no edu device bound to p2pd_importer");
	/*
	 * The last GPU, past its first 4 MiB: the suites after this one
	 * allocate little there, so the host likely still finds these bytes.
	 */
	ASSERT_EQ(0, last_gpu(self->fd, &g));
	pci_name(g.pci_addr, gpu, sizeof(gpu));
	ASSERT_EQ(0, do_alloc(self->fd, g.index, 4 * MiB, &low));
	ASSERT_EQ(0, do_alloc(self->fd, g.index, 2 * MiB, &a));
	m = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, m);
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s lazy", buf, edu));
	EXPECT_EQ(-ENOTCONN, tm_cmd(self->ctl, "dma 1000 1000 11"));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	EXPECT_EQ(-EINVAL, tm_cmd(self->ctl, "dma 1000 1001 11"));
	EXPECT_EQ(-ERANGE, tm_cmd(self->ctl, "dma 1ff800 1000 11"));
	ASSERT_EQ(0, tm_cmd(self->ctl, "dma 1000 1000 11"));
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu seed=11 guard=64\n", gpu,
	       (unsigned long long)(a.provider_offset + 0x1000), PAGE);
	EXPECT_TRUE(holds_pattern(m + 0x1000, 11));
	EXPECT_TRUE(all_zero(m, 0x1000));
	EXPECT_TRUE(all_zero(m + 0x2000, 2 * MiB - 0x2000));
	munmap(m, 2 * MiB);

	/* Freed; the importer keeps its mapping, and with it the memory. */
	ASSERT_EQ(0, do_free(self->fd, a.handle));
	ASSERT_EQ(0, do_alloc(self->fd, g.index, 2 * MiB, &b));
	EXPECT_TRUE(b.provider_offset + b.size <= a.provider_offset ||
		    b.provider_offset >= a.provider_offset + a.size);
	q = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, b.mmap_offset);
	ASSERT_NE(MAP_FAILED, q);
	ASSERT_EQ(0, tm_cmd(self->ctl, "dma 3000 800 29"));
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu seed=29 guard=0\n", gpu,
	       (unsigned long long)(a.provider_offset + 0x3000), 0x800ull);
	EXPECT_TRUE(all_zero(q, 2 * MiB));
	/* Once it unmapped, it has nothing to write through. */
	ASSERT_EQ(0, tm_cmd(self->ctl, "unmap"));
	EXPECT_EQ(-ENOTCONN, tm_cmd(self->ctl, "dma 1000 1000 29"));
	munmap(q, 2 * MiB);
	EXPECT_EQ(0, do_free(self->fd, b.handle));
	EXPECT_EQ(0, do_free(self->fd, low.handle));
	close(buf);
}

/* The controller at a root port has no P2P path to the GPU. */
TEST_F(db, unreachable_importer_is_refused)
{
	struct p2pdirect_alloc a;
	int buf;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	EXPECT_EQ(-EREMOTEIO, tm_cmd(self->ctl, "attach %d %s", buf, self->rp));
	EXPECT_EQ(-EOPNOTSUPP, tm_cmd(self->ctl, "attach %d %s nop2p", buf, self->sw));
	EXPECT_EQ(-EOPNOTSUPP, tm_cmd(self->ctl, "attach %d %s norevoke", buf, self->sw));
	/* And a good one still attaches. */
	EXPECT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	close(buf);
	EXPECT_EQ(0, do_free(self->fd, a.handle));
}

/* The dma-buf's mmap is the same memory as the device mapping. */
TEST_F(db, mmap_shares_the_bytes)
{
	struct p2pdirect_alloc a;
	uint8_t *dev, *view;
	int buf, status;
	pid_t pid;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	dev = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, dev);
	buf = do_export(self->fd, a.handle, 4 * PAGE, 8 * PAGE, P2PDIRECT_EXPORT_CLOEXEC);
	ASSERT_GE(buf, 0);
	EXPECT_EQ(FD_CLOEXEC, fcntl(buf, F_GETFD) & FD_CLOEXEC);
	view = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, buf, 0);
	ASSERT_NE(MAP_FAILED, view) TH_LOG("mmap dma-buf: %s", strerror(errno));
	memset(dev + 4 * PAGE, 0x5a, PAGE);
	EXPECT_EQ(0x5a, view[0]);
	view[PAGE + 7] = 0xa5;
	EXPECT_EQ(0xa5, dev[5 * PAGE + 7]);
	/*
	 * Private mappings are refused (by p2pdirect); oversized ones (by the
	 * dma-buf core) and executable ones (dma-buf files are noexec) too.
	 */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 8 * PAGE, PROT_READ, MAP_PRIVATE, buf, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 9 * PAGE, PROT_READ, MAP_SHARED, buf, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PAGE, PROT_READ | PROT_EXEC, MAP_SHARED, buf, 0));
	EXPECT_EQ(EPERM, errno);
	/* Not inherited by fork, like the device mapping. */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid)
		_exit(read_faults(view) == SIGSEGV ? 0 : 1);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* FREE zaps the dma-buf's mapping too. */
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	EXPECT_EQ(SIGBUS, read_faults(view));
	EXPECT_EQ(SIGBUS, read_faults(dev));
	munmap(view, 8 * PAGE);
	munmap(dev, MiB);
	close(buf);
}

/*
 * A CPU mapping of the dma-buf is the allocation's memory: DMA_PROBE and
 * REGISTER name p2pdirect's own client, and FREE invalidates the
 * registration (before, the range was taken as another provider's P2PDMA
 * mapping: the registration stayed live and pinned freed memory). A range
 * that starts in the RAM page before the view is ENXIO.
 */
TEST_F(db, registration_on_a_dmabuf_mapping_is_invalidated_by_free)
{
	struct p2pdirect_alloc a;
	struct p2pdirect_register r;
	struct p2pdirect_reg_id q;
	struct p2pdirect_dma_probe p;
	uint8_t *ram, *view;
	char ns[64];
	__u64 id;
	int buf, nsfd;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	buf = do_export(self->fd, a.handle, 4 * PAGE, 8 * PAGE, P2PDIRECT_EXPORT_CLOEXEC);
	ASSERT_GE(buf, 0);
	/* The view right after a page of RAM. */
	ram = mmap(NULL, 9 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, ram);
	ram[0] = 1;
	view = mmap(ram + PAGE, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, buf, 0);
	ASSERT_EQ(ram + PAGE, view) TH_LOG("mmap dma-buf: %s", strerror(errno));
	view[0] = 1;

	/* DMA_PROBE for the controller behind the switch, which reaches the GPU. */
	ASSERT_TRUE(find_nvme("p2pnvme-sw", ns, sizeof(ns), NULL));
	nsfd = open(ns, O_RDONLY);
	ASSERT_GE(nsfd, 0);
	memset(&p, 0, sizeof(p));
	p.addr = (uintptr_t)view;
	p.size = 2 * PAGE;
	p.fd = nsfd;
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DMA_PROBE, &p)) TH_LOG("DMA_PROBE: %s", strerror(errno));
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_DEVMEM, p.client);
	close(nsfd);

	memset(&r, 0, sizeof(r));
	r.addr = (uintptr_t)view + PAGE;
	r.size = 2 * PAGE;
	r.flags = P2PDIRECT_REG_WRITE;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r)) TH_LOG("REGISTER: %s", strerror(errno));
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_DEVMEM, r.client);
	id = r.id;
	memset(&q, 0, sizeof(q));
	q.id = id;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ((__u32)P2PDIRECT_REG_LIVE, q.state);

	/* A range that runs past the dma-buf's mapping is refused (as it was before). */
	r.addr = (uintptr_t)view + 7 * PAGE;
	r.size = 2 * PAGE;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r));
	EXPECT_EQ(EFAULT, errno);
	/* One that starts in RAM is not device memory (since ABI 1.21; before, EFAULT). */
	r.addr = (uintptr_t)ram;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r));
	EXPECT_EQ(ENXIO, errno) TH_LOG("REGISTER from RAM into the view: %s", strerror(errno));

	/* FREE reaches the registration: dead, its pins gone. */
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	memset(&q, 0, sizeof(q));
	q.id = id;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ((__u32)P2PDIRECT_REG_DEAD, q.state);
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DEREGISTER, &q));
	EXPECT_EQ(SIGBUS, read_faults(view));
	munmap(ram, 9 * PAGE);
	close(buf);
}

/* FREE tells the importer at once; later maps and attaches fail. */
TEST_F(db, free_revokes_the_importer)
{
	struct p2pdirect_alloc a;
	struct tm_state st;
	__u64 before = provider_used_bytes(self->fd, self->gpu.index);
	int buf, ctl2;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	ASSERT_EQ(0, do_free(self->fd, a.handle));
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-ENODEV, tm_cmd(self->ctl, "map"));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	ctl2 = open(CTL_PATH, O_RDWR);
	ASSERT_GE(ctl2, 0);
	EXPECT_EQ(-ENODEV, tm_cmd(ctl2, "attach %d %s", buf, self->sw));
	close(ctl2);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PAGE, PROT_READ, MAP_SHARED, buf, 0));
	EXPECT_EQ(ENODEV, errno);
	close(buf);
}

/* An importer slow to unmap keeps the memory from being reused. */
TEST_F(db, memory_returns_only_after_the_importer_unmapped)
{
	struct p2pdirect_alloc a;
	struct tm_state st;
	__u64 before;
	int buf;

	before = provider_used_bytes(self->fd, self->gpu.index);
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, 2 * MiB, &a));
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s lazy", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	ASSERT_EQ(0, do_free(self->fd, a.handle));
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(1, st.mapped);
	/* Still held: a new ALLOC cannot get it back yet. */
	EXPECT_EQ(before + 2 * MiB, provider_used_bytes(self->fd, self->gpu.index));
	ASSERT_EQ(0, tm_cmd(self->ctl, "unmap"));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	close(buf);
}

/*
 * An importer module unloaded while it holds a mapping (an RDMA driver
 * removed with a memory region registered) unmaps and detaches in its exit:
 * the freed allocation it kept from reuse goes back then, and nothing stays
 * pinned.
 */
TEST_F(db, importer_unload_releases_the_memory)
{
	struct p2pdirect_alloc a;
	__u64 before, pinned;
	int buf;

	before = provider_used_bytes(self->fd, self->gpu.index);
	pinned = pinned_bytes(self->fd, self->gpu.pci_addr);
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, 2 * MiB, &a));
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s lazy", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	self->kept = 1;
	ASSERT_EQ(0, tm_cmd(self->ctl, "keep"));
	EXPECT_EQ(-EALREADY, tm_cmd(self->ctl, "keep"));
	/* The importer outlives the file and the dma-buf fd (it holds the dma-buf). */
	close(self->ctl);
	self->ctl = -1;
	close(buf);
	EXPECT_EQ(pinned + 2 * MiB, pinned_bytes(self->fd, self->gpu.pci_addr));
	ASSERT_EQ(0, do_free(self->fd, a.handle));
	EXPECT_EQ(before + 2 * MiB, provider_used_bytes(self->fd, self->gpu.index));
	ASSERT_EQ(0, system("rmmod p2pd_importer"));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	EXPECT_EQ(pinned, pinned_bytes(self->fd, self->gpu.pci_addr));
}

/* Closing the /dev/p2pdirect file (or exiting) revokes its exports. */
TEST_F(db, close_and_exit_revoke)
{
	struct p2pdirect_alloc a;
	__u64 before = provider_used_bytes(self->fd, self->gpu.index);
	struct tm_state st;
	int fd2, buf, status;
	pid_t pid;

	fd2 = open(DEV_PATH, O_RDWR);
	ASSERT_GE(fd2, 0);
	ASSERT_EQ(0, do_alloc(fd2, self->gpu.index, MiB, &a));
	buf = do_export(fd2, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	close(fd2);
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(0, tm_cmd(self->ctl, "detach"));
	close(buf);

	/* A child exports and maps through our importer file, then exits. */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		int f = open(DEV_PATH, O_RDWR), b;

		if (f < 0 || do_alloc(f, self->gpu.index, MiB, &a))
			_exit(2);
		b = do_export(f, a.handle, 0, 0, 0);
		if (b < 0 || tm_cmd(self->ctl, "attach %d %s", b, self->sw) ||
		    tm_cmd(self->ctl, "map"))
			_exit(3);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-ENODEV, tm_cmd(self->ctl, "map"));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
}

/*
 * With no descriptor left, an export that names no allocation or a bad range
 * is refused for that (ENOENT, EINVAL), not for the descriptor; a good one
 * gets EMFILE and leaves nothing behind (the buffer it made is released).
 */
TEST_F(db, emfile_after_the_argument_checks)
{
	struct p2pdirect_alloc a;
	struct rlimit old, lim;
	__u64 used;
	int fd;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	used = provider_used_bytes(self->fd, self->gpu.index);
	ASSERT_EQ(0, getrlimit(RLIMIT_NOFILE, &old));
	/* The lowest free descriptor becomes the limit: none left. */
	fd = dup(0);
	ASSERT_GE(fd, 0);
	close(fd);
	lim = old;
	lim.rlim_cur = fd;
	ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &lim));
	EXPECT_EQ(-1, dup(0));
	EXPECT_EQ(EMFILE, errno);
	EXPECT_EQ(-ENOENT, do_export(self->fd, a.handle + 1000, 0, 0, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 100, PAGE, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 0, 2 * MiB, 0));
	EXPECT_EQ(-EMFILE, do_export(self->fd, a.handle, 0, 0, 0));
	ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &old));
	/* The refused exports hold nothing: FREE returns the memory at once. */
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	EXPECT_EQ(used - MiB, provider_used_bytes(self->fd, self->gpu.index));
	fd = do_export(self->fd, a.handle, 0, 0, 0);
	EXPECT_EQ(-ENOENT, fd);
}

/* Every bad argument has its errno, and a refused export takes nothing. */
TEST_F(db, bad_input)
{
	struct p2pdirect_export_dmabuf e = { 0 };
	struct p2pdirect_alloc a, w;
	int ro, other, before_fd;
	void *ro_arg;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	before_fd = dup(0);
	ASSERT_GE(before_fd, 0);
	close(before_fd);
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 0, 0, 2));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 100, PAGE, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 0, 100, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, 0, MiB + PAGE, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, MiB, 0, 0));
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle, PAGE, ~0ull & ~(PAGE - 1), 0));
	EXPECT_EQ(-ENOENT, do_export(self->fd, a.handle + 1000, 0, 0, 0));
	/* The flags before the allocation is looked up. */
	EXPECT_EQ(-EINVAL, do_export(self->fd, a.handle + 1000, 0, 0, 2));
	/* Another file's allocation is not ours to export. */
	other = open(DEV_PATH, O_RDWR);
	ASSERT_GE(other, 0);
	EXPECT_EQ(-ENOENT, do_export(other, a.handle, 0, 0, 0));
	close(other);
	ro = open(DEV_PATH, O_RDONLY);
	ASSERT_GE(ro, 0);
	EXPECT_EQ(-EBADF, do_export(ro, a.handle, 0, 0, 0));
	close(ro);
	/* A write-only file may not hand out a read-write dma-buf. */
	ro = open(DEV_PATH, O_WRONLY);
	ASSERT_GE(ro, 0);
	ASSERT_EQ(0, do_alloc(ro, self->gpu.index, MiB, &w));
	EXPECT_EQ(-EBADF, do_export(ro, w.handle, 0, 0, 0));
	/* The open mode is refused first, as for every other command. */
	EXPECT_EQ(-EBADF, do_export(ro, w.handle, 0, 0, 2));
	EXPECT_EQ(-1, ioctl(ro, P2PDIRECT_IOC_EXPORT_DMABUF, (void *)8));
	EXPECT_EQ(EBADF, errno);
	close(ro);
	/* Pad of the argument: the output field must not matter on input. */
	e.handle = a.handle;
	e.fd = 12345;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_EXPORT_DMABUF, &e));
	EXPECT_NE(12345, e.fd);
	/* Opened read-write, and not close-on-exec without the flag. */
	EXPECT_EQ(O_RDWR, fcntl(e.fd, F_GETFL) & O_ACCMODE);
	EXPECT_EQ(0, fcntl(e.fd, F_GETFD) & FD_CLOEXEC);
	close(e.fd);
	/* No descriptor was left behind by the refusals. */
	EXPECT_EQ(before_fd, dup(0));
	close(before_fd);
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	EXPECT_EQ(-ENOENT, do_export(self->fd, a.handle, 0, 0, 0));
	/* A read-only argument: EFAULT before anything happened. */
	ro_arg = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, ro_arg);
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_EXPORT_DMABUF, ro_arg));
	EXPECT_EQ(EFAULT, errno);
	munmap(ro_arg, PAGE);
}

/*
 * Memory whose dma-buf carries a fence an importer has not signalled goes
 * back to the provider only once the fence retired, even when a kernel
 * consumer of the same memory, told before the dma-buf, reaps on its way
 * (since ABI 1.14; before, the memory went back while FREE still waited for
 * the fence, so another ALLOC could get it under the importer's DMA).
 */
TEST_F(db, fenced_memory_stays_used_until_the_fence_retires)
{
	struct freer f = { .fd = self->fd, .ret = -1 };
	struct p2pdirect_alloc a;
	__u64 before, during;
	pthread_t t;
	int peer, buf;
	void *m;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	/* Read after the ALLOC, which reaps what earlier tests left. */
	before = provider_used_bytes(self->fd, self->gpu.index) - MiB;
	m = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, m);
	peer = open("/sys/kernel/debug/p2pd_importer/peer", O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, peer);
	/* The consumer subscribes first, the export second. */
	ASSERT_EQ(0, tm_cmd(peer, "acquire %lx %llx %s", (unsigned long)m, MiB, self->sw));
	munmap(m, MiB);
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_LE(0, buf);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "fence"));
	f.handle = a.handle;
	ASSERT_EQ(0, pthread_create(&t, NULL, free_main, &f));
	/* The consumer was told (and reaped); FREE waits for the fence. */
	EXPECT_EQ(1u, tm_wait_invalidation(peer));
	usleep(200000);
	during = provider_used_bytes(self->fd, self->gpu.index);
	EXPECT_EQ(0, tm_cmd(self->ctl, "signal"));
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, f.ret);
	EXPECT_EQ(before + MiB, during) TH_LOG("the memory went back before the fence retired");
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	EXPECT_EQ(0, tm_cmd(peer, "release"));
	close(peer);
	EXPECT_EQ(0, tm_cmd(self->ctl, "detach"));
	close(buf);
}

/*
 * Revocation tells the registrations and kernel consumers of the memory
 * before its dma-bufs, whose fences it waits for: here the export comes
 * first, and while FREE waits for its importer's fence the consumer was
 * told and the registration is dead (before, they were told in the order
 * they came, so a fence kept them live).
 */
TEST_F(db, fence_wait_comes_after_registrations_and_consumers)
{
	struct freer f = { .fd = self->fd, .ret = -1 };
	struct p2pdirect_register r = { .size = MiB };
	struct p2pdirect_reg_id q = { 0 };
	struct p2pdirect_alloc a;
	pthread_t t;
	int peer, buf;
	void *m;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu.index, MiB, &a));
	m = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, m);
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_LE(0, buf);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "fence"));
	r.addr = (uintptr_t)m;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r)) TH_LOG("%s", strerror(errno));
	peer = open("/sys/kernel/debug/p2pd_importer/peer", O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, peer);
	ASSERT_EQ(0, tm_cmd(peer, "acquire %lx %llx %s", (unsigned long)m, MiB, self->sw));
	munmap(m, MiB);
	f.handle = a.handle;
	ASSERT_EQ(0, pthread_create(&t, NULL, free_main, &f));
	EXPECT_EQ(1u, tm_wait_invalidation(peer)) TH_LOG("the consumer waited for the fence");
	q.id = r.id;
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ((__u32)P2PDIRECT_REG_DEAD, q.state) TH_LOG("the registration waited for the fence");
	/* FREE still waits for the fence. */
	EXPECT_EQ(EBUSY, pthread_tryjoin_np(t, NULL));
	EXPECT_EQ(0, tm_cmd(self->ctl, "signal"));
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, f.ret);
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DEREGISTER, &q));
	EXPECT_EQ(0, tm_cmd(peer, "release"));
	close(peer);
	EXPECT_EQ(0, tm_cmd(self->ctl, "detach"));
	close(buf);
}

struct unbinder {
	char bdf[32];
	int ret;
	int done;
};

static void *unbind_main(void *arg)
{
	struct unbinder *u = arg;

	u->ret = sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", u->bdf);
	__atomic_store_n(&u->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * Removal of the GPU revokes its dma-bufs and waits until the importer
 * unmapped (here an importer slow to do so), then the GPU binds again.
 */
TEST_F(db, gpu_unbind_waits_for_the_importer)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_alloc a;
	struct tm_state st;
	struct p2pdirect_provider_info g = { 0 };
	struct unbinder u = { 0 };
	pthread_t t;
	int buf, back = 0;

	/* The last GPU listed (see last_gpu()). */
	ASSERT_EQ(0, last_gpu(self->fd, &g));
	pci_name(g.pci_addr, u.bdf, sizeof(u.bdf));
	snprintf(self->unbound, sizeof(self->unbound), "%s", u.bdf);
	ASSERT_EQ(0, do_alloc(self->fd, g.index, MiB, &a));
	buf = do_export(self->fd, a.handle, 0, 0, 0);
	ASSERT_GE(buf, 0);
	ASSERT_EQ(0, tm_cmd(self->ctl, "attach %d %s lazy", buf, self->sw));
	ASSERT_EQ(0, tm_cmd(self->ctl, "map"));
	ASSERT_EQ(0, pthread_create(&t, NULL, unbind_main, &u));
	sleep(2);
	/* Told, but still mapped: the unbind waits. */
	ASSERT_EQ(0, tm_state(self->ctl, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(1, st.mapped);
	EXPECT_EQ(0, __atomic_load_n(&u.done, __ATOMIC_ACQUIRE));
	ASSERT_EQ(0, tm_cmd(self->ctl, "unmap"));
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, u.ret);
	EXPECT_EQ(-ENODEV, tm_cmd(self->ctl, "map"));
	EXPECT_EQ(0, tm_cmd(self->ctl, "detach"));
	close(buf);
	/* FREE of the revoked allocation is still fine. */
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", u.bdf));
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	/* Back, empty, and still the last GPU listed. */
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR)
			back = p[i].pci_addr == g.pci_addr && p[i].bytes_used == 0;
	EXPECT_TRUE(back);
}

TEST_HARNESS_MAIN
