// SPDX-License-Identifier: GPL-2.0
/*
 * The kernel API of include/linux/p2pdirect.h (kselftest harness, TAP on
 * stdout), driven through two test modules: p2pd_importer.ko's
 * p2pd_importer/peer file is a consumer (an RDMA driver taking a user range
 * for a PCI function: the NVMe controller behind the GPUs' switch stands in
 * for the NIC), p2pd_client.ko a client of its own memory (another GPU
 * driver), mapped through p2pd_client/mem.
 *
 * What is checked: a consumer gets the allocation's bus addresses (in the
 * GPU's BAR window), is refused for an unreachable device or for RAM, is
 * told on FREE, close, process exit and GPU unbind and sees later maps
 * fail; the memory returns to the provider once it is told; an outside
 * client's memory is claimed by that client (DMA_PROBE says so), serves DMA
 * mappings but not REGISTER or READ, and its invalidation reaches the
 * consumer, also while the consumer acquires and releases in a loop;
 * unloading the client invalidates what consumers keep; unloading a
 * consumer that holds a range releases it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"
#include "nvme_util.h"
#include "testmod_util.h"

#define DEV_PATH "/dev/p2pdirect"
#define PEER_PATH "/sys/kernel/debug/p2pd_importer/peer"
#define CLIENT_MEM "/sys/kernel/debug/p2pd_client/mem"
#define CLIENT_CTL "/sys/kernel/debug/p2pd_client/ctl"
#define CLIENT_PFNMEM "/sys/kernel/debug/p2pd_client/pfnmem"
#define CLIENT_BIGMEM "/sys/kernel/debug/p2pd_client/bigmem"
#define MiB (1ull << 20)
#define PAGE 4096ull
/* The guest loads the module with max_pinned_mib=96. */
#define PIN_CAP (96 * MiB)

FIXTURE(ka) {
	int fd, peer, ns_fd;
	struct p2pdirect_provider_info gpu;
	char sw[32], rp[32];
	int kept;		/* a consumer was handed to the importer module */
	char unbound[32];	/* a GPU the test unbinds */
};

FIXTURE_SETUP(ka)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	char ns[64], dir[PATH_MAX];
	int found = 0;

	self->fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->fd, 0);
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8 && !found; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR) {
			self->gpu = p[i];
			found = 1;
		}
	ASSERT_TRUE(found);
	ASSERT_TRUE(find_nvme("p2pnvme-sw", ns, sizeof(ns), dir));
	snprintf(self->sw, sizeof(self->sw), "%s", strrchr(dir, '/') + 1);
	self->ns_fd = open(ns, O_RDONLY | O_DIRECT | O_CLOEXEC);
	ASSERT_GE(self->ns_fd, 0);
	ASSERT_TRUE(find_nvme("p2pnvme-rp", ns, sizeof(ns), dir));
	snprintf(self->rp, sizeof(self->rp), "%s", strrchr(dir, '/') + 1);
	self->peer = open(PEER_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->peer, 0) TH_LOG("open %s: %s", PEER_PATH, strerror(errno));
}

FIXTURE_TEARDOWN(ka)
{
	/* Some tests unload a test module or unbind a GPU: whatever happened, back. */
	close(self->peer);
	EXPECT_EQ(0, tm_restore(self->kept, self->unbound));
	close(self->ns_fd);
	close(self->fd);
}

static void *alloc_map(struct __test_metadata *_metadata, int fd, __u32 provider, __u64 size,
		       struct p2pdirect_alloc *a)
{
	void *p;

	memset(a, 0, sizeof(*a));
	a->provider = provider;
	a->size = size;
	EXPECT_EQ(0, ioctl(fd, P2PDIRECT_IOC_ALLOC, a));
	record_alloc_zero(fd, a);
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, a->mmap_offset);
	EXPECT_NE(MAP_FAILED, p);
	return p;
}

/* A consumer of p2pdirect's memory gets its bus addresses. */
TEST_F(ka, consumer_gets_bus_addresses)
{
	struct p2pdirect_alloc a;
	struct tm_state st;
	char *p = alloc_map(_metadata, self->fd, self->gpu.index, MiB, &a);
	char bdf[32];
	void *ram;

	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s write", (unsigned long)(p + 64 * 1024),
			 128 * 1024ull, self->sw));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1, st.attached);
	EXPECT_EQ(1, st.mapped);
	ASSERT_GE(st.segs, 1u);
	EXPECT_EQ(a.bus_addr + 64 * 1024, st.addr[0]);
	EXPECT_EQ(PAGE, st.pagesize);
	pci_name(self->gpu.pci_addr, bdf, sizeof(bdf));
	printf("# DMAADDR gpu=%s addr=%#llx len=%#llx off=%#llx\n", bdf, st.addr[0], st.len[0],
	       (unsigned long long)(a.provider_offset + 64 * 1024));
	EXPECT_EQ(-EBUSY, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "unmap"));
	EXPECT_EQ(0, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	/* The controller on a root port cannot reach the GPU; RAM is no client's. */
	EXPECT_EQ(-EREMOTEIO, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, PAGE,
				  self->rp));
	ram = aligned_alloc(PAGE, PAGE);
	ASSERT_NE(NULL, ram);
	memset(ram, 1, PAGE);
	EXPECT_EQ(-ENXIO, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)ram, PAGE,
			      self->sw));
	free(ram);
	EXPECT_EQ(-EINVAL, tm_cmd(self->peer, "acquire %lx 0 %s", (unsigned long)p, self->sw));
	/* A consumer that could not be told the memory goes away is refused. */
	EXPECT_EQ(-EINVAL, tm_cmd(self->peer, "acquire %lx %llx %s noinval", (unsigned long)p,
				  PAGE, self->sw));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(0, st.attached);
	munmap(p, MiB);
}

/*
 * FREE of the memory behind a consumer's range (@opt: its acquire's option)
 * tells the consumer (one invalidation, unmapped), and the memory is back
 * when FREE returns.
 */
static void free_under_consumer(struct __test_metadata *_metadata, int dev, int peer,
				const struct p2pdirect_provider_info *gpu, const char *sw,
				const char *opt)
{
	__u64 before = provider_used_bytes(dev, gpu->index);
	struct p2pdirect_free f;
	struct p2pdirect_alloc a;
	struct tm_state st;
	char *p = alloc_map(_metadata, dev, gpu->index, MiB, &a);

	ASSERT_EQ(0, tm_cmd(peer, "acquire %lx %llx %s%s", (unsigned long)p, MiB, sw, opt));
	ASSERT_EQ(0, tm_state(peer, &st));
	EXPECT_EQ(1, st.mapped);
	munmap(p, MiB);
	f.handle = a.handle;
	ASSERT_EQ(0, ioctl(dev, P2PDIRECT_IOC_FREE, &f));
	ASSERT_EQ(0, tm_state(peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(before, provider_used_bytes(dev, gpu->index));
}

/* FREE tells the consumer, and the memory goes back at once. */
TEST_F(ka, free_invalidates_the_consumer)
{
	struct tm_state st;

	free_under_consumer(_metadata, self->fd, self->peer, &self->gpu, self->sw, "");
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(0ull, st.pagesize);
	EXPECT_EQ(-ESTALE, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
}

/*
 * A consumer that puts its range from inside its own invalidation callback
 * (the API advises against it; RDMA drivers do it) does not hang FREE: the
 * put returns at once, the invalidation then unmaps and unpins, and the
 * memory is back when FREE returns.
 */
TEST_F(ka, put_from_the_invalidate_callback)
{
	free_under_consumer(_metadata, self->fd, self->peer, &self->gpu, self->sw, " putincb");
}

/*
 * Closing the /dev/p2pdirect file that owns the memory, and the exit of the
 * process that does, reach the consumer like FREE: told, unmapped, the
 * memory back at once.
 */
TEST_F(ka, close_and_exit_invalidate_the_consumer)
{
	__u64 before = provider_used_bytes(self->fd, self->gpu.index);
	struct p2pdirect_alloc a;
	struct tm_state st;
	int fd, status;
	pid_t pid;
	char *p;

	fd = open("/dev/p2pdirect", O_RDWR | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	p = alloc_map(_metadata, fd, self->gpu.index, MiB, &a);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, MiB, self->sw));
	/* The mapping holds the file: the memory goes with the last reference. */
	munmap(p, MiB);
	close(fd);
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-ESTALE, tm_cmd(self->peer, "map"));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));

	/* A child's memory, taken through the consumer file it inherited. */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		struct p2pdirect_alloc ca = { .provider = self->gpu.index, .size = MiB };
		int cfd = open("/dev/p2pdirect", O_RDWR);
		void *cp;

		if (cfd < 0 || ioctl(cfd, P2PDIRECT_IOC_ALLOC, &ca))
			_exit(2);
		record_alloc_zero(cfd, &ca);
		cp = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, ca.mmap_offset);
		if (cp == MAP_FAILED)
			_exit(3);
		_exit(tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)cp, MiB, self->sw) ?
		      4 : 0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(0, WEXITSTATUS(status));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(2u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
}

/*
 * Removal of the GPU reaches a consumer of its memory, and completes (the
 * consumer is told, p2pdirect unmaps and unpins); the GPU binds again.
 */
TEST_F(ka, gpu_unbind_invalidates_the_consumer)
{
	struct p2pdirect_provider_info p[8], g = { 0 };
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	struct p2pdirect_alloc a;
	struct tm_state st;
	char bdf[32];
	int back = 0;
	char *m;

	/* The last GPU listed (see last_gpu()). */
	ASSERT_EQ(0, last_gpu(self->fd, &g));
	pci_name(g.pci_addr, bdf, sizeof(bdf));
	snprintf(self->unbound, sizeof(self->unbound), "%s", bdf);
	m = alloc_map(_metadata, self->fd, g.index, MiB, &a);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)m, MiB, self->sw));
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", bdf));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-ESTALE, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	munmap(m, MiB);
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_FREE, &(struct p2pdirect_free){ .handle = a.handle }));
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", bdf));
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR)
			back = p[i].pci_addr == g.pci_addr && p[i].bytes_used == 0;
	EXPECT_TRUE(back);
}

struct unbind_gpu {
	char bdf[32];
	int ret;
};

static void *unbind_gpu_main(void *arg)
{
	struct unbind_gpu *u = arg;

	u->ret = sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", u->bdf);
	return NULL;
}

/*
 * FREE racing the GPU's removal returns only once the removal told
 * everyone: the removal first tells a consumer whose callback takes 2 s,
 * then a registration of the same memory, which is DEAD when FREE returns
 * (since ABI 1.14; before, FREE returned at once, the registration still
 * LIVE and pinning the memory). It relies on kernel consumers being told
 * before registrations (in the order they came before ABI 1.18, and the
 * consumer came first here), and on FREE starting within the callback's
 * 2 s; a FREE later than that would pass on the old module too.
 */
TEST_F(ka, free_during_gpu_unbind_returns_once_everyone_is_told)
{
	struct p2pdirect_provider_info g = { 0 };
	struct p2pdirect_register r = { .size = MiB };
	struct p2pdirect_reg_id q = { 0 };
	struct unbind_gpu u = { .ret = -1 };
	struct p2pdirect_alloc a;
	pthread_t t;
	char *m;

	ASSERT_EQ(0, last_gpu(self->fd, &g));
	pci_name(g.pci_addr, u.bdf, sizeof(u.bdf));
	snprintf(self->unbound, sizeof(self->unbound), "%s", u.bdf);
	m = alloc_map(_metadata, self->fd, g.index, MiB, &a);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s slow", (unsigned long)m, MiB,
			    self->sw));
	r.addr = (uintptr_t)m;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r));
	ASSERT_EQ(0, pthread_create(&t, NULL, unbind_gpu_main, &u));
	/* The removal is in the consumer's callback (which counts on entry). */
	ASSERT_EQ(1u, tm_wait_invalidation(self->peer));
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_FREE, &(struct p2pdirect_free){ .handle = a.handle }));
	q.id = r.id;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ((__u32)P2PDIRECT_REG_DEAD, q.state)
		TH_LOG("FREE returned before the removal told everyone");
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, u.ret);
	EXPECT_EQ(-ESTALE, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	munmap(m, MiB);
	EXPECT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", u.bdf));
}

/*
 * DEREGISTER gives the pinned bytes back at once, also while a FREE of the
 * memory is still telling other subscribers (a consumer whose callback
 * takes 2 s, told first: kernel consumers come before registrations, and
 * it came first); before ABI 1.14 the registration kept its pins
 * until the FREE reached it.
 */
TEST_F(ka, deregister_during_a_slow_free_unpins_at_once)
{
	struct p2pdirect_register r = { .size = MiB };
	struct freer f = { .ret = -1 };
	struct p2pdirect_alloc a;
	__u64 before, during;
	pthread_t t;
	char *m;

	f.fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, f.fd);
	before = pinned_bytes(self->fd, self->gpu.pci_addr);
	m = alloc_map(_metadata, f.fd, self->gpu.index, MiB, &a);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s slow", (unsigned long)m, MiB,
			    self->sw));
	r.addr = (uintptr_t)m;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &r));
	EXPECT_EQ(before + 2 * MiB, pinned_bytes(self->fd, self->gpu.pci_addr));
	f.handle = a.handle;
	ASSERT_EQ(0, pthread_create(&t, NULL, free_main, &f));
	/* The FREE is in the consumer's callback (which counts on entry). */
	ASSERT_EQ(1u, tm_wait_invalidation(self->peer));
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DEREGISTER, &(struct p2pdirect_reg_id){ .id = r.id }));
	during = pinned_bytes(self->fd, self->gpu.pci_addr);
	ASSERT_EQ(0, pthread_join(t, NULL));
	EXPECT_EQ(0, f.ret);
	EXPECT_EQ(before + MiB, during) TH_LOG("the registration's pins stayed after DEREGISTER");
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	munmap(m, MiB);
	close(f.fd);
}

/*
 * A consumer module unloaded while it holds a mapped range puts it in its
 * exit: the pins go, and FREE gives the memory back at once.
 */
TEST_F(ka, consumer_unload_releases_its_range)
{
	__u64 before = provider_used_bytes(self->fd, self->gpu.index);
	__u64 pinned = pinned_bytes(self->fd, self->gpu.pci_addr);
	struct p2pdirect_free f;
	struct p2pdirect_alloc a;
	char *p = alloc_map(_metadata, self->fd, self->gpu.index, MiB, &a);

	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, MiB, self->sw));
	self->kept = 1;
	ASSERT_EQ(0, tm_cmd(self->peer, "keep"));
	EXPECT_EQ(-EALREADY, tm_cmd(self->peer, "keep"));
	close(self->peer);
	self->peer = -1;
	EXPECT_EQ(pinned + MiB, pinned_bytes(self->fd, self->gpu.pci_addr));
	ASSERT_EQ(0, system("rmmod p2pd_importer"));
	EXPECT_EQ(pinned, pinned_bytes(self->fd, self->gpu.pci_addr));
	munmap(p, MiB);
	f.handle = a.handle;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_FREE, &f));
	EXPECT_EQ(before, provider_used_bytes(self->fd, self->gpu.index));
}

/*
 * Maps 4 pages of p2pd_client's memory through @path (left open in *@mem)
 * and runs DMA_PROBE (on /dev/p2pdirect @dev) on them for the namespace
 * open as @ns_fd: the mapping, the probe's result in *@pr.
 */
static void *probe_client_memory(struct __test_metadata *_metadata, int dev, int ns_fd,
				 const char *path, int *mem, struct p2pdirect_dma_probe *pr,
				 struct p2pdirect_dma_seg *segs)
{
	void *p;

	*mem = open(path, O_RDWR | O_CLOEXEC);
	if (*mem < 0)
		TH_LOG("open %s: %s (p2pd_client.ko loaded?)", path, strerror(errno));
	p = *mem < 0 ? MAP_FAILED :
		       mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, *mem, 0);
	if (p == MAP_FAILED)
		return p;
	memset(pr, 0, sizeof(*pr));
	pr->addr = (uintptr_t)p;
	pr->size = 4 * PAGE;
	pr->fd = ns_fd;
	pr->segs = (uintptr_t)segs;
	pr->capacity = 8;
	if (ioctl(dev, P2PDIRECT_IOC_DMA_PROBE, pr))
		TH_LOG("DMA_PROBE of %s: %s", path, strerror(errno));
	return p;
}

/*
 * Another module's client that maps its memory as PFNs (VM_IO | VM_PFNMAP,
 * as a GPU driver does) is asked too: the built-in clients decline such a
 * mapping instead of failing on it (they asked get_user_pages, which
 * refuses it: EFAULT, and the outside client was never asked).
 */
TEST_F(ka, outside_client_pfnmap)
{
	struct p2pdirect_dma_seg segs[8];
	struct p2pdirect_dma_probe pr;
	struct tm_state st;
	int mem;
	void *p = probe_client_memory(_metadata, self->fd, self->ns_fd, CLIENT_PFNMEM, &mem, &pr, segs);

	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_EXTERNAL, pr.client);
	EXPECT_GE(pr.count, 1u);
	/* A consumer in the kernel gets it from the same client. */
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, 2 * PAGE, self->sw));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1, st.mapped);
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	munmap(p, 4 * PAGE);
	close(mem);
}

/* Another module's client: its memory, its DMA mappings, its invalidation. */
TEST_F(ka, outside_client)
{
	struct p2pdirect_dma_seg segs[8];
	struct p2pdirect_dma_probe pr;
	struct p2pdirect_register rg = { 0 };
	struct p2pdirect_io io = { 0 };
	struct tm_state st;
	unsigned int claims, inval, claims0, inval0;
	char buf[64] = { 0 };
	int mem, ctl, n;
	void *p = probe_client_memory(_metadata, self->fd, self->ns_fd, CLIENT_MEM, &mem, &pr, segs);

	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_EXTERNAL, pr.client);
	EXPECT_EQ(PAGE, pr.page_size);
	EXPECT_GE(pr.count, 1u);
	/* Not P2PDMA pages: no registration, no block I/O. */
	rg.addr = (uintptr_t)p;
	rg.size = PAGE;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &rg));
	EXPECT_EQ(EOPNOTSUPP, errno);
	io.fd = self->ns_fd;
	io.addr = (uintptr_t)p;
	io.size = PAGE;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_READ, &io));
	EXPECT_EQ(EOPNOTSUPP, errno);
	/* A consumer maps it; the client's invalidation reaches it. */
	ctl = open(CLIENT_CTL, O_RDWR | O_CLOEXEC);
	ASSERT_GE(ctl, 0);
	ASSERT_GT(read(ctl, buf, sizeof(buf) - 1), 0);
	n = sscanf(buf, "claims %u invalidated %u", &claims0, &inval0);
	ASSERT_EQ(2, n);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, 2 * PAGE, self->sw));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1, st.mapped);
	EXPECT_GE(st.segs, 1u);
	ASSERT_EQ(0, tm_cmd(ctl, "invalidate"));
	memset(buf, 0, sizeof(buf));
	ASSERT_GT(read(ctl, buf, sizeof(buf) - 1), 0);
	n = sscanf(buf, "claims %u invalidated %u", &claims, &inval);
	ASSERT_EQ(2, n);
	/* One claim made and invalidated, the consumer's. */
	EXPECT_EQ(claims0 + 1, claims);
	EXPECT_EQ(inval0 + 1, inval);
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-ESTALE, tm_cmd(self->peer, "map"));
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	close(ctl);
	munmap(p, 4 * PAGE);
	close(mem);
}

/* The claims p2pd_client made so far (-1 if ctl cannot be read). */
static int client_claims(void)
{
	char buf[64] = { 0 };
	unsigned int claims, inval;
	int ctl = open(CLIENT_CTL, O_RDONLY | O_CLOEXEC), n = 0;

	if (ctl >= 0 && read(ctl, buf, sizeof(buf) - 1) > 0)
		n = sscanf(buf, "claims %u invalidated %u", &claims, &inval);
	if (ctl >= 0)
		close(ctl);
	return n == 2 ? (int)claims : -1;
}

/*
 * Another module's client maps the whole pages a range touches (OFED's
 * contract; nvidia-peermem's are 64 KiB GPU pages). DMA_PROBE, like
 * p2pdirect_peer_dma_map(), gives the range's bytes only, as OFED's core
 * trims the entries: a range from 100 bytes into the client's first page
 * to 300 bytes before the end of its third gets segments of exactly its
 * size, the first starting 100 bytes into the first page (whose bus
 * address DMA_PROBE of the whole pages gives). Before, the client's whole
 * pages: 3 pages from the first page's start.
 */
TEST_F(ka, outside_client_segments_cover_the_range_only)
{
	struct p2pdirect_dma_seg segs[8], whole[8];
	struct p2pdirect_dma_probe pr, pw;
	__u64 total = 0;
	int mem;
	void *p = probe_client_memory(_metadata, self->fd, self->ns_fd, CLIENT_MEM, &mem, &pw, whole);

	ASSERT_NE(MAP_FAILED, p);
	ASSERT_EQ((__u32)P2PDIRECT_CLIENT_EXTERNAL, pw.client);
	ASSERT_GE(pw.count, 1u);
	memset(&pr, 0, sizeof(pr));
	pr.addr = (uintptr_t)p + 100;
	pr.size = 3 * PAGE - 400;
	pr.fd = self->ns_fd;
	pr.segs = (uintptr_t)segs;
	pr.capacity = 8;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DMA_PROBE, &pr)) TH_LOG("%s", strerror(errno));
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_EXTERNAL, pr.client);
	ASSERT_GE(pr.count, 1u);
	ASSERT_LE(pr.count, 8u);
	for (unsigned int i = 0; i < pr.count; i++)
		total += segs[i].len;
	EXPECT_EQ(3 * PAGE - 400, total);
	EXPECT_EQ(whole[0].addr + 100, segs[0].addr);
	munmap(p, 4 * PAGE);
	close(mem);
}

/*
 * max_pinned_mib bounds every pin a user's call makes, of another module's
 * memory too: a DMA_PROBE one page over it is refused (EDQUOT) before the
 * client is asked for the pages; one of exactly the cap is mapped. Before,
 * another module's memory was pinned and mapped whatever its size.
 */
TEST_F(ka, outside_client_probe_bounded_by_pin_cap)
{
	struct p2pdirect_dma_probe pr = { 0 };
	int mem = open(CLIENT_BIGMEM, O_RDWR | O_CLOEXEC), claims;
	void *p;

	ASSERT_GE(mem, 0) TH_LOG("open %s: %s (p2pd_client.ko loaded?)", CLIENT_BIGMEM,
				 strerror(errno));
	p = mmap(NULL, PIN_CAP + PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
	ASSERT_NE(MAP_FAILED, p);
	claims = client_claims();
	ASSERT_GE(claims, 0);
	pr.addr = (uintptr_t)p;
	pr.size = PIN_CAP + PAGE;
	pr.fd = self->ns_fd;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_DMA_PROBE, &pr));
	EXPECT_EQ(EDQUOT, errno);
	EXPECT_EQ(claims, client_claims());
	/* The cap itself is allowed: the client pins and maps it. */
	memset(&pr, 0, sizeof(pr));
	pr.addr = (uintptr_t)p + PAGE;
	pr.size = PIN_CAP;
	pr.fd = self->ns_fd;
	EXPECT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_DMA_PROBE, &pr)) TH_LOG("%s", strerror(errno));
	EXPECT_EQ((__u32)P2PDIRECT_CLIENT_EXTERNAL, pr.client);
	EXPECT_GE(pr.count, 1u);
	EXPECT_EQ(claims + 1, client_claims());
	munmap(p, PIN_CAP + PAGE);
	close(mem);
}

struct inval_loop {
	int ctl, stop;
	unsigned int n;
};

static void *inval_main(void *arg)
{
	struct inval_loop *l = arg;

	while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE))
		if (!tm_cmd(l->ctl, "invalidate"))
			l->n++;
	return NULL;
}

/*
 * A consumer acquiring, mapping and releasing while the client invalidates
 * its claims over and over: each acquire either maps or finds its claim
 * already invalidated (ESTALE), each release returns, nothing is left held
 * (and the debug kernel sees no race: KASAN, lockdep).
 */
TEST_F(ka, release_races_the_client_invalidation)
{
	struct inval_loop l = { 0 };
	unsigned int ok = 0, stale = 0;
	struct tm_state st;
	pthread_t t;
	int mem, r, acquired;
	void *p;

	mem = open(CLIENT_MEM, O_RDWR | O_CLOEXEC);
	ASSERT_GE(mem, 0);
	p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
	ASSERT_NE(MAP_FAILED, p);
	l.ctl = open(CLIENT_CTL, O_RDWR | O_CLOEXEC);
	ASSERT_GE(l.ctl, 0);
	ASSERT_EQ(0, pthread_create(&t, NULL, inval_main, &l));
	for (int i = 0; i < 300; i++) {
		r = tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, 2 * PAGE, self->sw);
		if (!r)
			ok++;
		else if (r == -ESTALE)
			stale++;
		else
			EXPECT_EQ(0, r);
		/* Held (maybe invalidated meanwhile) after a success, gone after ESTALE. */
		acquired = !r;
		r = tm_cmd(self->peer, "release");
		EXPECT_EQ(acquired ? 0 : -ENOTCONN, r) TH_LOG("release: %s", strerror(-r));
	}
	__atomic_store_n(&l.stop, 1, __ATOMIC_RELEASE);
	ASSERT_EQ(0, pthread_join(t, NULL));
	printf("# %u acquires mapped, %u found their claim invalidated, %u invalidations\n", ok,
	       stale, l.n);
	EXPECT_GT(ok, 0u);
	EXPECT_GT(l.n, 0u);
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(0, st.attached);
	close(l.ctl);
	munmap(p, 4 * PAGE);
	close(mem);
}

/* Unloading the client invalidates what consumers keep; it loads again. */
TEST_F(ka, client_unload_invalidates)
{
	struct tm_state st;
	int mem;
	void *p;

	mem = open(CLIENT_MEM, O_RDWR | O_CLOEXEC);
	ASSERT_GE(mem, 0);
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
	ASSERT_NE(MAP_FAILED, p);
	close(mem);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, PAGE, self->sw));
	/* The mapping holds the module's debugfs file, and so the module. */
	munmap(p, PAGE);
	ASSERT_EQ(0, system("rmmod p2pd_client"));
	ASSERT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	ASSERT_EQ(0, system("insmod /p2pd_client.ko"));
}

/*
 * A client that invalidates after it unregistered (a driver freeing its
 * memory in remove after the unregister call) gets EINVAL, and nothing of
 * the gone client is touched (the debug kernel's KASAN would see it); the
 * unregister invalidated what the consumer kept. Also once the client has
 * registered again: the new registration, whose client may sit where the
 * old one did, has a handle of its own.
 */
static int stale_result(int ctl)
{
	unsigned int claims, inval;
	char buf[96] = "";
	int n, stale;

	if (tm_cmd(ctl, "invalidate-stale") || read(ctl, buf, sizeof(buf) - 1) <= 0)
		return 1;
	n = sscanf(buf, "claims %u invalidated %u stale %d", &claims, &inval, &stale);
	return n == 3 ? stale : 1;
}

TEST_F(ka, client_invalidate_after_unregister_is_refused)
{
	struct tm_state st;
	int mem, ctl;
	void *p;

	mem = open(CLIENT_MEM, O_RDWR | O_CLOEXEC);
	ASSERT_GE(mem, 0);
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
	ASSERT_NE(MAP_FAILED, p);
	ASSERT_EQ(0, tm_cmd(self->peer, "acquire %lx %llx %s", (unsigned long)p, PAGE, self->sw));
	ctl = open(CLIENT_CTL, O_RDWR | O_CLOEXEC);
	ASSERT_GE(ctl, 0);
	EXPECT_EQ(-EBUSY, tm_cmd(ctl, "invalidate-stale"));
	ASSERT_EQ(0, tm_cmd(ctl, "unregister"));
	/* Until the client is registered again: no ASSERT. */
	EXPECT_EQ(0, tm_state(self->peer, &st));
	EXPECT_EQ(1u, st.invalidations);
	EXPECT_EQ(0, st.mapped);
	EXPECT_EQ(-EINVAL, stale_result(ctl)) TH_LOG("the invalidation function with a gone handle");
	EXPECT_EQ(0, tm_cmd(ctl, "register"));
	EXPECT_EQ(-EINVAL, stale_result(ctl))
		TH_LOG("the gone handle after the client registered again");
	EXPECT_EQ(0, tm_cmd(self->peer, "release"));
	close(ctl);
	munmap(p, PAGE);
	close(mem);
}

TEST_HARNESS_MAIN
