/* SPDX-License-Identifier: GPL-2.0 */
/*
 * p2pdirect's kernel API (GPL symbols of p2pdirect.ko): its peer-memory
 * registry, open to other modules.
 *
 * Client side: a driver that owns device memory user space maps (another
 * GPU driver) registers the callback table of OFED's struct
 * peer_memory_client, field for field, so an existing client ports by
 * renaming its register call. p2pdirect asks its clients in registration
 * order (its two built-in clients first: its own device memory, then user
 * mappings of P2PDMA pages) which one owns a user range; the first that
 * claims it pins and maps it. A client registered here serves DMA_PROBE and
 * the consumer side below; READ, WRITE and REGISTER need P2PDMA pages and
 * refuse its memory (-EOPNOTSUPP).
 *
 * Consumer side: a driver that DMAs to user memory (an RDMA NIC) takes a
 * user range of the calling process through whichever client owns it, maps
 * it for its device and is told when the memory goes away.
 */
#ifndef _LINUX_P2PDIRECT_H
#define _LINUX_P2PDIRECT_H

#include <linux/types.h>

struct device;
struct sg_table;

#define P2PDIRECT_PEER_NAME_MAX 64
#define P2PDIRECT_PEER_VERSION_MAX 16

/**
 * struct p2pdirect_peer_memory_client - OFED's struct peer_memory_client
 * @name: the client's name (NUL-terminated, unique among clients)
 * @version: free-form, NUL-terminated
 * @acquire: 1 if the client owns [@addr, @addr + @size) of the calling
 *	process (it sets *@client_context), 0 to decline, -errno on failure;
 *	@peer_mem_private_data and @peer_mem_name are NULL
 * @get_pages: pins the range (for writing if @write; @force is always 1)
 *	into @sg_head (zeroed storage the client fills, with sg_alloc_table()
 *	or not); @core_context names this claim in the invalidation callback;
 *	0 or -errno
 * @dma_map: maps the pinned range for @dma_device into @sg_head's DMA
 *	entries and sets *@nmap to their count; 0 or -errno. The entries may
 *	cover the whole pages (of @get_page_size) the range touches, as OFED's
 *	clients' do: p2pdirect then cuts them to the range for its consumers,
 *	as OFED's core does; entries of any other total length are passed on
 *	as they are. Between one get_pages and its put_pages, dma_map may be
 *	called again after dma_unmap (a consumer that unmaps and maps again,
 *	or an -E2BIG retry), possibly for another device, on the same
 *	@sg_head, which is not zeroed in between (OFED maps once): whatever a
 *	dma_map allocates, its dma_unmap must free
 * @dma_unmap: undoes @dma_map
 * @put_pages: undoes @get_pages (frees what it put in @sg_head)
 * @get_page_size: the page size of the memory behind the context
 * @release: the context goes (after @put_pages if pages were got)
 * @get_context_private_data: unused by p2pdirect (kept for the layout)
 * @put_context_private_data: unused by p2pdirect (kept for the layout)
 *
 * acquire, get_pages, dma_map, dma_unmap, put_pages and release are
 * required. Every callback may sleep; p2pdirect calls one context's
 * callbacks one at a time, under a lock of that claim (a consumer's
 * dma_map waits for it), and none with a lock of its own held otherwise.
 * They run in the thread of whoever drives the claim: a process's ioctl
 * (DMA_PROBE, REGISTER, FREE, close), a consumer's p2pdirect_peer_*() call,
 * or the client's own invalidation or unregister call, whose locks are
 * then held around them: a callback must not take a lock the client holds
 * across those calls.
 */
struct p2pdirect_peer_memory_client {
	char name[P2PDIRECT_PEER_NAME_MAX];
	char version[P2PDIRECT_PEER_VERSION_MAX];
	int (*acquire)(unsigned long addr, size_t size, void *peer_mem_private_data,
		       char *peer_mem_name, void **client_context);
	int (*get_pages)(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *sg_head, void *client_context, u64 core_context);
	int (*dma_map)(struct sg_table *sg_head, void *client_context,
		       struct device *dma_device, int dmasync, int *nmap);
	int (*dma_unmap)(struct sg_table *sg_head, void *client_context,
			 struct device *dma_device);
	void (*put_pages)(struct sg_table *sg_head, void *client_context);
	unsigned long (*get_page_size)(void *client_context);
	void (*release)(void *client_context);
	void *(*get_context_private_data)(u64 peer_id);
	void (*put_context_private_data)(void *context);
};

/*
 * What the client calls when memory it handed out goes away: @reg_handle
 * from the register call, @core_context from @get_pages. p2pdirect tells the
 * consumer keeping the claim, which lets it go (dma_unmap, put_pages,
 * release), or waits for a claim in passing (a DMA_PROBE) to be let go;
 * when it returns 0, p2pdirect no longer uses that memory. It runs the
 * consumer's invalidation callback and the client's own dma_unmap,
 * put_pages and release in the calling thread. May sleep; not from within
 * a callback of the same claim, nor holding a lock its callbacks (or the
 * consumer's) take, nor from memory reclaim (it waits for claims whose
 * holders allocate). A call that runs while the client's unregister call
 * runs is served; one made after that call returned gets -EINVAL and
 * touches nothing of the gone client. An unknown @core_context (a claim
 * already let go) returns 0 at once. Returns 0 or -EINVAL (no such
 * registered client).
 */
typedef int (*p2pdirect_invalidate_peer_memory)(void *reg_handle, u64 core_context);

/*
 * Registers @client (which must stay valid until unregistered) after the
 * existing clients and stores the invalidation function in
 * *@invalidate_callback (if not NULL; it may be stored also when the
 * registration fails). Returns the handle for unregistering and invalidating,
 * or NULL (a name in use, the built-in clients' "p2pdirect-devmem" and
 * "p2pdma-user" included, no memory, a bad table: the kernel log says which).
 */
void *p2pdirect_register_peer_memory_client(const struct p2pdirect_peer_memory_client *client,
					    p2pdirect_invalidate_peer_memory *invalidate_callback);

/*
 * Unregisters: no new claim reaches the client; every claim it holds is
 * invalidated as if the client had called the invalidation function (the
 * consumers' callbacks and the client's release callbacks run in the
 * calling thread); returns once the client's last context is released. May
 * sleep; not from a callback, nor holding a lock a callback takes. A handle
 * that is not registered (one unregistered already) is refused with a
 * warning in the kernel log and nothing done; NULL and an ERR_PTR are
 * ignored. A handle is never handed out again, also not to a client
 * registered later.
 */
void p2pdirect_unregister_peer_memory_client(void *reg_handle);

/* A user range taken through the registry, for one consumer. */
struct p2pdirect_peer_mem;

/* One DMA segment of a mapping. */
struct p2pdirect_peer_seg {
	u64 addr;
	u64 len;
};

/*
 * Takes [@addr, @addr + @size) of the calling process through the client
 * that owns it and pins it (for the device to write into it if @write).
 * @invalidate(@priv) runs when the memory goes away (FREE, close, exit,
 * device removal, the client's invalidation or unregistering; for another
 * driver's P2PDMA pages mapped by the user, P2PDIRECT_CLIENT_P2PDMA_USER,
 * such as a CMB through sysfs p2pmem/allocate, that driver about to
 * unbind, since ABI 1.14; before, its removal waited for the put). For a
 * device's removal or unbind it runs with that device's lock held (in its
 * driver's remove, or in the PCI bus notifier), so the callback must not
 * bind, unbind, reset or remove a PCI device, nor wait for work that does.
 * The consumer must stop DMA to it before returning; p2pdirect then unmaps and
 * unpins it, and later maps fail with -ESTALE. The callback may run before
 * this function returns, or while p2pdirect_peer_dma_map() runs, before its
 * segments reach the caller: a consumer that starts DMA with them holds a
 * lock of its own across the map and takes it in the callback (no lock of
 * p2pdirect's is held while the callback runs), or checks a count the
 * callback raises. The callback runs in the thread of whatever takes the
 * memory away (a process's FREE, close or exit; a device's removal; the
 * client's invalidation or unregister call, with that client's locks
 * held), may sleep, and should not call into this API
 * (defer the put; a p2pdirect_peer_put() of this range from inside the
 * callback is taken as the put, and returns without waiting: the
 * invalidation unmaps and unpins once the callback returns); it is required (NULL: -EINVAL), since a consumer that is not told
 * could keep DMAing into memory given to someone else. Returns an ERR_PTR:
 * -EINVAL (empty or wrapping range, or no @invalidate), -ENXIO
 * (no client owns the range: not device memory; or the range, claimed by
 * the P2PDMA-pages client, held other pages when pinned: a mapping replaced
 * meanwhile), -EFAULT (no user address
 * space: a kernel thread, whatever the range; nothing mapped at @addr; a
 * range that starts in device memory and runs out of its mapping (one
 * that starts in RAM is -ENXIO); a mapping whose allocation was freed; with
 * @write, a mapping without PROT_WRITE; or, for another driver's P2PDMA
 * pages, pages of more than one P2PDMA region), -ESTALE (the memory went
 * away meanwhile; -EFAULT if it went between the lookup and the pin),
 * -EDQUOT (a range of p2pdirect's memory or of P2PDMA pages larger than
 * max_pinned_mib; another module's client applies its own limits),
 * -ETOOMANYREFS (a page of p2pdirect's memory or of P2PDMA pages holds
 * P2PDIRECT_PAGE_PINS_MAX pins already: the UAPI header's "Pins of one
 * page"; another module's client pins its own memory), -ENOMEM, or the
 * client's error. It takes the calling process's mmap lock:
 * not to be called with it held.
 */
struct p2pdirect_peer_mem *p2pdirect_peer_get(unsigned long addr, size_t size, bool write,
					      void (*invalidate)(void *priv), void *priv);

/*
 * Maps the range for @dev (a PCI function) into @segs (at most @max_segs):
 * segments of exactly the range's bytes, the first at the bus address of
 * its first byte (whatever pages the client maps, see its dma_map); the
 * number of segments, or -EREMOTEIO (@dev cannot reach the memory; for
 * another module's client, whatever its dma_map returns),
 * -E2BIG (more than @max_segs segments), -EBUSY (already mapped), -ESTALE
 * (invalidated), -ENODEV (@dev is not a PCI function), -ENOMEM, or what the
 * DMA API's dma_map_sgtable() returns when the path goes through the host
 * bridge and an IOMMU (-EIO, -EINVAL). A mapping is for both directions
 * whatever @write was. The segments may be invalidated before they are
 * returned (see p2pdirect_peer_get()). A failed map leaves nothing mapped.
 * This call, p2pdirect_peer_dma_unmap() and p2pdirect_peer_page_size()
 * take a lock of the range and call the client: process context only,
 * they may sleep.
 */
int p2pdirect_peer_dma_map(struct p2pdirect_peer_mem *mem, struct device *dev,
			   struct p2pdirect_peer_seg *segs, unsigned int max_segs);

/*
 * Undoes p2pdirect_peer_dma_map() (nothing if not mapped). This call, the
 * map and the page size take only a @mem that p2pdirect_peer_get() returned
 * and that was not put (no NULL or ERR_PTR); the put and the unregistering
 * take NULL and ERR_PTR too, and do nothing with them.
 */
void p2pdirect_peer_dma_unmap(struct p2pdirect_peer_mem *mem);

/* The page size of the memory (0 once invalidated). */
unsigned long p2pdirect_peer_page_size(struct p2pdirect_peer_mem *mem);

/*
 * Unmaps, unpins and releases the range; @mem is gone. It may sleep (it
 * takes mutexes and waits for a running @invalidate): not from atomic
 * context. Once it returns,
 * @invalidate is neither running nor called again, so it waits for a
 * running one: @invalidate must not wait for a lock held across this call.
 * Called from inside @invalidate for its own range, it returns at once
 * (the invalidation finishes the release when the callback returns); @mem
 * is gone then as after any put, so no other thread of the consumer may
 * still be inside a p2pdirect_peer_*() call with it. That put does not
 * wait for the unmap and unpin, nor for the callback's own code to end: a
 * consumer that puts from its callback and then unbinds its device or
 * unloads waits first for its callback to have returned (for its
 * invalidation count to settle, or for a completion the callback signals
 * last).
 */
void p2pdirect_peer_put(struct p2pdirect_peer_mem *mem);

#endif /* _LINUX_P2PDIRECT_H */
