/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the C tests: finding the test VM's NVMe namespaces, PCI
 * address names, and the "fill" pattern the host writes into the test disks
 * (ci/fill.py).
 */
#ifndef P2PDIRECT_TEST_NVME_H
#define P2PDIRECT_TEST_NVME_H

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* Reads the first line of a sysfs attribute into @buf. Returns 1 on success. */
static inline int nvme_read_attr(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return 0;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok;
}

/*
 * The block device of the namespace with the lowest NSID of controller
 * @ctrl_dir (a /sys/class/nvme/nvmeX directory) into @ns as /dev/NAME, or
 * with NSID @nsid if it is not 0. Linux numbers namespaces in the order their
 * async scan got to them, so nvmeXn1 is not always the lowest NSID.
 * Returns 1 if found.
 */
static inline int nvme_ctrl_ns(const char *ctrl_dir, unsigned long nsid, char *ns, size_t ns_len)
{
	unsigned long best = 0;
	char path[PATH_MAX], buf[32];
	glob_t g;

	snprintf(path, sizeof(path), "%s/nvme*n*/nsid", ctrl_dir);
	if (glob(path, 0, NULL, &g))
		return 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		unsigned long id;
		char *name;

		if (!nvme_read_attr(g.gl_pathv[i], buf, sizeof(buf)))
			continue;
		id = strtoul(buf, NULL, 0);
		if (nsid ? id != nsid : best && id >= best)
			continue;
		best = id;
		*strrchr(g.gl_pathv[i], '/') = '\0';
		name = strrchr(g.gl_pathv[i], '/') + 1;
		snprintf(ns, ns_len, "/dev/%s", name);
	}
	globfree(&g);
	return best != 0;
}

/*
 * Finds the NVMe controller whose serial starts with @serial: the device node
 * of its first namespace (lowest NSID) into @ns and, if @pci_dir is not NULL,
 * its PCI sysfs directory. Returns 1 if found.
 */
static inline int find_nvme(const char *serial, char *ns, size_t ns_len, char *pci_dir)
{
	char path[PATH_MAX], buf[64];
	int found = 0;
	glob_t g;

	if (glob("/sys/class/nvme/nvme*", 0, NULL, &g))
		return 0;
	for (size_t i = 0; i < g.gl_pathc && !found; i++) {
		snprintf(path, sizeof(path), "%s/serial", g.gl_pathv[i]);
		if (!nvme_read_attr(path, buf, sizeof(buf)) || strncmp(buf, serial, strlen(serial)))
			continue;
		if (!nvme_ctrl_ns(g.gl_pathv[i], 0, ns, ns_len))
			continue;
		snprintf(path, sizeof(path), "%s/device", g.gl_pathv[i]);
		found = !pci_dir || realpath(path, pci_dir) != NULL;
	}
	globfree(&g);
	return found;
}

/*
 * Finds the namespace with NSID @nsid on any controller (the test VM's NSIDs
 * are unique across controllers): its device node into @ns and, if @serial
 * is not NULL, its controller's serial (at least 21 bytes). Returns 1 if found.
 */
static inline int find_nvme_nsid(unsigned long nsid, char *ns, size_t ns_len, char *serial)
{
	char path[PATH_MAX];
	int found = 0;
	glob_t g;

	if (glob("/sys/class/nvme/nvme*", 0, NULL, &g))
		return 0;
	for (size_t i = 0; i < g.gl_pathc && !found; i++) {
		if (!nvme_ctrl_ns(g.gl_pathv[i], nsid, ns, ns_len))
			continue;
		found = 1;
		snprintf(path, sizeof(path), "%s/serial", g.gl_pathv[i]);
		if (serial && !nvme_read_attr(path, serial, 21))
			serial[0] = '\0';
	}
	globfree(&g);
	return found;
}

/* A PCI address (P2PDIRECT_PCI_ADDR: domain << 16 | bus << 8 | devfn) as dddd:bb:dd.f. */
static inline void pci_name(uint32_t addr, char *buf, size_t len)
{
	snprintf(buf, len, "%04x:%02x:%02x.%u", addr >> 16, (addr >> 8) & 0xff,
		 (addr >> 3) & 0x1f, addr & 7);
}

#ifdef _UAPI_LINUX_P2PDIRECT_H
/*
 * Tells the host (ci/hostcheck.py) that the allocation @a, just made on
 * /dev/p2pdirect @fd, holds zeros: ALLOC zeroes the memory it hands out.
 * Only emulated GPUs (providers of kind BAR) have a memory file to check.
 */
static inline void record_alloc_zero(int fd, const struct p2pdirect_alloc *a)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	char bdf[32];

	if (ioctl(fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return;
	for (unsigned int i = 0; i < req.count && i < 8; i++) {
		if (p[i].index != a->provider || p[i].kind != P2PDIRECT_PROVIDER_BAR)
			continue;
		pci_name(p[i].pci_addr, bdf, sizeof(bdf));
		printf("# HOSTCHECK gpu=%s off=%llu len=%llu zero guard=0\n", bdf,
		       (unsigned long long)a->provider_offset, (unsigned long long)a->size);
		fflush(stdout);
	}
}

/* LIST_PROVIDERS' bytes_used of provider @index on @fd (~0 on error). */
static inline __u64 provider_used_bytes(int fd, __u32 index)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };

	if (ioctl(fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return ~0ull;
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].index == index)
			return p[i].bytes_used;
	return ~0ull;
}

/*
 * The last emulated GPU (BAR provider) LIST_PROVIDERS gives on @fd, in @g;
 * -1 if none. A GPU unbound and bound again is listed last, so this is the
 * one tests unbind without changing the order later suites rely on.
 */
static inline int last_gpu(int fd, struct p2pdirect_provider_info *g)
{
	struct p2pdirect_provider_info p[8];
	struct p2pdirect_list_providers req = { .entries = (uintptr_t)p, .capacity = 8 };
	int found = -1;

	if (ioctl(fd, P2PDIRECT_IOC_LIST_PROVIDERS, &req))
		return -1;
	for (unsigned int i = 0; i < req.count && i < 8; i++)
		if (p[i].kind == P2PDIRECT_PROVIDER_BAR) {
			*g = p[i];
			found = 0;
		}
	return found;
}

/* FREE of @handle on @fd from another thread (pthread_create's start). */
struct freer {
	int fd;
	__u64 handle;
	int ret;		/* 0 or -1 (errno in the thread) */
};

static inline void *free_main(void *arg)
{
	struct freer *f = arg;

	f->ret = ioctl(f->fd, P2PDIRECT_IOC_FREE, &(struct p2pdirect_free){ .handle = f->handle });
	return NULL;
}

/* STATS' pinned_bytes of the provider at PCI address @addr (0: no row). */
static inline __u64 pinned_bytes(int fd, __u32 addr)
{
	struct p2pdirect_stat st[32];
	struct p2pdirect_stats req = { .entries = (uintptr_t)st, .capacity = 32 };

	if (ioctl(fd, P2PDIRECT_IOC_STATS, &req))
		return ~0ull;
	for (unsigned int i = 0; i < req.count && i < 32; i++)
		if (st[i].kind == P2PDIRECT_STAT_PROVIDER && st[i].id == addr)
			return st[i].pinned_bytes;
	return 0;
}
#endif

/* Byte @i of the pattern of @seed (HOSTCHECK seed=; same function as ci/hostcheck.py). */
static inline uint8_t pattern_byte(uint64_t i, uint32_t seed)
{
	return (uint8_t)((i * 7 + seed + (i >> 12)) & 0xff);
}

/*
 * The fill pattern: each aligned 8-byte word w of a disk or file holds
 * fill_word(w, seed) in little-endian byte order. Must match ci/fill.py.
 */
static inline uint64_t fill_word(uint64_t w, uint64_t seed)
{
	uint64_t x = w * 0x9E3779B97F4A7C15ULL + seed;

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ULL;
	x ^= x >> 32;
	return x;
}

/*
 * The number in the first line of @path that scanf format @fmt (one %ld)
 * matches, or -1 (no such line, or the file cannot be read).
 */
static inline long file_number(const char *path, const char *fmt)
{
	char line[256];
	long n = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, fmt, &n) == 1)
			break;
	fclose(f);
	return n;
}

/* p2pdirect's reference count from /proc/modules, or -1. */
static inline int module_refs(void)
{
	return (int)file_number("/proc/modules", "p2pdirect %*u %ld");
}

/* delete_module(2) of p2pdirect as rmmod calls it: 0 (unloaded) or -errno. */
static inline int try_rmmod(void)
{
	return syscall(SYS_delete_module, "p2pdirect", O_NONBLOCK) ? -errno : 0;
}

/* /sys/dev/block/MAJ:MIN/@attr of the block device numbered @dev. */
static inline void blk_attr(dev_t dev, const char *attr, char *path, size_t len)
{
	snprintf(path, len, "/sys/dev/block/%u:%u/%s", major(dev), minor(dev), attr);
}

/* Field @n (1-based, at most 17) of the stat file of block device @dev, or -1. */
static inline long blk_stat(dev_t dev, int n)
{
	char path[96], fmt[128] = "";

	blk_attr(dev, "stat", path, sizeof(path));
	for (int i = 1; i < n && i < 17; i++)
		strcat(fmt, "%*s ");
	strcat(fmt, "%ld");
	return file_number(path, fmt);
}

/* A line for the kernel log, which the host's console scan reads. */
static inline void log_kernel(const char *msg)
{
	int fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	if (write(fd, msg, strlen(msg)) < 0)
		perror("/dev/kmsg");
	close(fd);
}

/* Lines of the kernel log that hold @needle, a fixed string without quotes. */
static inline int klog_has(const char *needle)
{
	char cmd[320];
	int n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "dmesg | grep -cF -- '%s'", needle);
	f = popen(cmd, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%d", &n) != 1)
		n = 0;
	pclose(f);
	return n;
}

/* Writes @val to the sysfs file @path: 0 or -errno (-EIO on a short write). */
static inline int sysfs_write(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;
	int e;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	e = errno;
	close(fd);
	if (n < 0)
		return -e;
	return n == (ssize_t)strlen(val) ? 0 : -EIO;
}

/* The fill byte at byte offset @o for seed @seed. */
static inline uint8_t fill_byte(uint64_t o, uint64_t seed)
{
	return (uint8_t)(fill_word(o >> 3, seed) >> (8 * (o & 7)));
}

/* Bytes of @p that differ from the fill pattern at @pos with @seed. */
static inline uint64_t fill_diff(const uint8_t *p, uint64_t len, uint64_t pos, uint64_t seed)
{
	uint64_t bad = 0;

	for (uint64_t i = 0; i < len; i++)
		bad += p[i] != fill_byte(pos + i, seed);
	return bad;
}

/* Writes fill bytes @pos .. @pos + @len - 1 for seed @seed to @p. */
static inline void fill_buf(void *p, size_t len, uint64_t pos, uint64_t seed)
{
	uint8_t *b = p;
	uint64_t x = fill_word(pos >> 3, seed);

	for (size_t i = 0; i < len; i++, pos++) {
		if (i && !(pos & 7))
			x = fill_word(pos >> 3, seed);
		b[i] = (uint8_t)(x >> (8 * (pos & 7)));
	}
}

#endif /* P2PDIRECT_TEST_NVME_H */
