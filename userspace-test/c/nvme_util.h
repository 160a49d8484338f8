/* SPDX-License-Identifier: GPL-2.0 */
/* Helpers shared by the C tests: finding the test VM's NVMe controllers. */
#ifndef P2PDIRECT_TEST_NVME_H
#define P2PDIRECT_TEST_NVME_H

#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Finds the NVMe controller whose serial starts with @serial: its namespace 1
 * device node into @ns and, if @pci_dir is not NULL, its PCI sysfs directory.
 * Returns 1 if found.
 */
static inline int find_nvme(const char *serial, char *ns, size_t ns_len, char *pci_dir)
{
	char path[128], buf[64];
	int found = 0;
	glob_t g;

	if (glob("/sys/class/nvme/nvme*", 0, NULL, &g))
		return 0;
	for (size_t i = 0; i < g.gl_pathc && !found; i++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/serial", g.gl_pathv[i]);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f) && !strncmp(buf, serial, strlen(serial))) {
			snprintf(ns, ns_len, "/dev/%sn1", strrchr(g.gl_pathv[i], '/') + 1);
			snprintf(path, sizeof(path), "%s/device", g.gl_pathv[i]);
			found = !pci_dir || realpath(path, pci_dir) != NULL;
		}
		fclose(f);
	}
	globfree(&g);
	return found;
}

#endif /* P2PDIRECT_TEST_NVME_H */
