// SPDX-License-Identifier: GPL-2.0
/*
 * ABI tests of /dev/p2pdirect, kselftest-harness style (TAP on stdout).
 * Run as root in the test VM with the module loaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/p2pdirect.h>

#include "kselftest_harness.h"

#define DEV_PATH "/dev/p2pdirect"
#define NOBODY 65534

FIXTURE(dev) {
	int fd;
};

FIXTURE_SETUP(dev)
{
	self->fd = open(DEV_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->fd, 0) TH_LOG("open %s: %s", DEV_PATH, strerror(errno));
}

FIXTURE_TEARDOWN(dev)
{
	close(self->fd);
}

TEST_F(dev, get_version)
{
	struct p2pdirect_version v;
	size_t len;

	memset(&v, 0xa5, sizeof(v));
	ASSERT_EQ(0, ioctl(self->fd, P2PDIRECT_IOC_GET_VERSION, &v));
	EXPECT_EQ((__u32)P2PDIRECT_ABI_MAJOR, v.abi_major);
	EXPECT_EQ((__u32)P2PDIRECT_ABI_MINOR, v.abi_minor);
	/* NUL-terminated inside the field, and the rest zeroed. */
	len = strnlen(v.module_version, sizeof(v.module_version));
	ASSERT_LT(len, sizeof(v.module_version));
	EXPECT_GT(len, 0u);
	for (size_t i = len; i < sizeof(v.module_version); i++)
		EXPECT_EQ(0, v.module_version[i]);
	TH_LOG("module %s, ABI %u.%u", v.module_version, v.abi_major, v.abi_minor);
}

/* A number of p2pdirect's range that no command uses. */
TEST_F(dev, unknown_command_enotty)
{
	struct p2pdirect_version v;
	unsigned long cmd = _IOWR(P2PDIRECT_IOCTL_MAGIC, 0xef, struct p2pdirect_version);

	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, cmd, &v));
	EXPECT_EQ(ENOTTY, errno);
}

/* Another driver's magic on our fd. */
TEST_F(dev, foreign_magic_enotty)
{
	int v = 0;

	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, _IOR('|', 0x81, int), &v));
	EXPECT_EQ(ENOTTY, errno);
}

/*
 * GET_VERSION's number with another struct size or direction: the layout of a
 * caller built against another header. Documented result: ENOTTY.
 */
TEST_F(dev, wrong_size_enotty)
{
	char buf[sizeof(struct p2pdirect_version) + 8];
	unsigned int nr = _IOC_NR(P2PDIRECT_IOC_GET_VERSION);

	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, _IOC(_IOC_READ | _IOC_WRITE, P2PDIRECT_IOCTL_MAGIC, nr,
					   sizeof(struct p2pdirect_version) - 8), buf));
	EXPECT_EQ(ENOTTY, errno);
	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, _IOC(_IOC_READ | _IOC_WRITE, P2PDIRECT_IOCTL_MAGIC, nr,
					   sizeof(struct p2pdirect_version) + 8), buf));
	EXPECT_EQ(ENOTTY, errno);
	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, _IOR(P2PDIRECT_IOCTL_MAGIC, nr, struct p2pdirect_version),
			    buf));
	EXPECT_EQ(ENOTTY, errno);
}

TEST_F(dev, bad_pointer_efault)
{
	void *unmapped, *ro;

	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_GET_VERSION, NULL));
	EXPECT_EQ(EFAULT, errno);

	/* A page that was mapped and is gone. */
	unmapped = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, unmapped);
	ASSERT_EQ(0, munmap(unmapped, 4096));
	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_GET_VERSION, unmapped));
	EXPECT_EQ(EFAULT, errno);

	/* Read-only memory for an output argument. */
	ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ASSERT_NE(MAP_FAILED, ro);
	errno = 0;
	EXPECT_EQ(-1, ioctl(self->fd, P2PDIRECT_IOC_GET_VERSION, ro));
	EXPECT_EQ(EFAULT, errno);
	munmap(ro, 4096);
}

/* The node is root-only: an ordinary user is refused at open. */
TEST(nonroot_open_eacces)
{
	int status;
	pid_t pid;

	ASSERT_EQ(0u, geteuid()) TH_LOG("run as root");
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		if (setgid(NOBODY) || setuid(NOBODY))
			_exit(100);
		_exit(open(DEV_PATH, O_RDWR) >= 0 ? 0 : errno);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(EACCES, WEXITSTATUS(status));
}

TEST_HARNESS_MAIN
