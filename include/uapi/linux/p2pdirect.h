/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * p2pdirect: device memory, peer-memory registration and direct NVMe I/O on
 * PCI P2PDMA. The one definition of the /dev/p2pdirect ABI.
 *
 * Rules (Documentation/driver-api/ioctl.rst):
 *  - every command is _IOWR with its real argument struct; the struct size is
 *    part of the command number, so a caller built against another layout gets
 *    -ENOTTY instead of a misread struct;
 *  - pointers and sizes are __u64; no enums, no bitfields;
 *  - fields named pad/reserved must be zero on input (else -EINVAL) and are
 *    zero on output;
 *  - new behaviour gets a new command number; the ABI major changes only when
 *    an existing command changes meaning, the minor when commands are added.
 *
 * Errors common to every command:
 *  -ENOTTY  unknown command, or a known command number with a wrong size or
 *           direction (a caller built against another version of this file);
 *  -EFAULT  the argument pointer is not readable/writable user memory;
 *  -EINVAL  a pad or reserved field is not zero.
 * Opening /dev/p2pdirect needs CAP_SYS_ADMIN (-EACCES otherwise) in addition
 * to the node's file mode (0600, root).
 */
#ifndef _UAPI_LINUX_P2PDIRECT_H
#define _UAPI_LINUX_P2PDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PDIRECT_ABI_MAJOR 1
#define P2PDIRECT_ABI_MINOR 0

/* 'P' with numbers 0xd0..0xef is free in ioctl-number.rst. */
#define P2PDIRECT_IOCTL_MAGIC 'P'
#define P2PDIRECT_IOCTL_BASE 0xd0

#define P2PDIRECT_MODULE_VERSION_LEN 32

/**
 * struct p2pdirect_version - P2PDIRECT_IOC_GET_VERSION
 * @abi_major: out, P2PDIRECT_ABI_MAJOR of the running module
 * @abi_minor: out, P2PDIRECT_ABI_MINOR of the running module
 * @module_version: out, NUL-terminated module version string
 */
struct p2pdirect_version {
	__u32 abi_major;
	__u32 abi_minor;
	char module_version[P2PDIRECT_MODULE_VERSION_LEN];
};

#define P2PDIRECT_IOC_GET_VERSION \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 0, struct p2pdirect_version)

#endif /* _UAPI_LINUX_P2PDIRECT_H */
