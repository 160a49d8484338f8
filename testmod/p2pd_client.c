// SPDX-License-Identifier: GPL-2.0
/*
 * p2pd_client: a peer-memory client for the tests, playing another GPU
 * driver through p2pdirect's kernel API (include/linux/p2pdirect.h). It owns
 * P2PD_CLIENT_PAGES pages of host memory that user space maps through
 * debugfs p2pd_client/mem (pages, as vm_insert_page maps them) or
 * p2pd_client/pfnmem (pure PFNs, VM_IO | VM_PFNMAP, as GPU drivers map their
 * memory: get_user_pages cannot pin them), or p2pd_client/bigmem (up to
 * P2PD_CLIENT_BIG_PAGES pages that repeat the same pages: a range larger than
 * p2pdirect's limits, at the cost of page tables only), and claims exactly
 * the ranges inside such a mapping. Writing "invalidate" to p2pd_client/ctl invalidates every claim
 * it handed out (its memory "freed"); "unregister" unregisters the client
 * at once (the module's exit then does not), "register" registers it again;
 * "invalidate-stale" calls the invalidation function with the handle of the
 * last unregistered registration (a careless driver that frees memory after
 * it unregistered), keeping the result. Reading ctl gives "claims N
 * invalidated N stale R" (R: that result, 1 before any).
 */
#include <linux/debugfs.h>
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/p2pdirect.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#define P2PD_CLIENT_PAGES 16
#define P2PD_CLIENT_BIG_PAGES ((128 << 20) >> PAGE_SHIFT)

struct client_ctx {
	struct list_head node;	/* in claims, between get_pages and put_pages */
	unsigned long addr;
	size_t size;
	unsigned int first;	/* index of the first page */
	u64 core_context;
};

static struct page *pages[P2PD_CLIENT_PAGES];
static struct dentry *dir;
static void *reg_handle;
static p2pdirect_invalidate_peer_memory invalidate_cb;
static DEFINE_MUTEX(claims_lock);
static LIST_HEAD(claims);
static unsigned int nr_claims, nr_invalidated;
static DEFINE_MUTEX(ctl_lock);	/* the registration state below */
static bool unregistered;
static void *stale_handle;
static int stale_ret = 1;

static const struct vm_operations_struct mem_vm_ops = {};
static const struct vm_operations_struct big_vm_ops = {};

/* The page at index @i of a mapping: the pages, repeated in bigmem's. */
static struct page *page_at(unsigned long i)
{
	return pages[i % P2PD_CLIENT_PAGES];
}

/*
 * Maps the pages as pages, or with @pfn as PFNs (VM_IO | VM_PFNMAP), at
 * most @max of them, with @ops as the mapping's (its kind).
 */
static int map_pages(struct vm_area_struct *vma, bool pfn, unsigned long max,
		     const struct vm_operations_struct *ops)
{
	unsigned long n = vma_pages(vma), i, at;
	int ret;

	if (vma->vm_pgoff || n > max || !(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	vma->vm_ops = ops;
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTCOPY);
	for (i = 0; i < n; i++) {
		at = vma->vm_start + i * PAGE_SIZE;
		ret = pfn ? remap_pfn_range(vma, at, page_to_pfn(page_at(i)), PAGE_SIZE,
					    vma->vm_page_prot) :
			    vm_insert_page(vma, at, page_at(i));
		if (ret)
			return ret;
	}
	return 0;
}

static int mem_mmap(struct file *f, struct vm_area_struct *vma)
{
	return map_pages(vma, false, P2PD_CLIENT_PAGES, &mem_vm_ops);
}

static const struct file_operations mem_fops = {
	.owner = THIS_MODULE,
	.mmap = mem_mmap,
};

static int bigmem_mmap(struct file *f, struct vm_area_struct *vma)
{
	return map_pages(vma, false, P2PD_CLIENT_BIG_PAGES, &big_vm_ops);
}

static const struct file_operations bigmem_fops = {
	.owner = THIS_MODULE,
	.mmap = bigmem_mmap,
};

static int pfnmem_mmap(struct file *f, struct vm_area_struct *vma)
{
	return map_pages(vma, true, P2PD_CLIENT_PAGES, &mem_vm_ops);
}

static const struct file_operations pfnmem_fops = {
	.owner = THIS_MODULE,
	.mmap = pfnmem_mmap,
};

static int client_acquire(unsigned long addr, size_t size, void *peer_mem_private_data,
			  char *peer_mem_name, void **client_context)
{
	struct vm_area_struct *vma;
	struct client_ctx *ctx;
	unsigned long max;
	int claimed = 0;

	mmap_read_lock(current->mm);
	vma = vma_lookup(current->mm, addr);
	max = !vma ? 0 :
	      vma->vm_ops == &mem_vm_ops ? P2PD_CLIENT_PAGES :
	      vma->vm_ops == &big_vm_ops ? P2PD_CLIENT_BIG_PAGES : 0;
	/*
	 * Any range inside one of its mappings (whose offset is its page
	 * index); get_pages pins and dma_map maps the whole pages it touches,
	 * as OFED's clients do (nvidia-peermem: 64 KiB GPU pages).
	 */
	if (max && size && size <= vma->vm_end - addr &&
	    vma->vm_pgoff + ((vma->vm_end - vma->vm_start) >> PAGE_SHIFT) <= max) {
		ctx = kzalloc_obj(*ctx);
		if (ctx) {
			ctx->addr = addr;
			ctx->size = size;
			ctx->first = vma->vm_pgoff + ((addr - vma->vm_start) >> PAGE_SHIFT);
			INIT_LIST_HEAD(&ctx->node);
			*client_context = ctx;
			claimed = 1;
		} else {
			claimed = -ENOMEM;
		}
	}
	mmap_read_unlock(current->mm);
	return claimed;
}

static int client_get_pages(unsigned long addr, size_t size, int write, int force,
			    struct sg_table *sg_head, void *client_context, u64 core_context)
{
	struct client_ctx *ctx = client_context;
	unsigned int n = (PAGE_ALIGN(addr + size) - (addr & PAGE_MASK)) >> PAGE_SHIFT, i;
	struct scatterlist *sg;
	int ret;

	ret = sg_alloc_table(sg_head, n, GFP_KERNEL);
	if (ret)
		return ret;
	for_each_sg(sg_head->sgl, sg, n, i)
		sg_set_page(sg, page_at(ctx->first + i), PAGE_SIZE, 0);
	ctx->core_context = core_context;
	mutex_lock(&claims_lock);
	list_add_tail(&ctx->node, &claims);
	nr_claims++;
	mutex_unlock(&claims_lock);
	return 0;
}

static int client_dma_map(struct sg_table *sg_head, void *client_context,
			  struct device *dma_device, int dmasync, int *nmap)
{
	int ret = dma_map_sgtable(dma_device, sg_head, DMA_BIDIRECTIONAL, 0);

	if (ret)
		return ret;
	*nmap = sg_head->nents;
	return 0;
}

static int client_dma_unmap(struct sg_table *sg_head, void *client_context,
			    struct device *dma_device)
{
	dma_unmap_sgtable(dma_device, sg_head, DMA_BIDIRECTIONAL, 0);
	return 0;
}

static void client_put_pages(struct sg_table *sg_head, void *client_context)
{
	struct client_ctx *ctx = client_context;

	mutex_lock(&claims_lock);
	list_del_init(&ctx->node);
	mutex_unlock(&claims_lock);
	sg_free_table(sg_head);
}

static unsigned long client_get_page_size(void *client_context)
{
	return PAGE_SIZE;
}

static void client_release(void *client_context)
{
	kfree(client_context);
}

static const struct p2pdirect_peer_memory_client client = {
	.name = "p2pd_client",
	.version = "1.0",
	.acquire = client_acquire,
	.get_pages = client_get_pages,
	.dma_map = client_dma_map,
	.dma_unmap = client_dma_unmap,
	.put_pages = client_put_pages,
	.get_page_size = client_get_page_size,
	.release = client_release,
};

/* Invalidates every claim, one at a time, without claims_lock held. */
static void invalidate_all(void)
{
	struct client_ctx *ctx;
	u64 core;

	for (;;) {
		mutex_lock(&claims_lock);
		ctx = list_first_entry_or_null(&claims, struct client_ctx, node);
		if (ctx) {
			/* Off the list: put_pages may run inside the callback. */
			list_del_init(&ctx->node);
			core = ctx->core_context;
		}
		mutex_unlock(&claims_lock);
		if (!ctx)
			return;
		if (!invalidate_cb(reg_handle, core)) {
			mutex_lock(&claims_lock);
			nr_invalidated++;
			mutex_unlock(&claims_lock);
		}
	}
}

/* The registration commands of ctl, under ctl_lock. */
static int ctl_registration(const char *cmd)
{
	if (!strcmp(cmd, "unregister")) {
		if (unregistered)
			return -EALREADY;
		p2pdirect_unregister_peer_memory_client(reg_handle);
		stale_handle = reg_handle;
		unregistered = true;
	} else if (!strcmp(cmd, "register")) {
		if (!unregistered)
			return -EALREADY;
		reg_handle = p2pdirect_register_peer_memory_client(&client, &invalidate_cb);
		if (!reg_handle)
			return -EBUSY;
		unregistered = false;
	} else if (!strcmp(cmd, "invalidate-stale")) {
		if (!stale_handle)
			return -EBUSY;
		stale_ret = invalidate_cb(stale_handle, 1);
	} else {
		return -EINVAL;
	}
	return 0;
}

static ssize_t ctl_write(struct file *f, const char __user *ubuf, size_t len, loff_t *pos)
{
	char cmd[32];
	int ret;

	if (len >= sizeof(cmd) || copy_from_user(cmd, ubuf, len))
		return -EINVAL;
	cmd[len] = '\0';
	if (!strcmp(strim(cmd), "invalidate")) {
		invalidate_all();
		return len;
	}
	mutex_lock(&ctl_lock);
	ret = ctl_registration(strim(cmd));
	mutex_unlock(&ctl_lock);
	return ret ? ret : len;
}

static ssize_t ctl_read(struct file *f, char __user *ubuf, size_t len, loff_t *pos)
{
	char out[80];
	int n = scnprintf(out, sizeof(out), "claims %u invalidated %u stale %d\n", nr_claims,
			  nr_invalidated, stale_ret);

	return simple_read_from_buffer(ubuf, len, &(loff_t){ 0 }, out, n);
}

static const struct file_operations ctl_fops = {
	.owner = THIS_MODULE,
	.read = ctl_read,
	.write = ctl_write,
};

static void free_pages_all(void)
{
	for (int i = 0; i < P2PD_CLIENT_PAGES; i++)
		if (pages[i])
			__free_page(pages[i]);
}

static int __init client_init(void)
{
	for (int i = 0; i < P2PD_CLIENT_PAGES; i++) {
		pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!pages[i]) {
			free_pages_all();
			return -ENOMEM;
		}
	}
	reg_handle = p2pdirect_register_peer_memory_client(&client, &invalidate_cb);
	if (!reg_handle) {
		free_pages_all();
		return -EBUSY;
	}
	dir = debugfs_create_dir("p2pd_client", NULL);
	/* Unproxied: the mmap goes to mem_fops (an open file holds the module). */
	debugfs_create_file_unsafe("mem", 0600, dir, NULL, &mem_fops);
	debugfs_create_file_unsafe("pfnmem", 0600, dir, NULL, &pfnmem_fops);
	debugfs_create_file_unsafe("bigmem", 0600, dir, NULL, &bigmem_fops);
	debugfs_create_file("ctl", 0600, dir, NULL, &ctl_fops);
	return 0;
}

static void __exit client_exit(void)
{
	debugfs_remove_recursive(dir);
	/* Invalidates what consumers keep and waits for the last context. */
	if (!unregistered)
		p2pdirect_unregister_peer_memory_client(reg_handle);
	free_pages_all();
}

module_init(client_init);
module_exit(client_exit);
MODULE_DESCRIPTION("peer-memory client for p2pdirect's tests");
MODULE_LICENSE("GPL");
