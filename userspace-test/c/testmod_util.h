/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Driving the test modules (testmod/) from the C tests: a command written to
 * one of their debugfs files, and the state they report back:
 *   attached A mapped M invalidations N segs S
 *   seg DMA_ADDR LEN		(hex, one per DMA segment)
 *   pagesize N			(p2pd_importer/peer, while a range is held)
 */
#ifndef P2PDIRECT_TESTMOD_UTIL_H
#define P2PDIRECT_TESTMOD_UTIL_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TM_SEGS 16

struct tm_state {
	int attached, mapped;
	unsigned int invalidations, segs;
	unsigned long long addr[TM_SEGS], len[TM_SEGS], pagesize;
};

/* Writes one command; 0 or -errno (the module's answer). */
static inline int tm_cmd(int fd, const char *fmt, ...)
{
	char buf[128];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return write(fd, buf, n) == n ? 0 : -errno;
}

/* Reads the state; -EPROTO if it does not parse. */
static inline int tm_state(int fd, struct tm_state *st)
{
	char buf[4096], *line;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	unsigned int i = 0;

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	memset(st, 0, sizeof(*st));
	if (sscanf(buf, "attached %d mapped %d invalidations %u segs %u", &st->attached,
		   &st->mapped, &st->invalidations, &st->segs) != 4)
		return -EPROTO;
	for (line = strchr(buf, '\n'); line; line = strchr(line + 1, '\n')) {
		if (i < TM_SEGS && sscanf(line + 1, "seg %llx %llx", &st->addr[i], &st->len[i]) == 2)
			i++;
		else if (sscanf(line + 1, "pagesize %llu", &st->pagesize) != 1)
			continue;
	}
	return i == st->segs ? 0 : -EPROTO;
}

/*
 * Waits up to 5 s for the consumer of @fd (p2pd_importer/peer) to count an
 * invalidation (its callback counts on entry); the count, 0 if none came.
 */
static inline unsigned int tm_wait_invalidation(int fd)
{
	struct tm_state st = { 0 };

	for (int i = 0; i < 500 && !st.invalidations; i++) {
		usleep(10000);
		if (tm_state(fd, &st))
			return 0;
	}
	return st.invalidations;
}

/*
 * What a fixture's teardown puts back, whatever the test did or where it
 * failed: with @kept (the test handed p2pd_importer.ko an importer or
 * consumer) the module is unloaded, which releases it; both test modules
 * are loaded; the GPU @unbound (a PCI address, or "") is bound to p2pdirect.
 * The test's files of the modules must be closed already. 0, or -1 with a
 * line on stderr.
 */
static inline int tm_restore(int kept, const char *unbound)
{
	char path[96];
	FILE *f;
	int ret = 0;

	if (kept && !access("/sys/module/p2pd_importer", F_OK) && system("rmmod p2pd_importer"))
		ret = -1;
	if (access("/sys/module/p2pd_importer", F_OK) && system("insmod /p2pd_importer.ko"))
		ret = -1;
	if (access("/sys/module/p2pd_client", F_OK) && system("insmod /p2pd_client.ko"))
		ret = -1;
	snprintf(path, sizeof(path), "/sys/bus/pci/drivers/p2pdirect/%s", unbound);
	if (*unbound && access(path, F_OK)) {
		f = fopen("/sys/bus/pci/drivers/p2pdirect/bind", "w");
		if (!f || fputs(unbound, f) < 0)
			ret = -1;
		if (f && fclose(f))
			ret = -1;
	}
	if (ret)
		fprintf(stderr, "# could not restore the test modules or GPU %s\n", unbound);
	return ret;
}

#endif /* P2PDIRECT_TESTMOD_UTIL_H */
