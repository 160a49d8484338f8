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

#endif /* P2PDIRECT_TESTMOD_UTIL_H */
