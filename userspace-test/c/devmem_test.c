// SPDX-License-Identifier: GPL-2.0
/*
 * Device-memory tests of /dev/p2pdirect (kselftest harness, TAP on stdout):
 * providers, ALLOC/FREE, mmap of device memory, lifetime, bad input.
 *
 * Lines "# HOSTCHECK gpu=BDF off=N len=N seed=N guard=N" tell the host what
 * the test wrote where: after the VM powers off, the host finds the pattern at
 * that offset of the emulated GPU's backing file and zeros in the guard bytes
 * on both sides (ci/hostcheck.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
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

#define DEV_PATH "/dev/p2pdirect"
#define KiB (1ull << 10)
#define MiB (1ull << 20)

static int list(int fd, struct p2pdirect_provider_info *p, unsigned int cap)
{
	struct p2pdirect_list_providers req = {
		.entries = (uintptr_t)p, .capacity = cap,
	};

	if (ioctl(fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return -errno;
	return req.count;
}

static int do_alloc(int fd, __u32 provider, __u64 size, __u64 align, struct p2pdirect_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->provider = provider;
	a->size = size;
	a->alignment = align;
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

static void *map(int fd, struct p2pdirect_alloc *a)
{
	return mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, a->mmap_offset);
}

/*
 * Whether the PCI function at @client hangs below the same switch upstream
 * port as the one at @provider (the grandparent of @provider in sysfs): the
 * P2P-reachable part of the test VM's topology.
 */
static int same_switch(__u32 provider, __u32 client)
{
	char name[32], link[96], up[PATH_MAX], path[PATH_MAX];
	size_t n;

	for (int i = 0; i < 2; i++) {
		pci_name(i ? client : provider, name, sizeof(name));
		snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s", name);
		if (!realpath(link, i ? path : up))
			return 0;
	}
	for (int i = 0; i < 2; i++)
		*strrchr(up, '/') = 0;
	n = strlen(up);
	return !strncmp(path, up, n) && path[n] == '/';
}

/* The serial number of the NVMe controller at a PCI address, or "". */
static void nvme_serial(__u32 addr, char *buf, size_t len)
{
	char name[32], pattern[128];
	glob_t g;
	FILE *f;

	buf[0] = 0;
	pci_name(addr, name, sizeof(name));
	snprintf(pattern, sizeof(pattern), "/sys/bus/pci/devices/%s/nvme/nvme*/serial", name);
	if (glob(pattern, 0, NULL, &g) || g.gl_pathc < 1)
		return;
	f = fopen(g.gl_pathv[0], "r");
	if (f) {
		if (fgets(buf, len, f))
			buf[strcspn(buf, "\n ")] = 0;
		fclose(f);
	}
	globfree(&g);
}

static void fill(__u8 *p, __u64 len, __u32 seed)
{
	for (__u64 i = 0; i < len; i++)
		p[i] = pattern_byte(i, seed);
}

static __u64 mismatches(__u8 *p, __u64 len, __u32 seed)
{
	__u64 bad = 0;

	for (__u64 i = 0; i < len; i++)
		bad += p[i] != pattern_byte(i, seed);
	return bad;
}

static void hostcheck(struct p2pdirect_provider_info *p, __u64 off, __u64 len, __u32 seed,
		      __u64 guard)
{
	char name[32];

	pci_name(p->pci_addr, name, sizeof(name));
	printf("# HOSTCHECK gpu=%s off=%llu len=%llu seed=%u guard=%llu\n", name,
	       (unsigned long long)off, (unsigned long long)len, seed,
	       (unsigned long long)guard);
	fflush(stdout);
}

FIXTURE(dm) {
	int fd;
	int n;
	struct p2pdirect_provider_info p[8];
	/* The two emulated GPUs (kind BAR) and the NVMe CMB (kind PUBLISHED). */
	struct p2pdirect_provider_info *gpu[2], *cmb;
};

static struct p2pdirect_provider_info *by_addr(struct p2pdirect_provider_info *p, int n,
					      __u32 addr)
{
	for (int i = 0; i < n; i++)
		if (p[i].pci_addr == addr)
			return &p[i];
	return NULL;
}

FIXTURE_SETUP(dm)
{
	self->fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->fd, 0) TH_LOG("open %s: %s", DEV_PATH, strerror(errno));
	self->n = list(self->fd, self->p, 8);
	ASSERT_GE(self->n, 2) TH_LOG("need two emulated GPUs, found %d", self->n);
	for (int i = 0, g = 0; i < self->n; i++) {
		if (self->p[i].kind == P2PDIRECT_PROVIDER_BAR && g < 2)
			self->gpu[g++] = &self->p[i];
		else if (self->p[i].kind == P2PDIRECT_PROVIDER_PUBLISHED)
			self->cmb = &self->p[i];
	}
	ASSERT_NE(NULL, self->gpu[1]) TH_LOG("need two emulated GPUs");
}

FIXTURE_TEARDOWN(dm)
{
	close(self->fd);
}

/* Each provider: a 64 MiB BAR, all free, and the right reachability. */
TEST_F(dm, providers_and_reachability)
{
	for (int i = 0; i < self->n; i++) {
		struct p2pdirect_provider_info *p = &self->p[i];
		int sw = 0, rp = 0;
		char name[32];

		if (p->kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		pci_name(p->pci_addr, name, sizeof(name));
		TH_LOG("provider %u: %s BAR%u %llu MiB bus %#llx, %u NVMe", p->index, name,
		       p->bar, (unsigned long long)(p->bar_size >> 20),
		       (unsigned long long)p->bus_addr, p->num_clients);
		EXPECT_EQ((__u32)P2PDIRECT_PROVIDER_BAR, p->kind);
		EXPECT_EQ(2u, p->bar);
		EXPECT_EQ(64 * MiB, p->bar_size);
		EXPECT_EQ(p->bar_size, p->bytes_total);
		EXPECT_EQ(p->bytes_total, p->bytes_free);
		EXPECT_EQ(0u, p->bytes_used);
		EXPECT_NE(0u, p->bus_addr);
		EXPECT_EQ(0u, p->pad);
		/* Every NVMe controller of the VM (ci/vm.sh): four behind the switch, two not. */
		ASSERT_EQ(6u, p->num_clients);
		for (unsigned int c = 0; c < p->num_clients; c++) {
			char serial[64], cname[32];

			nvme_serial(p->clients[c].pci_addr, serial, sizeof(serial));
			pci_name(p->clients[c].pci_addr, cname, sizeof(cname));
			TH_LOG("  -> nvme %s (%s): distance %d", cname, serial,
			       p->clients[c].distance);
			if (same_switch(p->pci_addr, p->clients[c].pci_addr)) {
				sw++;
				EXPECT_GE(p->clients[c].distance, 0);
			} else {
				rp++;
				EXPECT_EQ(-1, p->clients[c].distance);
			}
		}
		EXPECT_EQ(4, sw);
		EXPECT_EQ(2, rp);
	}
}

TEST_F(dm, list_count_only_and_efault)
{
	struct p2pdirect_list_providers req = { 0 };

	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	EXPECT_EQ(self->n, (int)req.count);
	req.entries = 8;
	req.capacity = 1;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	EXPECT_EQ(EFAULT, errno);
}

/* Entries past @capacity are not written: the caller's array beyond it stays. */
TEST_F(dm, list_leaves_entries_past_capacity)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 1 };
	size_t i = sizeof(p[0]);

	ASSERT_GE(self->n, 2);
	memset(p, 0xa5, sizeof(p));
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req));
	EXPECT_EQ(self->n, (int)req.count);
	EXPECT_EQ(self->p[0].index, p[0].index);
	while (i < sizeof(p) && ((unsigned char *)p)[i] == 0xa5)
		i++;
	EXPECT_EQ(sizeof(p), i) TH_LOG("byte %zu past the first entry written", i);
	/* The entry written has nothing left of the 0xa5 bytes: pad and unused clients zeroed. */
	EXPECT_EQ(0u, p[0].pad);
	ASSERT_LE(p[0].num_clients, (__u32)P2PDIRECT_MAX_CLIENTS);
	for (i = p[0].num_clients * sizeof(p[0].clients[0]); i < sizeof(p[0].clients); i++)
		if (((unsigned char *)p[0].clients)[i])
			break;
	EXPECT_EQ(sizeof(p[0].clients), i) TH_LOG("byte %zu of the unused clients written", i);
}

/*
 * What the header documents of mmap() and the open mode (the kernel's own
 * rule, which p2pdirect's mmap relies on): a file opened O_WRONLY may
 * ALLOC, but a shared read-write mapping of it is refused with EACCES.
 */
TEST_F(dm, mmap_of_a_write_only_file)
{
	struct p2pdirect_alloc a;
	int wo = open(DEV_PATH, O_WRONLY | O_CLOEXEC);

	ASSERT_GE(wo, 0);
	ASSERT_EQ(0, do_alloc(wo, self->gpu[0]->index, 4096, 0, &a));
	EXPECT_EQ(MAP_FAILED, map(wo, &a));
	EXPECT_EQ(EACCES, errno);
	EXPECT_EQ(0, do_free(wo, a.handle));
	close(wo);
}

/*
 * CPU stores through the device pointer land in the BAR (checked from the
 * host after the run, unless a later test's ALLOC zeroes the range first:
 * exhaustion_and_recovery takes the whole BAR, and then the host reports
 * the record as superseded, a SKIP).
 */
TEST_F(dm, cpu_pattern_reaches_bar)
{
	struct p2pdirect_alloc filler, lo, target, hi;
	struct p2pdirect_provider_info *p = self->gpu[0];
	__u8 *m;

	/* Deep in the BAR: 48 MiB in. */
	ASSERT_EQ(0, do_alloc(self->fd, p->index, 48 * MiB, 0, &filler));
	ASSERT_EQ(0, do_alloc(self->fd, p->index, 64 * KiB, 0, &lo));
	ASSERT_EQ(0, do_alloc(self->fd, p->index, 256 * KiB, 0, &target));
	ASSERT_EQ(0, do_alloc(self->fd, p->index, 64 * KiB, 0, &hi));
	ASSERT_EQ(lo.provider_offset + lo.size, target.provider_offset);
	ASSERT_EQ(target.provider_offset + target.size, hi.provider_offset);
	EXPECT_EQ(p->bus_addr + target.provider_offset, target.bus_addr);

	m = map(self->fd, &target);
	ASSERT_NE(MAP_FAILED, m) TH_LOG("mmap: %s", strerror(errno));
	fill(m, target.size, 0x5a);
	EXPECT_EQ(0u, mismatches(m, target.size, 0x5a));
	hostcheck(p, target.provider_offset, target.size, 0x5a, 64 * KiB);
	ASSERT_EQ(0, munmap(m, target.size));
	EXPECT_EQ(0, do_free(self->fd, target.handle));
}

/* Both GPUs at once, each with its own data. */
TEST_F(dm, two_gpus_at_once)
{
	struct p2pdirect_alloc a[2], filler[2];
	__u8 *m[2];

	for (int g = 0; g < 2; g++) {
		ASSERT_EQ(0, do_alloc(self->fd, self->gpu[g]->index, 40 * MiB, 0, &filler[g]));
		ASSERT_EQ(0, do_alloc(self->fd, self->gpu[g]->index, 1 * MiB, 0, &a[g]));
		m[g] = map(self->fd, &a[g]);
		ASSERT_NE(MAP_FAILED, m[g]);
	}
	fill(m[0], a[0].size, 0x11);
	fill(m[1], a[1].size, 0x22);
	EXPECT_EQ(0u, mismatches(m[0], a[0].size, 0x11));
	EXPECT_EQ(0u, mismatches(m[1], a[1].size, 0x22));
	hostcheck(self->gpu[0], a[0].provider_offset, a[0].size, 0x11, 0);
	hostcheck(self->gpu[1], a[1].provider_offset, a[1].size, 0x22, 0);
}

TEST_F(dm, alignment_is_honoured)
{
	struct p2pdirect_alloc small, big;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 4096, 0, &small));
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 4096, 8 * MiB, &big));
	EXPECT_EQ(0u, big.provider_offset % (8 * MiB));
	EXPECT_EQ(0u, big.bus_addr % (8 * MiB));
	EXPECT_NE(small.provider_offset, big.provider_offset);
	/* Sizes round up to whole pages. */
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 1, 0, &small));
	EXPECT_EQ((__u64)getpagesize(), small.size);
}

TEST_F(dm, exhaustion_and_recovery)
{
	struct p2pdirect_alloc a[64], extra;
	struct p2pdirect_provider_info now[8];
	int n = 0;

	/* 4 MiB chunks until the 64 MiB BAR is full. */
	while (n < 64 && !do_alloc(self->fd, self->gpu[0]->index, 4 * MiB, 0, &a[n]))
		n++;
	EXPECT_EQ(16, n);
	EXPECT_EQ(-ENOMEM, do_alloc(self->fd, self->gpu[0]->index, 4096, 0, &extra));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(0u, by_addr(now, self->n, self->gpu[0]->pci_addr)->bytes_free);
	EXPECT_EQ(64 * MiB, by_addr(now, self->n, self->gpu[0]->pci_addr)->bytes_used);
	/* The other GPU is untouched. */
	EXPECT_EQ(0u, by_addr(now, self->n, self->gpu[1]->pci_addr)->bytes_used);
	/* Free one in the middle: exactly that hole can be reused. */
	ASSERT_EQ(0, do_free(self->fd, a[5].handle));
	EXPECT_EQ(-ENOMEM, do_alloc(self->fd, self->gpu[0]->index, 4 * MiB + 4096, 0, &extra));
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 4 * MiB, 0, &extra));
	EXPECT_EQ(a[5].provider_offset, extra.provider_offset);
	a[5] = extra;
	for (int i = 0; i < n; i++)
		EXPECT_EQ(0, do_free(self->fd, a[i].handle));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(0u, by_addr(now, self->n, self->gpu[0]->pci_addr)->bytes_used);
	/* And the whole BAR in one piece. */
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 64 * MiB, 0, &extra));
	EXPECT_EQ(0, do_free(self->fd, extra.handle));
}

/* Close frees everything the file allocated, mapped or not. */
TEST_F(dm, close_frees_everything)
{
	struct p2pdirect_provider_info now[8];
	struct p2pdirect_alloc a;
	int fd2 = open(DEV_PATH, O_RDWR);
	void *m;

	ASSERT_GE(fd2, 0);
	for (int g = 0; g < 2; g++)
		ASSERT_EQ(0, do_alloc(fd2, self->gpu[g]->index, 8 * MiB, 0, &a));
	m = map(fd2, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, munmap(m, a.size));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(8 * MiB, by_addr(now, self->n, self->gpu[0]->pci_addr)->bytes_used);
	EXPECT_EQ(8 * MiB, by_addr(now, self->n, self->gpu[1]->pci_addr)->bytes_used);
	ASSERT_EQ(0, close(fd2));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	for (int g = 0; g < self->n; g++)
		EXPECT_EQ(0u, now[g].bytes_used);
}

/* A mapping keeps the file's memory alive after close; munmap then frees it. */
TEST_F(dm, mapping_outlives_close)
{
	struct p2pdirect_provider_info now[8];
	struct p2pdirect_alloc a;
	int fd2 = open(DEV_PATH, O_RDWR);
	__u8 *m;

	ASSERT_GE(fd2, 0);
	ASSERT_EQ(0, do_alloc(fd2, self->gpu[1]->index, 2 * MiB, 0, &a));
	m = map(fd2, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ(0, close(fd2));
	fill(m, 4096, 0x33);
	EXPECT_EQ(0u, mismatches(m, 4096, 0x33));
	hostcheck(self->gpu[1], a.provider_offset, 4096, 0x33, 0);
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(2 * MiB, by_addr(now, self->n, self->gpu[1]->pci_addr)->bytes_used);
	ASSERT_EQ(0, munmap(m, a.size));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(0u, by_addr(now, self->n, self->gpu[1]->pci_addr)->bytes_used);
}

static sigjmp_buf fault_jmp;

static void on_fault(int sig)
{
	siglongjmp(fault_jmp, sig);
}

/*
 * FREE while mapped takes the memory away: the mapping is zapped and a later
 * access gets SIGBUS, as gdrdrv does; the memory is free again.
 */
TEST_F(dm, free_while_mapped_revokes_mapping)
{
	struct p2pdirect_provider_info now[8];
	struct p2pdirect_alloc a;
	__u8 *m;
	int sig;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 1 * MiB, 0, &a));
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	(void)__atomic_load_n(&m[0], __ATOMIC_RELAXED);
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	signal(SIGBUS, on_fault);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig) {
		(void)__atomic_load_n(&m[4096], __ATOMIC_RELAXED);
		sig = -1;
	}
	signal(SIGBUS, SIG_DFL);
	EXPECT_EQ(SIGBUS, sig);
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(0u, by_addr(now, self->n, self->gpu[0]->pci_addr)->bytes_used);
	EXPECT_EQ(0, munmap(m, a.size));
	EXPECT_EQ(-ENOENT, do_free(self->fd, a.handle));
}

/* fork: the child does not inherit the device-memory mapping. */
TEST_F(dm, fork_child_has_no_mapping)
{
	struct p2pdirect_alloc a;
	__u8 *m;
	int status;
	pid_t pid;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 64 * KiB, 0, &a));
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	m[0] = 0x44;
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int sig;

		signal(SIGSEGV, on_fault);
		signal(SIGBUS, on_fault);
		sig = sigsetjmp(fault_jmp, 1);
		if (sig)
			_exit(sig);
		(void)__atomic_load_n(&m[0], __ATOMIC_RELAXED);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(SIGSEGV, WEXITSTATUS(status));
	/* The parent still has it. */
	EXPECT_EQ(0x44, m[0]);
	hostcheck(self->gpu[0], a.provider_offset, 1, 0x44, 0);
	munmap(m, a.size);
}

/*
 * MADV_DOFORK cannot give a child the mapping: the kernel refuses it for a
 * special mapping (VM_MIXEDMAP) with EINVAL, and the mapping is unchanged.
 */
TEST_F(dm, madv_dofork_is_refused)
{
	struct p2pdirect_alloc a;
	__u8 *m;

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 64 * KiB, 0, &a));
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	errno = 0;
	EXPECT_EQ(-1, madvise(m, a.size, MADV_DOFORK));
	EXPECT_EQ(EINVAL, errno);
	m[0] = 0x21;
	EXPECT_EQ(0x21, m[0]);
	m[0] = 0;
	munmap(m, a.size);
	EXPECT_EQ(0, do_free(self->fd, a.handle));
}

TEST_F(dm, bad_alloc_input)
{
	struct p2pdirect_alloc a;

	EXPECT_EQ(-EINVAL, do_alloc(self->fd, self->gpu[0]->index, 0, 0, &a));
	EXPECT_EQ(-ENOMEM, do_alloc(self->fd, self->gpu[0]->index, 64 * MiB + 4096, 0, &a));
	EXPECT_EQ(-ENOMEM, do_alloc(self->fd, self->gpu[0]->index, ~0ull, 0, &a));
	EXPECT_EQ(-EINVAL, do_alloc(self->fd, self->gpu[0]->index, 4096, 3, &a));
	EXPECT_EQ(-EINVAL, do_alloc(self->fd, self->gpu[0]->index, 4096, 3 * MiB, &a));
	EXPECT_EQ(-ENODEV, do_alloc(self->fd, 12345, 4096, 0, &a));
	/* What is wrong in the argument itself comes before what it names. */
	EXPECT_EQ(-EINVAL, do_alloc(self->fd, 12345, 0, 0, &a));
	EXPECT_EQ(-EINVAL, do_alloc(self->fd, 12345, 4096, 3, &a));
	memset(&a, 0, sizeof(a));
	a.provider = 12345;
	a.size = 4096;
	a.flags = 1;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_ALLOC, &a));
	EXPECT_EQ(EINVAL, errno);
	memset(&a, 0, sizeof(a));
	a.provider = self->gpu[0]->index;
	a.size = 4096;
	a.flags = 1;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_ALLOC, &a));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_ALLOC, (void *)8));
	EXPECT_EQ(EFAULT, errno);
}

TEST_F(dm, bad_free_input)
{
	struct p2pdirect_alloc a;
	int fd2 = open(DEV_PATH, O_RDWR);

	ASSERT_GE(fd2, 0);
	EXPECT_EQ(-ENOENT, do_free(self->fd, 999999));
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 4096, 0, &a));
	/* Another file's handle. */
	EXPECT_EQ(-ENOENT, do_free(fd2, a.handle));
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	/* Double free. */
	EXPECT_EQ(-ENOENT, do_free(self->fd, a.handle));
	close(fd2);
}

TEST_F(dm, bad_mmap_input)
{
	struct p2pdirect_alloc a, b;
	int fd2 = open(DEV_PATH, O_RDWR);
	void *m;

	ASSERT_GE(fd2, 0);
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[0]->index, 1 * MiB, 0, &a));
	ASSERT_EQ(0, do_alloc(fd2, self->gpu[0]->index, 1 * MiB, 0, &b));
	/* Wrong size, both ways. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size / 2, PROT_READ | PROT_WRITE, MAP_SHARED,
				   self->fd, a.mmap_offset));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size * 2, PROT_READ | PROT_WRITE, MAP_SHARED,
				   self->fd, a.mmap_offset));
	EXPECT_EQ(EINVAL, errno);
	/* Wrong offset: none, and one inside the allocation. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size, PROT_READ, MAP_SHARED, self->fd, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 4096, PROT_READ, MAP_SHARED, self->fd,
				   a.mmap_offset + 4096));
	EXPECT_EQ(EINVAL, errno);
	/* Private mapping. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, self->fd,
				   a.mmap_offset));
	EXPECT_EQ(EINVAL, errno);
	/* Executable. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size, PROT_READ | PROT_EXEC, MAP_SHARED, self->fd,
				   a.mmap_offset));
	EXPECT_EQ(EPERM, errno);
	/* Another file's allocation. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, b.size, PROT_READ, MAP_SHARED, self->fd, b.mmap_offset));
	EXPECT_EQ(EINVAL, errno);
	/* A good mapping cannot be made executable or grown afterwards. */
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	EXPECT_EQ(-1, mprotect(m, a.size, PROT_READ | PROT_EXEC));
	EXPECT_EQ(EACCES, errno);
	EXPECT_EQ(MAP_FAILED, mremap(m, a.size, a.size * 2, MREMAP_MAYMOVE));
	EXPECT_EQ(EFAULT, errno);
	munmap(m, a.size);
	close(fd2);
}

/* Opens namespace 1 of the NVMe controller with serial @serial, O_DIRECT. */
static int open_nvme(const char *serial)
{
	char ns[64];

	return find_nvme(serial, ns, sizeof(ns), NULL) ? open(ns, O_RDWR | O_DIRECT) : -1;
}

/*
 * The mapping holds real P2PDMA pages: O_DIRECT from the NVMe behind the
 * switch into it pins them with FOLL_PCI_P2PDMA and the controller DMAs into
 * the BAR.
 */
TEST_F(dm, odirect_read_into_device_memory)
{
	struct p2pdirect_alloc a;
	__u8 *m;
	__u8 *ram;
	int nfd = open_nvme("p2pnvme-sw");

	ASSERT_GE(nfd, 0) TH_LOG("open the namespace of p2pnvme-sw: %s", strerror(errno));

	/* Known data on the namespace, written from RAM. */
	ASSERT_EQ(0, posix_memalign((void **)&ram, 4096, 1 * MiB));
	fill(ram, 1 * MiB, 0x77);
	ASSERT_EQ((ssize_t)MiB, pwrite(nfd, ram, MiB, 16 * MiB));

	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[1]->index, 52 * MiB, 0, &a));
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[1]->index, 1 * MiB, 0, &a));
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	ASSERT_EQ((ssize_t)MiB, pread(nfd, m, MiB, 16 * MiB))
		TH_LOG("O_DIRECT pread into device memory: %s", strerror(errno));
	EXPECT_EQ(0u, mismatches(m, MiB, 0x77));
	hostcheck(self->gpu[1], a.provider_offset, MiB, 0x77, 0);
	munmap(m, a.size);
	free(ram);
	close(nfd);
}

/* How many times the PCI function @name is enabled (sysfs enable), or -1. */
static int enable_count(const char *name)
{
	char path[96];

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/enable", name);
	return file_number(path, "%ld");
}

/*
 * The device goes away while its memory is allocated and mapped: the mapping
 * is revoked (access gets SIGBUS), FREE still works, and the device comes
 * back as a new provider with all its memory free. The driver disables the
 * function it enabled: the unbound function's enable count is 0, and a bind
 * makes it 1 again (it used to grow by one per unbind and bind). Runs last:
 * it renumbers.
 */
TEST_F(dm, z_device_removal_revokes_mappings)
{
	struct p2pdirect_register reg = { 0 };
	struct p2pdirect_reg_id q = { 0 };
	struct p2pdirect_provider_info now[8];
	struct p2pdirect_alloc a;
	char name[32];
	__u8 *m;
	int sig;

	pci_name(self->gpu[1]->pci_addr, name, sizeof(name));
	ASSERT_EQ(0, do_alloc(self->fd, self->gpu[1]->index, 2 * MiB, 0, &a));
	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	(void)__atomic_load_n(&m[0], __ATOMIC_RELAXED);
	reg.addr = (uintptr_t)m;
	reg.size = a.size;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REGISTER, &reg));
	EXPECT_EQ(1, enable_count(name));
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/unbind", name))
		TH_LOG("unbind %s: %s", name, strerror(errno));
	EXPECT_EQ(self->n - 1, list(self->fd, now, 8));
	EXPECT_EQ(0, enable_count(name)) TH_LOG("the unbound GPU is still enabled");

	signal(SIGBUS, on_fault);
	signal(SIGSEGV, on_fault);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig) {
		(void)__atomic_load_n(&m[0], __ATOMIC_RELAXED);
		sig = -1;
	}
	EXPECT_EQ(SIGBUS, sig) TH_LOG("access after removal: signal %d", sig);
	signal(SIGBUS, SIG_DFL);
	signal(SIGSEGV, SIG_DFL);
	/* The registration on it was invalidated. */
	q.id = reg.id;
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_REG_QUERY, &q));
	EXPECT_EQ((__u32)P2PDIRECT_REG_DEAD, q.state);
	/* The allocation is revoked: no new mapping of it until it is freed. */
	errno = 0;
	EXPECT_EQ(MAP_FAILED, mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd,
				   a.mmap_offset));
	EXPECT_EQ(ENODEV, errno);

	EXPECT_EQ(0, do_free(self->fd, a.handle));
	EXPECT_EQ(-ENODEV, do_alloc(self->fd, self->gpu[1]->index, 4096, 0, &a));
	munmap(m, 2 * MiB);

	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/drivers/p2pdirect/bind", name))
		TH_LOG("bind %s: %s", name, strerror(errno));
	EXPECT_EQ(1, enable_count(name));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	for (int i = 0; i < self->n; i++) {
		if (now[i].kind == P2PDIRECT_PROVIDER_BAR)
			EXPECT_EQ(64 * MiB, now[i].bytes_total);
		EXPECT_EQ(0u, now[i].bytes_used);
	}
}

/*
 * The NVMe behind the switch publishes its CMB as P2PDMA memory: p2pdirect
 * lists it as a second kind of provider and allocates from it.
 */
TEST_F(dm, published_cmb_provider)
{
	struct p2pdirect_provider_info now[8], *c = self->cmb;
	struct p2pdirect_alloc a;
	char serial[64];
	__u8 *m, *ram;
	int nfd;

	ASSERT_NE(NULL, c) TH_LOG("no PUBLISHED provider (the NVMe CMB) listed");
	nvme_serial(c->pci_addr, serial, sizeof(serial));
	EXPECT_STREQ("p2pnvme-sw", serial);
	EXPECT_GE(c->bar_size, 16 * MiB);
	for (unsigned int i = 0; i < c->num_clients; i++) {
		__u32 at = c->clients[i].pci_addr;
		int d = c->clients[i].distance;
		/*
		 * Distance 0 to itself, positive to the other controllers below the
		 * switch; the ones on root ports cannot reach it (-1).
		 */
		int want = at == c->pci_addr ? 0 : same_switch(c->pci_addr, at) ? 1 : -1;

		EXPECT_EQ(want, d < 0 ? -1 : d > 0) TH_LOG("client %#x: distance %d", at, d);
	}

	ASSERT_EQ(0, do_alloc(self->fd, c->index, 1 * MiB, 1 * MiB, &a))
		TH_LOG("ALLOC from the CMB: %s", strerror(errno));
	EXPECT_EQ(0u, a.bus_addr % MiB);
	EXPECT_GE(a.bus_addr, c->bus_addr);
	EXPECT_LE(a.bus_addr + a.size, c->bus_addr + c->bar_size);
	EXPECT_EQ(a.bus_addr - c->bus_addr, a.provider_offset);
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(MiB, by_addr(now, self->n, c->pci_addr)->bytes_used);

	m = map(self->fd, &a);
	ASSERT_NE(MAP_FAILED, m);
	fill(m, 4096, 0x66);
	EXPECT_EQ(0u, mismatches(m, 4096, 0x66));

	/* The controller DMAs a read into its own CMB. */
	nfd = open_nvme("p2pnvme-sw");
	ASSERT_GE(nfd, 0);
	ASSERT_EQ(0, posix_memalign((void **)&ram, 4096, MiB));
	fill(ram, MiB, 0x99);
	ASSERT_EQ((ssize_t)MiB, pwrite(nfd, ram, MiB, 20 * MiB));
	ASSERT_EQ((ssize_t)MiB, pread(nfd, m, MiB, 20 * MiB))
		TH_LOG("O_DIRECT pread into the CMB: %s", strerror(errno));
	EXPECT_EQ(0u, mismatches(m, MiB, 0x99));
	free(ram);
	close(nfd);

	ASSERT_EQ(0, munmap(m, a.size));
	EXPECT_EQ(0, do_free(self->fd, a.handle));
	ASSERT_EQ(self->n, list(self->fd, now, 8));
	EXPECT_EQ(0u, by_addr(now, self->n, c->pci_addr)->bytes_used);
}

TEST_HARNESS_MAIN
