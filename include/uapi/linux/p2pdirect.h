/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * p2pdirect: device memory, peer-memory registration and direct NVMe I/O on
 * PCI P2PDMA. The one definition of the /dev/p2pdirect ABI.
 *
 * Rules (Documentation/driver-api/ioctl.rst):
 *  - every ioctl command is _IOWR with its real argument struct; the struct
 *    size is part of the command number, so a caller built against another
 *    layout gets -ENOTTY instead of a misread struct (the io_uring cmd_op
 *    values, which are not ioctls, are _IOW: the argument is only read);
 *  - pointers and sizes are __u64; no enums, no bitfields; every __u64 sits
 *    at a multiple of 8 and every struct's size is one, so 32-bit and 64-bit
 *    x86 processes see the same layouts and command numbers (ci/uapi-abi.py
 *    checks it with gcc -m32 and -m64): a 32-bit process's ioctls take the
 *    same path (compat_ptr_ioctl) with its pointers zero-extended;
 *  - fields named pad/reserved must be zero on input (else -EINVAL) and are
 *    zero on output;
 *  - new behaviour gets a new command number or flag; the ABI major changes
 *    only when an existing command changes meaning, the minor when commands,
 *    flags or documented behaviours are added (1.6, 1.7 and 1.10 to 1.20
 *    added behaviours and no command).
 *
 * Errors common to every command:
 *  -ENOTTY  unknown command, or a known command number with a wrong size or
 *           direction (a caller built against another version of this file);
 *           the VFS's generic ioctls (FIOCLEX, FIONCLEX, FIONBIO, FIOASYNC,
 *           FIGETBSZ, see ioctl_list) are served before the driver sees
 *           them, on /dev/p2pdirect as on any file;
 *  -EFAULT  the argument pointer is not readable/writable user memory. Every
 *           argument struct is read and written back before the command acts
 *           (since ABI 1.6), so a read-only argument fails before anything
 *           happened: no data moved, nothing allocated, no counter reset
 *           (another thread unmapping the argument while the command runs
 *           can still make the final copy-out fail after the fact);
 *  -EINVAL  a pad or reserved field is not zero;
 *  -EBADF   the command needs /dev/p2pdirect open for writing (since 1.6).
 *
 * When several things are wrong, these come first, in this order: the
 * command number (-ENOTTY), the open mode (-EBADF, EXPORT_DMABUF's O_RDWR
 * included), the argument pointer (-EFAULT); then the pad and flags of the
 * argument (-EINVAL); then the command's own checks, in the order its
 * Errors give where that order is stated (since ABI 1.13). STATS with
 * RESET on a read-only file is the one open-mode refusal that needs the
 * argument: -EFAULT, then -EBADF, then the pad and the other flags.
 *
 * Open mode (since ABI 1.6): a file opened O_RDONLY may GET_VERSION,
 * LIST_PROVIDERS and STATS without P2PDIRECT_STATS_RESET; every command that
 * takes resources, moves data or resets counters (ALLOC, FREE, DMA_PROBE,
 * REGISTER, DEREGISTER, REG_QUERY, READ, WRITE, STATS with RESET) needs
 * O_RDWR or O_WRONLY, else -EBADF (as write(2) on a read-only descriptor;
 * since ABI 1.13 an open with access mode 3, O_ACCMODE, counts as read-only);
 * EXPORT_DMABUF needs O_RDWR (the dma-buf is read-write), and mmap() of
 * device memory, which is shared and read-write, needs O_RDWR too (the
 * kernel refuses a shared mapping of an O_WRONLY file: -EACCES).
 *
 * /dev/p2pdirect is created with mode 0600 (root only); an ordinary user gets
 * -EACCES at open unless an administrator widens the node (udev rule). An
 * open file, and any mapping of device memory (which holds its file), holds
 * the module: rmmod fails ("in use") until the last one is gone.
 *
 * Kernel memory (since ABI 1.18): what the module keeps in the kernel for a
 * user (an open file's state, an allocation's and a registration's records
 * and page arrays, a dma-buf export, an I/O in flight, a COMPAT bounce
 * buffer) is charged to the memory cgroup of the task whose call made it,
 * as the kernel charges its own per-user objects (pipes, io_uring rings):
 * a cgroup's memory.max bounds it. Lists shared by many users, a few
 * bytes per entry, are charged to none: a kernel client's list of its
 * users' pins, a dma-buf's list of its importers' mappings, a provider's
 * list of its allocations and its free-range map, and the list of
 * registrations of another driver's P2PDMA memory watched for its removal.
 * A call that would pass that limit gets -ENOMEM, or the task is killed by
 * the cgroup's OOM killer, as for any kernel memory it asks for. Device
 * memory is not such memory: ALLOC takes it first come, first served.
 * max_pinned_mib bounds what each file keeps registered and every single
 * pin of a call (REGISTER, DMA_PROBE, a pointer READ or WRITE), whichever
 * client's memory it is; the pins of I/Os in flight are not summed (their
 * number per file is bounded by P2PDIRECT_URING_MAX_INFLIGHT for io_uring,
 * by the caller's threads for the ioctls), and pins of device memory take
 * no RAM besides their charged page arrays.
 *
 * Pins of one page (since ABI 1.21): a page of p2pdirect's memory or of
 * another provider's P2PDMA pages that holds P2PDIRECT_PAGE_PINS_MAX pins
 * already, counting every pin of it (all users' registrations, I/O in
 * flight, other drivers' pins), is not pinned again: the REGISTER,
 * DMA_PROBE, pointer READ or WRITE, or kernel client's get_pages that
 * would pin it gets -ETOOMANYREFS, with nothing kept (memory of another
 * module's client, P2PDIRECT_CLIENT_EXTERNAL, is pinned by that client).
 * The kernel keeps a page's pins in its 32-bit reference count, 1024 to a
 * pin: past about two million pins the count would overflow and pinning it
 * would warn. A few references that are not pins count too (each mapping
 * of the page, and for p2pdirect's memory its allocation), so a page
 * mapped about 1024 times or more holds one pin less. A call pins, then
 * counts: near the limit, calls pinning the same page at once may each
 * see the other's pin and be refused, though one of them would have fit.
 *
 * The minors, newest first (each says what changed and what it did before):
 *
 * ABI 1.21 (no new command, same structs): a page is pinned at most
 * P2PDIRECT_PAGE_PINS_MAX times at once; past that, -ETOOMANYREFS. Before,
 * registrations of one page had no bound of their own (4096 a file), so
 * about two million of them, from many files, overflowed its reference
 * count, and the next pin of it made the kernel warn. Two corrections
 * where the code differed from this file: a range that starts in RAM and
 * runs into a p2pdirect mapping (or a CPU mapping of one of its dma-bufs)
 * is -ENXIO, like any range that starts in RAM (before, -EFAULT); and a
 * file READ or WRITE checks its file system's device's read-only state
 * before the alignment and the offset's sign before the file system's
 * page-cache path (before, -EINVAL came before -EROFS, and -EOPNOTSUPP
 * before -EINVAL).
 *
 * ABI 1.20 (no new command, same structs): io_uring's worker starts no
 * command for a process being killed or exiting: it ends with -ECANCELED
 * (see struct p2pdirect_uring_io). Before, a process killed while its ring
 * lived on (shared with another process) left its workers to go on through
 * the commands they had queued (io_uring cancels only unbound work at
 * exit): those on registered memory still moved their data, into memory
 * nobody waited for, while COMPAT ones and those that pin pointer memory
 * ended with -EINTR.
 *
 * ABI 1.19 (no new command, same structs): an io_uring READ of a file that
 * the file system gives up after part of it went is run again by a kernel
 * worker, which lets go of its pins as soon as it is done (see struct
 * p2pdirect_uring_io); before, by the submitter's task work, so the pins,
 * and a GPU unbind waiting for them, stayed until the submitter ran its
 * task work: on an IORING_SETUP_DEFER_TASKRUN ring, until it entered the
 * ring to wait, and a thread that unbound the GPU meanwhile waited for
 * itself.
 *
 * ABI 1.18 (no new command, same structs): kernel memory is charged to the
 * caller's memory cgroup (above); before, to no one, so a user in a
 * limited cgroup could keep any amount of it through many open files. An
 * ALLOC whose task is killed while it zeroes the memory stops and takes
 * nothing; before, it zeroed the whole range first. Revocation tells an
 * allocation's kernel consumers first, then its registrations, each in the
 * order they came (then the dma-bufs, as since 1.16); before, consumers
 * and registrations in the order they came.
 *
 * ABI 1.17 (no new command, same structs): REGISTER looks up and pins its
 * memory with no lock of the file held, so a REGISTER whose page fault
 * waits (a FUSE daemon, a userfaultfd handler, a suspended device) no
 * longer holds up the file's other REGISTER, DEREGISTER and REG_QUERY
 * calls; the file's limits (-EEXIST, -ENOSPC, -EDQUOT) are checked before
 * the memory, as before (the quota is taken for the range then, and given
 * back if the REGISTER fails), and -EEXIST and -ENOSPC again once it is
 * pinned. A WRITE at or past
 * a raw block device's end (-ENOSPC) counts in the provider's STATS entry
 * too, as the rule of struct p2pdirect_stat says; before, only in the
 * block device's.
 *
 * ABI 1.16 (no new command, same structs): READ and WRITE of a raw block
 * device run read(2)'s rw_verify_area() (offsets, the LSM, fanotify
 * permission events) also at or past the device's end, as read(2) and
 * write(2) do, on the whole @size as read(2) passes it: a range whose end
 * overflows loff_t gets -EINVAL, there too; before, 0 bytes or -ENOSPC
 * without the checks. A READ of a file that has a lease no longer breaks
 * it (read(2) breaks none): its holes are not counted then (@zeroed_bytes
 * 0; the private open that finds them would have broken a write lease,
 * which only the caller itself can hold, sending it SIGIO and waiting for
 * it). An io_uring READ or WRITE with unknown flags
 * or size 0 gets -EINVAL also when the file's commands in flight are at
 * P2PDIRECT_URING_MAX_INFLIGHT; before, -EBUSY.
 *
 * ABI 1.15 (no new command, same structs): READ and WRITE of a regular file
 * (also through io_uring) hand the file system the memory's kernel
 * addresses, so the block layer marks the bios of P2PDMA pages unmergeable
 * and never mixes P2PDMA regions in one bio; before, a read into host
 * memory of the next blocks, submitted in the same io_uring plug, could
 * merge into such a request, whose segments the driver maps all as the
 * first one's kind. The file's I/O is direct also when fcntl(F_SETFL)
 * cleared O_DIRECT after the checks; before, it could fall to page-cache
 * copies. A WRITE to a raw block device opened O_DSYNC is durable when it
 * returns (FUA bios, then a cache flush); before, O_DSYNC was ignored there.
 *
 * ABI 1.14 (no new command, same structs): a registration of another
 * provider's P2PDMA pages (P2PDIRECT_CLIENT_P2PDMA_USER, such as an NVMe
 * CMB mapped through sysfs p2pmem/allocate) is invalidated when that
 * provider's driver is about to unbind, as kernel consumers of such memory
 * are; before, the driver's unbind waited until the registration was
 * dropped (DEREGISTER or close). Such a range must be pages of one P2PDMA
 * region, so of one device (-EFAULT otherwise, for REGISTER, DMA_PROBE,
 * READ and WRITE alike; a sysfs p2pmem mapping is one region). FREE
 * (or close) racing the removal of the allocation's device returns once the
 * removal has zapped the mappings and told every registration and kernel
 * consumer, as FREE alone does; before, it could return first. That wait
 * is interruptible: a FREE whose thread gets a signal meanwhile returns 0
 * at once (the allocation is gone from the file either way) while the
 * removal goes on telling them. Revoked
 * memory goes back to its provider only after the fences of a dma-buf of
 * it retired, also when a kernel consumer was told before the dma-buf;
 * before, it could go back while FREE still waited for those fences.
 * DEREGISTER (and close) drop a registration's pins at once also while a
 * FREE of its memory is still telling other users; before, the pins and
 * the quota stayed until that FREE reached the registration.
 *
 * ABI 1.13 (no new command, same structs): errors come in a stated order
 * when several apply (above): ALLOC checks its size and alignment before
 * its provider, EXPORT_DMABUF its open mode before its argument and its
 * allocation and range before taking a file descriptor; STATS refuses
 * RESET on a read-only file before its pad and flags; and an open with
 * access mode 3 (O_ACCMODE) counts as read-only. READ and WRITE (also
 * through io_uring) count a bounced READ's hole bytes in @zeroed_bytes
 * only, and take a file range that the file system would serve through the
 * page cache because it is off its STATX_DIOALIGN offset alignment as such
 * (an xfs reflinked file written off its allocation unit: -EOPNOTSUPP
 * without COMPAT; before, CPU copies counted as P2P).
 *
 * ABI 1.12 (no new command, same structs; what 1.11 did otherwise than
 * documented): a CPU mapping (mmap) of a dma-buf exported from an
 * allocation is p2pdirect's own memory, P2PDIRECT_CLIENT_DEVMEM, and FREE,
 * close and device removal invalidate registrations on it; before, it was
 * taken as P2PDIRECT_CLIENT_P2PDMA_USER, whose registrations nothing
 * invalidated. STATS counts in @reads and @writes only I/Os that moved data
 * or failed; before, a READ at the end (0 bytes) counted too. A stacked
 * device's @dma_pci_addr is its first leg's in name order; before, in the
 * order the legs' block devices were added.
 *
 * ABI 1.11 (no new command, same structs): io_uring READ and WRITE refuse
 * a command whose SQE sets a field they do not use (addr, len, buf_index,
 * file_index) with -EINVAL, as they refuse reserved bytes, so that a later
 * minor can give these fields a meaning; before, they were ignored
 * (io_uring itself refuses ioprio on these commands, before and since).
 * READ and WRITE at or past the end of a raw block device look up their
 * memory first (see struct p2pdirect_io). A range
 * that starts in another provider's P2PDMA mapping and runs out of it gets
 * -EFAULT, as one in a p2pdirect mapping does (see struct
 * p2pdirect_register).
 *
 * ABI 1.10 (no new command, same structs): the statistics hold at most
 * P2PDIRECT_STATS_MAX_ENTRIES entries, and STATS with RESET leaves the
 * entries past @capacity counting (see struct p2pdirect_stats). It also
 * names the stacking limits 1.7 introduced (P2PDIRECT_STACK_MAX_DEPTH,
 * P2PDIRECT_STACK_MAX_LEGS), whose values are unchanged.
 *
 * ABI 1.9 adds P2PDIRECT_IOC_EXPORT_DMABUF: device memory as a P2P dma-buf
 * for other drivers (RDMA NICs: ibv_reg_dmabuf_mr).
 *
 * ABI 1.8 adds asynchronous READ and WRITE through io_uring
 * (P2PDIRECT_URING_CMD_READ/WRITE, struct p2pdirect_uring_io below).
 *
 * ABI 1.7 (no new command, same structs): READ, WRITE and DMA_PROBE accept
 * stacked block devices. An md array or an NVMe native multipath head does
 * its DMA through its legs (paths), so every leg's controller must reach the
 * memory, else -EREMOTEIO (the log names the leg) or the COMPAT bounce; a
 * block device that does not advertise P2PDMA (device-mapper, loop) gives
 * -EOPNOTSUPP, or the bounce. Partitions work like their disk. Before 1.7 a
 * multipath head or an md array failed with -EREMOTEIO.
 *
 * ABI 1.6 (no new command, same structs) made these behaviours part of the
 * ABI: the open-mode rule and the argument check above, zeroed ALLOC,
 * recycled handles, FREE that never waits for I/O, refaulting mappings, the pin
 * quota counted in whole pages and at most 4096 registrations per file,
 * read(2)/write(2) parity of READ/WRITE on raw block devices, and O_DIRECT
 * served through the page cache counted as bounced (see each command).
 */
#ifndef _UAPI_LINUX_P2PDIRECT_H
#define _UAPI_LINUX_P2PDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PDIRECT_ABI_MAJOR 1
#define P2PDIRECT_ABI_MINOR 21

/* The most pins one page may hold (since 1.21: "Pins of one page" above). */
#define P2PDIRECT_PAGE_PINS_MAX 65535

/*
 * 'P' 0xd0..0xef: ioctl-number.rst lists all of 'P' for linux/soundcard.h
 * (as a conflict; its 'P' commands are numbered 0x00..0x43) and five other
 * users of numbers below 0x70; nothing in the kernel uses 'P' 0xd0..0xef.
 */
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

/*
 * A PCI function: domain << 16 | bus << 8 | devfn. A domain above 0xffff
 * does not fit (Intel VMD puts the devices behind it in domains from
 * 0x10000): only its low 16 bits are reported, so such a device has the
 * address of one in a low domain (STATS then counts both in one entry).
 */
#define P2PDIRECT_PCI_ADDR(domain, bus, devfn) \
	(((__u32)(domain) << 16) | ((__u32)(bus) << 8) | (__u32)(devfn))

/* struct p2pdirect_provider_info.kind */
#define P2PDIRECT_PROVIDER_BAR 1	/* a BAR p2pdirect registered itself */
#define P2PDIRECT_PROVIDER_PUBLISHED 2	/* P2PDMA memory another driver published */

/* Reachability entries per provider: at most this many NVMe controllers. */
#define P2PDIRECT_MAX_CLIENTS 16

/**
 * struct p2pdirect_client_info - P2P reachability of one NVMe controller
 * @pci_addr: the controller, P2PDIRECT_PCI_ADDR()
 * @distance: the kernel's P2PDMA distance from the provider
 *            (pci_p2pdma_distance); -1 when the two cannot reach each other
 */
struct p2pdirect_client_info {
	__u32 pci_addr;
	__s32 distance;
};

/**
 * struct p2pdirect_provider_info - one device-memory provider
 * @index: what P2PDIRECT_IOC_ALLOC's @provider names
 * @kind: P2PDIRECT_PROVIDER_*
 * @pci_addr: the providing PCI function, P2PDIRECT_PCI_ADDR()
 * @bar: the BAR that holds the memory
 * @bar_size: size of that BAR
 * @bus_addr: PCI bus address of the first byte of the memory
 * @bytes_total: memory p2pdirect can allocate from this provider; for
 *               PUBLISHED providers the size of the BAR that holds the pool
 * @bytes_free: of which free now; for PUBLISHED providers an upper bound (the
 *              owning driver and other users allocate from the same pool)
 * @bytes_used: of which p2pdirect's open files hold now: the sizes of
 *              their allocations (on a PUBLISHED provider an allocation
 *              aligned past a page takes up to its alignment more from the
 *              pool, which is not counted here)
 * @num_clients: valid entries in @clients
 * @pad: zero
 * @clients: reachability of the NVMe controllers present (PCI class
 *           NVMe), in the PCI core's enumeration order: at most
 *           P2PDIRECT_MAX_CLIENTS of them, so on a machine with more the
 *           rest are left out (DMA_PROBE, READ and WRITE check any
 *           controller)
 */
struct p2pdirect_provider_info {
	__u32 index;
	__u32 kind;
	__u32 pci_addr;
	__u32 bar;
	__u64 bar_size;
	__u64 bus_addr;
	__u64 bytes_total;
	__u64 bytes_free;
	__u64 bytes_used;
	__u32 num_clients;
	__u32 pad;
	struct p2pdirect_client_info clients[P2PDIRECT_MAX_CLIENTS];
};

/**
 * struct p2pdirect_list_providers - P2PDIRECT_IOC_LIST_PROVIDERS
 * @entries: in, user pointer to @capacity struct p2pdirect_provider_info
 * @capacity: in, entries room at @entries (0: only count them)
 * @count: out, number of providers; entries beyond @capacity are not written
 *
 * Providers come and go (device hotplug): call again with more room while
 * @count is above @capacity. Errors: -EFAULT @entries cannot be written
 * (after @count was found; nothing changes); -ENOMEM.
 */
struct p2pdirect_list_providers {
	__u64 entries;
	__u32 capacity;
	__u32 count;
};

/**
 * struct p2pdirect_alloc - P2PDIRECT_IOC_ALLOC
 * @provider: in, struct p2pdirect_provider_info.index (-ENODEV if unknown)
 * @flags: in, zero
 * @size: in, bytes (> 0); out, rounded up to whole pages
 * @alignment: in, 0 (page) or a power of two; alignment within the BAR
 *              (of the allocation's offset from the BAR's start, so any
 *              power of two fits offset 0 of an empty BAR provider, while
 *              a PUBLISHED provider's pool, which starts further in, can
 *              answer -ENOMEM for one past its size)
 * @handle: out, names the allocation for FREE
 * @mmap_offset: out, the offset to mmap() the allocation at (MAP_SHARED,
 *               length == @size, no PROT_EXEC); it is @handle << 40, so a
 *               32-bit process, whose mmap2() offset ends at 16 TiB, can
 *               map allocations with a handle below 16 only (handles are
 *               numbered from 1 across all open files, lowest free first)
 * @bus_addr: out, PCI bus address of the allocation's first byte
 * @provider_offset: out, offset of the allocation within the provider's memory
 *                   (PUBLISHED: from @bus_addr of the provider, its BAR start)
 *
 * The memory is zeroed: whatever an earlier owner left there never shows.
 * The CPU zeroes it before ALLOC returns, 1 MiB at a time; a task killed
 * meanwhile stops there and its ALLOC takes nothing (since ABI 1.18).
 * Handles are recycled once freed (like file descriptors): a handle names an
 * allocation only between its ALLOC and its FREE. A refused ALLOC takes
 * nothing. Memory freed while an I/O still pins it returns to the provider
 * (and counts as used until then) when that I/O ends.
 *
 * The mapping stays usable while the allocation lives: pages dropped from it
 * (MADV_DONTNEED) fault back in, and after a partial munmap the part still
 * mapped keeps working (the unmapped part cannot be mapped again on its own:
 * mmap takes the whole allocation); after FREE, any access gets SIGBUS.
 * A mapping is one VMA: a range that spans two (an mprotect or madvise of
 * part of the mapping splits it) is refused by REGISTER, DMA_PROBE, READ
 * and WRITE with -EFAULT, as one that runs out of the mapping. fork() does
 * not pass the mapping to the child (VM_DONTCOPY), and MADV_DOFORK cannot
 * undo that (-EINVAL: the kernel's rule for special mappings, VM_MIXEDMAP).
 * Before, this comment said a child given the mapping by MADV_DOFORK would
 * share the memory: no child inherits the mapping. A child (or any process)
 * that shares the open file itself (an inherited or passed fd) shares its
 * allocations, as with any open file: it may mmap, REGISTER and FREE them.
 *
 * Errors: -EINVAL size 0, alignment not a power of two, flags set;
 * -ENOMEM not enough free memory on the provider (or a size larger than
 * it); -ENODEV unknown provider, or its device is going away; -ENOSPC no
 * handle left (2^20 - 1 allocations alive). Checked in this order: -EINVAL
 * (since ABI 1.13; before, an unknown provider came first), -ENODEV, then
 * the memory and the handle.
 * The allocation belongs to the open file: its last close (or exit) frees
 * it. A mapping holds the file, so while any mapping of the file's memory
 * is left, that last close comes at the last munmap.
 */
struct p2pdirect_alloc {
	__u32 provider;
	__u32 flags;
	__u64 size;
	__u64 alignment;
	__u64 handle;
	__u64 mmap_offset;
	__u64 bus_addr;
	__u64 provider_offset;
};

/**
 * struct p2pdirect_free - P2PDIRECT_IOC_FREE
 * @handle: in, from P2PDIRECT_IOC_ALLOC on this open file
 *
 * Errors: -ENOENT no such allocation on this file (never allocated, already
 * freed, or another file's).
 *
 * FREE takes the memory away from everyone at once and never waits for I/O:
 * registrations on it (of any file) are invalidated and every user mapping
 * of it is zapped (a later CPU access gets SIGBUS). What it does wait for
 * is being told: the invalidation callbacks of kernel consumers of it
 * (include/linux/p2pdirect.h) run before it returns (if the removal of its
 * device is revoking the same memory at that moment, they run in the
 * removal's thread, and FREE returns once that removal told everyone and
 * zapped the mappings, unless a signal interrupts that wait, or io_uring
 * task work queued for the calling thread, which the kernel flags the same
 * way (not for IORING_SETUP_DEFER_TASKRUN rings): since ABI 1.14; before, FREE returned at once,
 * registrations possibly still live), and the fences of a dma-buf exported
 * from it are waited for (see P2PDIRECT_IOC_EXPORT_DMABUF). An I/O in flight keeps
 * its pages until it ends; only then does the memory return to the
 * provider, never earlier. The handle may be reused as soon as FREE returns.
 */
struct p2pdirect_free {
	__u64 handle;
};

/* struct p2pdirect_dma_probe.client: the peer-memory client that claimed the range */
/* p2pdirect's own device memory: its mappings, and CPU mappings of dma-bufs exported from it */
#define P2PDIRECT_CLIENT_DEVMEM 1
#define P2PDIRECT_CLIENT_P2PDMA_USER 2	/* a user mapping of another provider's P2PDMA pages */
#define P2PDIRECT_CLIENT_EXTERNAL 3	/* a client another module registered (since 1.9) */

/* struct p2pdirect_dma_probe.flags */
#define P2PDIRECT_PROBE_WRITE 1	/* pin for writing (the device will write) */

/**
 * struct p2pdirect_dma_seg - one DMA segment
 * @addr: DMA address, as the device will use it
 * @len: bytes
 */
struct p2pdirect_dma_seg {
	__u64 addr;
	__u64 len;
};

/*
 * Stacked block devices (md, dm, NVMe multipath heads) are followed down to
 * their legs at most this many levels deep, to at most this many legs (leaf
 * block devices). DMA_PROBE past them fails with -ELOOP or -E2BIG; READ and
 * WRITE refuse such a device as one whose DMA devices cannot be found
 * (-EREMOTEIO, the kernel log naming the limit; -EOPNOTSUPP if its queue takes
 * no P2PDMA pages at all, as dm's) unless P2PDIRECT_IO_COMPAT bounces. Values
 * since 1.7, named since 1.10.
 */
#define P2PDIRECT_STACK_MAX_DEPTH 4
#define P2PDIRECT_STACK_MAX_LEGS 32

/**
 * struct p2pdirect_dma_probe - P2PDIRECT_IOC_DMA_PROBE
 * @addr: in, user address of the range (a "device pointer")
 * @size: in, bytes
 * @fd: in, an open block device whose DMA device (its NVMe controller) maps
 *      the range; for a stacked device (md, NVMe multipath) the controller
 *      of its first leg in name order, after every leg with a PCI device
 *      was checked (a leg with none, a loop device in an md array, is
 *      passed over here; READ and WRITE refuse such an array, whose queue
 *      takes no P2PDMA pages)
 * @flags: in, P2PDIRECT_PROBE_*
 * @segs: in, user pointer to @capacity struct p2pdirect_dma_seg
 * @capacity: in, room at @segs (0: only count)
 * @count: out, DMA segments of the mapping (those beyond @capacity not written)
 * @page_size: out, page size of the memory
 * @client: out, P2PDIRECT_CLIENT_*
 * @dma_pci_addr: out, the DMA device, P2PDIRECT_PCI_ADDR()
 * @pad: zero
 *
 * Runs the peer-memory path once, as a consumer would: acquire (the first
 * client that owns the range claims it), get_pages, dma_map for the block
 * device's DMA device; reports the DMA addresses; then dma_unmap, put_pages,
 * release.
 *
 * Errors: -ENXIO no client claims the range (not device memory: RAM, for
 * one); -EREMOTEIO the DMA device cannot reach the memory (P2P distance);
 * -EFAULT the range is not mapped at its start, or starts in device memory
 * and spans two mappings (one that starts in RAM is -ENXIO), or is mapped
 * without PROT_WRITE and P2PDIRECT_PROBE_WRITE is set; -EDQUOT the range
 * would pin more than max_pinned_mib (the memory is looked up first, so a
 * range that runs out of its mapping is -EFAULT, whatever its size: only
 * a mapping larger than max_pinned_mib, or another module's client's
 * memory, gives -EDQUOT); -EBADF @fd is not open; -ENOTBLK @fd
 * is not a block device; -ENODEV no PCI device under @fd (a loop device, a
 * RAM disk; a stacked device whose legs are all gone); -ELOOP, -E2BIG a
 * stacked device more than P2PDIRECT_STACK_MAX_DEPTH levels deep or over
 * P2PDIRECT_STACK_MAX_LEGS legs (since 1.7); -EOPNOTSUPP memory of another
 * module's client (P2PDIRECT_CLIENT_EXTERNAL: DMA mappings only) for a
 * stacked device of more than one leg, whose legs are checked on the pages;
 * -EOVERFLOW another module's client reports a page size of 4 GiB or more,
 * which @page_size cannot hold; -ETOOMANYREFS a page of the range holds
 * P2PDIRECT_PAGE_PINS_MAX pins already (since 1.21);
 * -EINVAL size 0, a wrapping range, unknown flags, pad. The errors of
 * another module's client (its acquire, get_pages and dma_map) and of the
 * DMA mapping itself (through an IOMMU: -ENOMEM, -EIO, -EINVAL) come back
 * as they are.
 */
struct p2pdirect_dma_probe {
	__u64 addr;
	__u64 size;
	__s32 fd;
	__u32 flags;
	__u64 segs;
	__u32 capacity;
	__u32 count;
	__u32 page_size;
	__u32 client;
	__u32 dma_pci_addr;
	__u32 pad;
};

/* struct p2pdirect_register.flags */
#define P2PDIRECT_REG_WRITE 1	/* devices will write into the buffer */

/**
 * struct p2pdirect_register - P2PDIRECT_IOC_REGISTER (cuFileBufRegister's role)
 * @addr: in, user address of device memory (a "device pointer")
 * @size: in, bytes
 * @flags: in, P2PDIRECT_REG_*
 * @client: out, P2PDIRECT_CLIENT_* that claimed the range
 * @id: out, names the registration for DEREGISTER and REG_QUERY (of this
 *      open file only); ids count up from 1 across all open files and are
 *      never reused, so their gaps show how many REGISTERs others made
 *      (some of which may have failed)
 *
 * Pins the range once, through the peer-memory client that owns it, for
 * reuse by I/O. The registration belongs to the open file; its last close
 * or exit drops it (after the last munmap of the file's memory, as
 * ALLOC says). When the memory goes away (FREE, the owner's close or exit,
 * device removal; for another provider's P2PDMA pages,
 * P2PDIRECT_CLIENT_P2PDMA_USER, that provider's driver about to unbind,
 * since ABI 1.14) the registration is invalidated: its pins are dropped and
 * REG_QUERY reports it P2PDIRECT_REG_DEAD.
 *
 * A range must lie in one mapping: one that starts in a p2pdirect mapping and
 * runs past its end (into RAM, another allocation, or another provider's
 * mapping) is refused with -EFAULT, here and by DMA_PROBE, READ and WRITE;
 * so is one that starts in another provider's P2PDMA mapping (a sysfs
 * p2pmem mapping) and runs out of it (since ABI 1.11; before, such a range
 * running into RAM gave -ENXIO and one running into another P2PDMA mapping
 * was taken). A range is what its first byte is: one that starts in RAM is
 * not device memory (-ENXIO), whatever follows it (since ABI 1.21: before,
 * one running into a p2pdirect mapping gave -EFAULT), and one that starts
 * where nothing is mapped is -EFAULT.
 *
 * Errors: -ENXIO not device memory (no client claims it); -EEXIST this file
 * already has a live registration of exactly this range; -EDQUOT the file would pin more
 * than the module parameter max_pinned_mib allows (counted in whole pages:
 * a 2-byte range across a page boundary pins 8 KiB), or the range alone is
 * larger; -ENOSPC the file holds 4096 registrations already, live or
 * invalidated (DEREGISTER an invalidated one to free its place); -EFAULT the
 * range is not mapped, or is mapped without PROT_WRITE and
 * P2PDIRECT_REG_WRITE is set (it pins for writing), starts in device memory
 * and spans two mappings
 * (or, for another provider's
 * P2PDMA pages, two P2PDMA regions: since ABI 1.14), or its memory was
 * freed (or its provider's driver began to unbind) while it was being
 * registered; -EOPNOTSUPP memory of a peer-memory client another
 * module registered (P2PDIRECT_CLIENT_EXTERNAL: DMA mappings only);
 * -ETOOMANYREFS a page of the range holds P2PDIRECT_PAGE_PINS_MAX pins
 * already (since 1.21); -EINVAL
 * size 0, a wrapping range, unknown flags. Checked in this order: -EINVAL;
 * then what the file holds (-EEXIST, -ENOSPC, -EDQUOT), before the memory is
 * looked up; then the memory: whose it is (-ENXIO, -EFAULT for a range that
 * runs out of its mapping or starts in none, -EOPNOTSUPP for another
 * module's client's memory), then its pins (-EFAULT, -ETOOMANYREFS).
 */
struct p2pdirect_register {
	__u64 addr;
	__u64 size;
	__u32 flags;
	__u32 client;
	__u64 id;
};

/* struct p2pdirect_reg_id.state */
#define P2PDIRECT_REG_LIVE 1	/* pinned, usable */
#define P2PDIRECT_REG_DEAD 2	/* invalidated: the memory went away */

/**
 * struct p2pdirect_reg_id - P2PDIRECT_IOC_DEREGISTER, P2PDIRECT_IOC_REG_QUERY
 * @id: in, from P2PDIRECT_IOC_REGISTER on this open file
 * @state: out, P2PDIRECT_REG_* (for DEREGISTER: the state it had)
 * @pad: zero
 *
 * Errors: -ENOENT no such registration on this file (never made, already
 * deregistered, or another file's).
 *
 * DEREGISTER gives the registration's share of max_pinned_mib and of
 * @pinned_bytes (STATS) back at once; a READ or WRITE still in flight on it
 * keeps its pages pinned until it ends, uncounted meanwhile.
 */
struct p2pdirect_reg_id {
	__u64 id;
	__u32 state;
	__u32 pad;
};

/* struct p2pdirect_io.flags */
#define P2PDIRECT_IO_REGISTERED 1	/* @addr is a registration id */
#define P2PDIRECT_IO_COMPAT 2	/* bounce through host memory if unreachable */

/**
 * struct p2pdirect_io - P2PDIRECT_IOC_READ, P2PDIRECT_IOC_WRITE (cuFileRead's
 * and cuFileWrite's role)
 * @fd: in, a raw block device (an NVMe namespace, a partition of one, an md
 *	array or NVMe multipath head over them) or a regular file on a file
 *	system with a block device (ext4, xfs), opened with O_DIRECT and with the
 *	access mode the operation needs (READ: readable, WRITE: writable)
 * @flags: in, P2PDIRECT_IO_*
 * @addr: in, a device pointer (user address of device memory; a multiple of
 *	the logical block size), or with P2PDIRECT_IO_REGISTERED the id of a
 *	registration of this open file (whose start address plus @buf_offset
 *	must then be such a multiple: -EINVAL, after the registration's
 *	-ERANGE and -EPERM checks)
 * @size: in, bytes to move; a multiple of the logical block size
 * @file_offset: in, byte offset in @fd; a multiple of the logical block size
 * @buf_offset: in, byte offset from @addr (or from the registration's start);
 *	a multiple of the logical block size
 * @bytes: out, bytes moved
 * @p2p_bytes: out, of @bytes, moved by DMA between the device and the memory
 * @bounce_bytes: out, of @bytes, moved through host memory (COMPAT)
 * @zeroed_bytes: out, of @bytes, read from holes or unwritten extents of a
 *	file, which the file system zeroes with the CPU; @p2p_bytes +
 *	@bounce_bytes + @zeroed_bytes = @bytes (since 1.13 also for a bounced
 *	READ, whose hole bytes were counted in @bounce_bytes as well). Holes
 *	are found with SEEK_DATA/SEEK_HOLE on a private open of the file (an
 *	open that fanotify and inotify see): an unwritten extent whose pages
 *	are cached clean counts as data there, and as P2P here. A file with a
 *	lease on it is not opened (the open would break a write lease, which
 *	read(2) does not; any lease is enough, also a read lease or a
 *	delegation that a read-only open would leave alone): its holes count
 *	as moved (@p2p_bytes, or @bounce_bytes when bounced) and @zeroed_bytes
 *	is 0 (since 1.16)
 * @dma_pci_addr: out, the PCI function that did the DMA (P2PDIRECT_PCI_ADDR);
 *	for a stacked device, the controller of its first leg in name order; 0
 *	when the block device takes no P2PDMA pages (dm, loop) or the file
 *	system serves O_DIRECT through the page cache, and for a READ at or
 *	past the end of a raw block device (nothing moved, no device asked; a
 *	file READ at or past its end names the controller)
 * @pad: zero
 *
 * READ moves [file_offset, file_offset + size) of @fd into the memory at
 * @addr + @buf_offset; WRITE the other way. The NVMe controller DMAs straight
 * into or out of the device memory: no CPU copy, no bounce buffer. Before any
 * I/O the module checks that the controller (each leg's controller, for an
 * md array or a multipath head) can reach the memory (P2P distance); if one
 * cannot, the call fails with -EREMOTEIO, unless
 * P2PDIRECT_IO_COMPAT is set, in which case the data goes through host memory
 * and is counted in @bounce_bytes.
 *
 * Partial transfers follow pread/pwrite: one call moves at most
 * MAX_RW_COUNT bytes (2 GiB - 4 KiB), the rest is left (@bytes < @size;
 * the memory is still checked for all of @size); a READ at or past the end
 * of the file or device moves 0 bytes, one that crosses it stops there
 * (@bytes < @size); a WRITE to a file may extend it, one to a block device
 * that crosses its end stops there (@bytes < @size) and one at or past it
 * fails with -ENOSPC. The memory is looked up before the end is tested (since ABI
 * 1.11; before, a raw block device's end was tested first): an unknown,
 * stale or too short registration, a READ into one without REG_WRITE, a
 * pointer to RAM, out of its mapping or over max_pinned_mib get their error
 * there too; whether the device can reach the memory is not asked at or
 * past the end of a raw block device, where nothing moves. A file's end is
 * found by its file system, in the read itself (with its locks and hooks),
 * so a file READ at or past it is checked like any other: on a device that
 * cannot reach the memory or do P2PDMA it fails like a READ of data, and
 * with COMPAT it moves 0 bytes. When the device fails part of a transfer to
 * a raw block device, @bytes is the length of the part from @file_offset
 * that completed without error and the call succeeds if that is not 0
 * (else it returns the error, e.g. -EIO); memory and blocks after that point
 * may or may not have been written. For a file it is what the file system's
 * direct I/O returns, which for ext4 and xfs (iomap) is the error for the
 * whole call. A WRITE to a file opened O_APPEND appends, whatever
 * @file_offset says, as pwrite(2) does on Linux; @file_offset must still
 * be a multiple of the logical block size and not negative (-EINVAL), as
 * xfs's O_DIRECT pwrite(2) requires (ext4's does not look at it), and the
 * page-cache test below is made at @file_offset, where ext4 and xfs make
 * theirs before they move the write to the end. The file's data must be on
 * its file system's block device (an xfs realtime file or a multi-device
 * file system's other devices are not checked for reachability).
 *
 * On a raw block device READ and WRITE refuse what read(2) and write(2)
 * refuse, and run the same hooks: rw_verify_area() (offsets, the LSM's
 * file_permission, fanotify permission events) before any I/O, also at or
 * past the device's end (since 1.16), and the fsnotify access/modify event
 * after it. Where several things are wrong, the checks come in this order:
 * flags and size; the fd, its kind and access mode, the device's read-only
 * and swap state; the alignment; the offset's sign; rw_verify_area(); the
 * memory; the device's end. write(2) tests the end before the alignment,
 * so a WRITE at the end with a size off the block size gets -EINVAL here
 * and -ENOSPC from pwrite(2). On a file the order is: flags and size; the
 * fd, its kind and access mode; the read-only state of its file system's
 * device (-EROFS); the alignment; the offset's sign; the file system's
 * page-cache path (-EOPNOTSUPP without COMPAT); the memory; then what the
 * file system's read or write finds (since ABI 1.21, before which the
 * alignment came before -EROFS and the page-cache path before the sign).
 *
 * A WRITE to a raw block device opened O_DSYNC (or O_SYNC) is durable when
 * it returns, as write(2)'s is: its bios are FUA writes, and a synchronous
 * WRITE then flushes the device's cache (a failed flush fails the call);
 * since ABI 1.15, before which O_DSYNC was ignored on raw block devices.
 * A file's durability is its file system's (O_DSYNC reaches it in the
 * kiocb). A file whose file system serves
 * O_DIRECT through the page cache (STATX_DIOALIGN reports a memory
 * alignment of 0: ext4 with journalled data, inline data, verity; and since
 * ABI 1.13 a range off its offset alignment, STATX_DIO_READ_ALIGN's for a
 * READ: an xfs reflinked file written off its allocation unit) would be
 * CPU copies: refused with -EOPNOTSUPP, or with COMPAT bounced and counted
 * in @bounce_bytes, never in @p2p_bytes. A fallback a file system does not
 * report (ext4's block-mapped files written into a hole) is not seen, nor
 * is a FUSE file system on a block device (fuseblk: ntfs-3g, exfat-fuse),
 * whose daemon copies the data with the CPU: its bytes are counted in
 * @p2p_bytes; do not use such files for P2P I/O.
 *
 * Errors: -EBADF @fd is not open, or lacks the access mode (WRITE on an
 * O_RDONLY fd, READ on an O_WRONLY fd; tested before the kind, as read(2)
 * and write(2) do: a WRITE to a directory opened O_RDONLY, or a READ from a
 * pipe's write end, gets -EBADF); -EINVAL size 0, size or an offset
 * not a multiple of the logical block size, @fd not opened with O_DIRECT,
 * @fd a character device or another kind of file, unknown flags, pad;
 * -EISDIR @fd is a directory; -ESPIPE @fd is a pipe or socket;
 * -EOPNOTSUPP the file's file system has no block device (tmpfs; procfs
 *	and sysfs files cannot be opened with O_DIRECT, so -EINVAL),
 * or the block device cannot do P2PDMA, or the file system would serve
 * O_DIRECT through the page cache (both: without COMPAT); -ENXIO @addr is
 * not device memory (no peer-memory client claims it: RAM, for one);
 * -EFAULT the range runs past the end of its device-memory mapping, spans
 * two mappings (one that starts in RAM is -ENXIO), or is not mapped, its memory was freed or revoked while it
 * stays mapped, or a READ's memory is mapped without PROT_WRITE (the pages
 * are pinned for writing); -EDQUOT the range would pin more than
 * max_pinned_mib; -ETOOMANYREFS a page of the range holds
 * P2PDIRECT_PAGE_PINS_MAX pins already (since 1.21); -ENOENT no such registration (also for an I/O that a
 * DEREGISTER of it raced, where the I/O did not go ahead); -ERANGE the
 * range runs past the end of the registration; -ESTALE the registration
 * was invalidated (its memory went away); -EPERM READ into a registration made without
 * P2PDIRECT_REG_WRITE; -EREMOTEIO the block device's DMA device cannot reach
 * the memory and COMPAT is not set; -ENOSPC WRITE past the end of a block
 * device, or, like -EIO, an earlier failed write-back of a raw block
 * device's cached data in the range, reported to READ and WRITE alike (as
 * an O_DIRECT read(2) reports it); -EPERM WRITE to a read-only block device (write(2)'s errno; ABI
 * 1.5 said -EROFS); -EROFS WRITE to a file whose file system's block device
 * was made read-only after the mount (the block layer would only log such a
 * write); -ETXTBSY WRITE to an active swap device; -EOPNOTSUPP @addr is
 * memory of a peer-memory client another module registered (it serves DMA
 * mappings only, see P2PDIRECT_CLIENT_EXTERNAL); -EINVAL also
 * @file_offset past 2^63 - 1 (a negative loff_t) or @addr + @buf_offset
 * wrapping; -EIO and others: the device or file system failed the
 * transfer.
 */
struct p2pdirect_io {
	__s32 fd;
	__u32 flags;
	__u64 addr;
	__u64 size;
	__u64 file_offset;
	__u64 buf_offset;
	__u64 bytes;
	__u64 p2p_bytes;
	__u64 bounce_bytes;
	__u64 zeroed_bytes;
	__u32 dma_pci_addr;
	__u32 pad;
};

/* struct p2pdirect_stat.kind */
#define P2PDIRECT_STAT_PROVIDER 1	/* @id: PCI address of the memory's BAR owner */
#define P2PDIRECT_STAT_BLOCK 2		/* @id: dev_t of the block device (major << 20 | minor) */

/**
 * struct p2pdirect_stat - one entry of P2PDIRECT_IOC_STATS (and of the
 * debugfs file p2pdirect/stats), for a device-memory provider or a block device
 * @kind: P2PDIRECT_STAT_*
 * @id: see P2PDIRECT_STAT_*
 * @reads: READs that moved data or failed (a READ refused once its fd was
 *	found good, by an argument check too, counts as failed in the block
 *	device's row, and in the provider's once its memory was found; one
 *	refused before, for its argument's flags or size or for the fd
 *	itself (-EBADF; the fd's kind: -EISDIR, -ESPIPE, -EINVAL, also
 *	without O_DIRECT, -EOPNOTSUPP for tmpfs; -EPERM and -ETXTBSY of a
 *	WRITE), counts nowhere, as does an io_uring command that io_uring's
 *	worker would start for a task being killed (-ECANCELED, since 1.20))
 * @writes: WRITEs that moved data or failed (as @reads)
 * @errors: of those, the ones that failed
 * @bytes_read: bytes READ moved
 * @bytes_written: bytes WRITE moved
 * @p2p_bytes: of both, moved device to device
 * @bounce_bytes: of both, moved through host memory (COMPAT)
 * @zeroed_bytes: of @bytes_read, zeroed by the CPU (holes, unwritten
 *	extents; not counted for a file with a lease, see struct p2pdirect_io)
 * @pinned_bytes: providers: device memory pinned now (registrations and I/O
 *	in flight; since 1.9 also dma-buf importers' mappings, each importer's
 *	mapping counted once, and kernel consumers' ranges); not reset.
 *	Registrations count whole pages; an I/O on a device pointer counts
 *	the bytes it moves (at most MAX_RW_COUNT, and not past a block
 *	device's end), a dma-buf mapping the dma-buf's size
 * @lat_min_ns: fastest I/O (0 before the first)
 * @lat_avg_ns: mean over all I/Os
 * @lat_max_ns: slowest I/O
 */
struct p2pdirect_stat {
	__u32 kind;
	__u32 id;
	__u64 reads;
	__u64 writes;
	__u64 errors;
	__u64 bytes_read;
	__u64 bytes_written;
	__u64 p2p_bytes;
	__u64 bounce_bytes;
	__u64 zeroed_bytes;
	__u64 pinned_bytes;
	__u64 lat_min_ns;
	__u64 lat_avg_ns;
	__u64 lat_max_ns;
};

/* Most entries STATS returns (providers and block devices together). */
#define P2PDIRECT_STATS_MAX_ENTRIES 256

/* struct p2pdirect_stats.flags */
#define P2PDIRECT_STATS_RESET 1	/* zero the counters after reading them */

/**
 * struct p2pdirect_stats - P2PDIRECT_IOC_STATS (nvidia-fs's stats file role)
 * @entries: in, user pointer to an array of struct p2pdirect_stat
 * @capacity: in, entries the array holds (0: just count)
 * @count: out, entries that exist (may exceed @capacity)
 * @flags: in, P2PDIRECT_STATS_*
 * @pad: zero
 *
 * An entry exists for every provider and block device that has seen I/O
 * since the module loaded (a provider also once its memory was pinned: a
 * REGISTER or a dma-buf importer's mapping, counted in @pinned_bytes), up
 * to P2PDIRECT_STATS_MAX_ENTRIES (since 1.10): devices after that many are
 * not counted (the kernel log says so, rate limited), so an array of that
 * many entries always holds them all.
 * Counters are updated without a lock: each is exact, but entries read
 * while I/O runs may show an I/O in some counters and not yet in others.
 * With P2PDIRECT_STATS_RESET, the entries copied out are reset; those past
 * @capacity keep their counts (since 1.10; before, they were reset too).
 * A reset takes each counter in turn, so an I/O that ends during it may be
 * split between what this STATS reports and what the next one does (its
 * bytes in one, its count in the other); nothing is lost or counted twice.
 * @count is read after the entries (since 1.13): a device that gets its
 * first entry meanwhile is in it.
 * Writing anything to debugfs p2pdirect/stats also resets the counters.
 *
 * Errors: -EINVAL unknown flags, pad; -EBADF RESET on a file not open for
 * writing.
 */
struct p2pdirect_stats {
	__u64 entries;
	__u32 capacity;
	__u32 count;
	__u32 flags;
	__u32 pad;
};

#define P2PDIRECT_IOC_LIST_PROVIDERS \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 1, struct p2pdirect_list_providers)
#define P2PDIRECT_IOC_ALLOC \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 2, struct p2pdirect_alloc)
#define P2PDIRECT_IOC_FREE \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 3, struct p2pdirect_free)
#define P2PDIRECT_IOC_DMA_PROBE \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 4, struct p2pdirect_dma_probe)
#define P2PDIRECT_IOC_REGISTER \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 5, struct p2pdirect_register)
#define P2PDIRECT_IOC_DEREGISTER \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 6, struct p2pdirect_reg_id)
#define P2PDIRECT_IOC_REG_QUERY \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 7, struct p2pdirect_reg_id)
#define P2PDIRECT_IOC_READ \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 8, struct p2pdirect_io)
#define P2PDIRECT_IOC_WRITE \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 9, struct p2pdirect_io)
#define P2PDIRECT_IOC_STATS \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 10, struct p2pdirect_stats)

/**
 * struct p2pdirect_uring_io - READ or WRITE submitted through io_uring
 * (since ABI 1.8)
 * @fd: as struct p2pdirect_io
 * @flags: as struct p2pdirect_io
 * @addr: as struct p2pdirect_io
 * @size: as struct p2pdirect_io
 * @file_offset: as struct p2pdirect_io
 * @buf_offset: as struct p2pdirect_io
 *
 * An io_uring SQE with opcode IORING_OP_URING_CMD, fd the /dev/p2pdirect
 * file, cmd_op P2PDIRECT_URING_CMD_READ or P2PDIRECT_URING_CMD_WRITE, and
 * this struct inline in the SQE's command area, which needs 128-byte SQEs
 * (a ring set up with IORING_SETUP_SQE128, or the opcode
 * IORING_OP_URING_CMD128 on one set up with IORING_SETUP_SQE_MIXED, which
 * the kernel hands over the same way; else -EINVAL). The kernel reads
 * the struct at submission, and for a command io_uring's worker issues
 * again, from io_uring's copy of the SQE taken during the submission (so
 * rewriting the SQ entry after io_uring_enter() returned changes
 * nothing). The 40 bytes of the command area after
 * it are reserved and must be zero, and sqe->uring_cmd_flags must be 0
 * (no IORING_URING_CMD_FIXED: memory is named by @addr, as for the ioctls).
 * The SQE fields the command does not use must be zero too (since ABI
 * 1.11): addr, len, buf_index and file_index (splice_fd_in, addr_len);
 * io_uring itself refuses ioprio (-EINVAL): clear the whole 128-byte SQE
 * before filling it in. The other fields are io_uring's own (opcode,
 * flags, fd, user_data, personality).
 *
 * The same checks, flags and errors as P2PDIRECT_IOC_READ/WRITE hold (the
 * fd is looked up in the submitting process; the open mode of the
 * /dev/p2pdirect file applies as for the ioctls: -EBADF on O_RDONLY), plus:
 *  -EINVAL  the ring does not use 128-byte SQEs, reserved bytes not zero,
 *           uring_cmd_flags set, an unused SQE field set (since 1.11);
 *  -EBUSY   the /dev/p2pdirect file already has
 *           P2PDIRECT_URING_MAX_INFLIGHT commands in flight. The places
 *           are the open file's, shared by every ring and process using
 *           it: a submitter that does not run its task work (stopped, or
 *           a DEFER_TASKRUN ring it does not enter) keeps its places, and
 *           the others get -EBUSY until it does. A transfer
 *           holds its place from its issue until its CQE is posted (from
 *           task work in the submitting task), so MAX + 1 READs submitted
 *           in one io_uring_enter, none of which goes to io_uring's worker,
 *           give one -EBUSY; a command that goes to the worker gives its
 *           place back and takes one again when the worker issues it, and
 *           one that ends at its issue (refused by the checks, nothing to
 *           move, or a COMPAT bounce, which runs in the worker) gives it
 *           back when its issue returns, its CQE queued.
 *
 * Completion: cqe->res is the number of bytes moved (short at the end of a
 * block device or file, and after a failed part, as the ioctls) or -errno.
 * io_uring breaks an IOSQE_IO_LINK chain at a command only when res is
 * negative: a short READ does not stop the WRITE linked after it (test res
 * against @size where it matters), and IORING_OP_LINK_TIMEOUT cannot
 * cancel a command issued inline (the command runs on, as with
 * IORING_OP_ASYNC_CANCEL below). A raw WRITE on an fd opened O_DSYNC or
 * O_SYNC issued through io_uring is made durable by its FUA bios alone, as
 * the block layer's own asynchronous direct writes are: no cache flush
 * follows it (the ioctl sends one, see WRITE), so no flush error can fail
 * it; a COMPAT one runs the ioctl's path in io_uring's worker, flush
 * included. A command submitted with IOSQE_ASYNC is issued by io_uring's
 * worker, as a COMPAT one is (see below).
 * With 32-byte CQEs (IORING_SETUP_CQE32), big_cqe[0] holds the counts the
 * ioctls return in struct p2pdirect_io: bits 0-31 p2p_bytes, bits 32-63
 * bounce_bytes (one I/O moves less than 2 GiB); zeroed_bytes is bytes -
 * p2p_bytes - bounce_bytes (since 1.13 also when the I/O bounced), and is
 * counted in STATS; big_cqe[1] is 0. On a ring set up with IORING_SETUP_CQE_MIXED
 * a command's result comes in a 32-byte CQE (IORING_CQE_F_32 in cqe->flags)
 * with the same big_cqe, except where it is returned at the issue (an unknown
 * cmd_op, -EBADF for the open mode, the -EINVAL and -EBUSY cases above, a
 * write-back error of the range's cached data, -ENOMEM for the command's own
 * state; a refusal of the checks, -ENOMEM among them, comes in a 32-byte
 * CQE like a transfer's result, and so does the -ECANCELED of a worker
 * command of a task being killed, since 1.20) or by io_uring itself
 * (-ECANCELED for a command cancelled before a worker started it): those
 * come in 16-byte CQEs. Test IORING_CQE_F_32 before reading big_cqe.
 *
 * Ring setups: with IORING_SETUP_SQPOLL the SQ thread issues the commands
 * and runs their completion task work (it shares the files and memory of the
 * task that created the ring). With IORING_SETUP_DEFER_TASKRUN the task work
 * that posts a CQE, counts the command in STATS and gives back its place
 * runs when the submitter calls io_uring_enter() with
 * IORING_ENTER_GETEVENTS, and a completion wakes a waiting submitter
 * lazily: one waiting for N CQEs is woken once N commands are done (as
 * io_uring's own reads). io_uring counts the wait in CQ slots, and on an
 * IORING_SETUP_CQE_MIXED ring each of these CQEs (32 bytes) takes two: wait
 * for at most as many CQEs as commands in flight. With IORING_SETUP_IOPOLL
 * the commands are not polled (no uring_cmd_iopoll): they complete by
 * interrupt, and io_uring_enter() with GETEVENTS returns without a CQE
 * while no request of the ring is polled (liburing's wait loop re-enters
 * until the CQE is posted). The /dev/p2pdirect file may be a registered file of the ring
 * (IOSQE_FIXED_FILE); @fd stays a file descriptor of the submitting process.
 * IORING_OP_ASYNC_CANCEL finds no command issued inline (-ENOENT);
 * one waiting for a worker is cancelled before it starts (-ECANCELED); the
 * cancel of one a worker runs returns -EALREADY, and the command completes.
 *
 * Transfers complete asynchronously, with no thread per I/O: at submission
 * the fd is looked up, the memory pinned and the bios (raw block device) or
 * an asynchronous O_DIRECT kiocb (regular file) submitted; their completion
 * releases the pins and posts the CQE. A file READ is issued without
 * blocking (IOCB_NOWAIT); one that would block (a lock held, extents not
 * read in yet) is issued by one of io_uring's worker threads instead, and
 * so is every file WRITE; either way the worker only submits it.
 * P2PDIRECT_IO_COMPAT runs the synchronous path in a worker. A raw range
 * whose cached pages must first be written back (or, for a WRITE, dropped)
 * goes to a worker too, which does that cache work and then submits the
 * bios as above. For what a worker issues, the fd lookup and the pinning
 * happen when the worker starts, after io_uring_enter() returned, so a
 * FREE, munmap or close right after the submission can make them fail
 * (-ENXIO, -EFAULT, -EBADF; registered memory: -ENOENT, -ESTALE after a
 * DEREGISTER or an invalidation), and an fd number or an address reused
 * meanwhile (dup2() over @fd, a new mmap at @addr) is what the worker's
 * command uses: keep @fd and the memory as they are until the CQE, as
 * for any asynchronous I/O. A worker command that has not started
 * when its ring is closed ends with -ECANCELED, and so does one a worker
 * starts for a process being killed or exiting (since ABI 1.20; io_uring's
 * workers go on through their queue at exit while the ring lives), while
 * the one a worker runs then stops at its next 1 MiB chunk (COMPAT: its
 * CQE gives the bytes moved) or ends when its bios do. An
 * I/O in flight holds its memory like an ioctl does: FREE and DEREGISTER
 * revoke at once; close and process exit free a file's allocations when
 * the file's last reference goes (a mapping holds one, see struct
 * p2pdirect_alloc, and so does io_uring for each command in flight on the
 * file, until its CQE); the memory is reused only after the I/O released
 * it. A started command
 * cannot be cancelled; ring teardown waits for it (it ends when its bios
 * do). A file READ the file system gives up after part of it went (rare:
 * xfs does, at an extent whose lock another thread holds) runs again, whole
 * and blocking, in a kernel worker, which lets go of its pins when it is
 * done (since ABI 1.19; debugfs p2pdirect/file_read_retries counts these):
 * the same I/O, with the submitter's I/O priority and no second run of the
 * permission hooks; its CQE then follows as any other's. Only if the kernel has no memory
 * for the worker's work item does the retry run in the submitter's task
 * work, as it always did before 1.19: holding the pins until the
 * submitter runs its task work, and ending with -ECANCELED if the ring is
 * closing or the task exiting by then. STATS counts a
 * command, and its pinned_bytes drop, when it ends: a command refused by the
 * checks when its issue returns, a COMPAT bounce when the worker has done
 * it (their CQEs queued then, posted by io_uring, with
 * IORING_SETUP_DEFER_TASKRUN only once the submitter enters for them); a
 * transfer when its CQE is posted, or, for a ring closed or a process
 * exiting under it, when its completion runs (a file READ's hole bytes then
 * count as P2P: see the README).
 */
struct p2pdirect_uring_io {
	__s32 fd;
	__u32 flags;
	__u64 addr;
	__u64 size;
	__u64 file_offset;
	__u64 buf_offset;
};

/* struct p2pdirect_export_dmabuf.flags */
#define P2PDIRECT_EXPORT_CLOEXEC 1	/* the new fd is close-on-exec */

/**
 * struct p2pdirect_export_dmabuf - P2PDIRECT_IOC_EXPORT_DMABUF (since ABI 1.9)
 * @handle: in, an allocation of this open file (from P2PDIRECT_IOC_ALLOC)
 * @offset: in, where the exported range starts in the allocation; page aligned
 * @size: in, bytes; page aligned; 0 exports from @offset to the end
 * @flags: in, P2PDIRECT_EXPORT_*
 * @fd: out, the dma-buf file descriptor (opened read-write)
 *
 * Exports a range of device memory as a dma-buf that other drivers import
 * (an RDMA NIC through ibv_reg_dmabuf_mr, another GPU, a DMA engine). The
 * dma-buf gives no copy of the memory: it is a second name for the same
 * bytes, like the mmap of the allocation.
 *
 * Importers: an attach is refused unless the importer allows peer-to-peer
 * DMA (allow_peer2peer) and can be revoked (it has an invalidate_mappings
 * callback): -EOPNOTSUPP; or if its device cannot reach the memory (not a
 * PCI device, or the PCI topology and host bridge give no P2P path: the
 * P2PDMA distance of LIST_PROVIDERS is -1): -EREMOTEIO. The kernel log says which.
 * A mapping's DMA addresses are those the importer's device must use: the
 * PCI bus addresses behind a common switch, an IOMMU mapping through the
 * host bridge where the bridge allows P2P. mmap() of the dma-buf fd maps the
 * memory for the CPU as the /dev/p2pdirect mapping does (MAP_SHARED only,
 * never executable: -EINVAL, -EPERM; not inherited by fork), any page-aligned
 * part of it (a range past the dma-buf's end: -EINVAL).
 *
 * Revocation: FREE of the allocation, close of the /dev/p2pdirect file that
 * owns it (or process exit) and the removal of the memory's device revoke
 * every dma-buf of it, after the allocation's kernel consumers and then its
 * registrations were told (since ABI 1.16; before, all of them in the order
 * they came, so a fence could hold a registration live; kernel consumers
 * before registrations since 1.18): each importer is told
 * through its
 * invalidate_mappings callback, every fence on the dma-buf's reservation
 * object is waited for, uninterruptibly (importers' DMA fences, which the
 * dma-fence rules bound; a fence someone attached that never signals, for
 * example a debugging sw_sync fence imported with
 * DMA_BUF_IOCTL_IMPORT_SYNC_FILE, holds FREE, close and removal until it
 * does), CPU mappings of it are zapped (SIGBUS after), and later
 * maps, attaches and mmaps fail with -ENODEV (an importer that cannot take
 * P2P pages or revocation is refused its attach with -EOPNOTSUPP first, a
 * MAP_PRIVATE or executable mmap with -EINVAL or -EPERM first). The memory returns to the
 * provider only after every importer unmapped and the fences retired;
 * device removal waits for that. The dma-buf fd itself stays valid
 * (closing it is the owner's business) but is dead. A dma-buf holds the
 * module: rmmod fails while one is open.
 *
 * Errors: -ENOENT no such allocation on this file; -EINVAL unknown flags,
 * @offset or @size not page aligned, or the range not inside the
 * allocation; -EBADF /dev/p2pdirect not open O_RDWR (the dma-buf is
 * read-write); -ENODEV the memory's device is going away, or a FREE of the
 * allocation racing the export revoked it first; -EMFILE no free
 * file descriptor. Checked in this order (since ABI 1.13): -EBADF (before
 * the argument is read), the flags, the allocation (-ENOENT), the range
 * (-EINVAL), -ENODEV, and -EMFILE last: an export refused for its argument
 * is refused so whether or not a descriptor is free. Before 1.13 the flags
 * came before the open mode and the descriptor before the allocation.
 */
struct p2pdirect_export_dmabuf {
	__u64 handle;
	__u64 offset;
	__u64 size;
	__u32 flags;
	__s32 fd;
};

#define P2PDIRECT_IOC_EXPORT_DMABUF \
	_IOWR(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 11, struct p2pdirect_export_dmabuf)

/* At most this many io_uring commands in flight per open /dev/p2pdirect file. */
#define P2PDIRECT_URING_MAX_INFLIGHT 256

/*
 * cmd_op of IORING_OP_URING_CMD (not ioctls: -ENOTTY through ioctl(2)); an
 * unknown cmd_op completes with -ENOTTY.
 */
#define P2PDIRECT_URING_CMD_READ \
	_IOW(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 16, struct p2pdirect_uring_io)
#define P2PDIRECT_URING_CMD_WRITE \
	_IOW(P2PDIRECT_IOCTL_MAGIC, P2PDIRECT_IOCTL_BASE + 17, struct p2pdirect_uring_io)

#endif /* _UAPI_LINUX_P2PDIRECT_H */
