// SPDX-License-Identifier: GPL-2.0
/*
 * C shim of p2pdirect: the C APIs the kernel's Rust crate does not bind
 * (static inline functions, macros, headers outside its bindings). Rust
 * sees these functions through bindgen's declarations of shim.h; its
 * wrappers state the invariants each call relies on.
 */
#include <linux/blkdev.h>
#include <linux/export.h>
#include <linux/fs.h>
#include <linux/fsnotify.h>
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/pci.h>
#include <linux/ratelimit.h>
#include <linux/scatterlist.h>

#include "shim.h"

/* What rust/sys/uring_cmd.rs relies on, checked against the headers. */
static_assert(offsetof(struct io_kiocb, cmd) == 0);
static_assert(offsetof(struct io_uring_sqe, cmd) == 48);
static_assert(IO_URING_CMD_TASK_WORK_ISSUE_FLAGS == IO_URING_F_COMPLETE_DEFER);

static DEFINE_RATELIMIT_STATE(p2pdirect_rs, 5 * HZ, 10);

bool p2pdirect_ratelimit(void)
{
	return __ratelimit(&p2pdirect_rs);
}

/*
 * Linux 7.2's Rust bindings define VM_MAYSHARE as VM_MAYEXEC
 * (rust/bindings/bindings_helper.h), so the flag is read here, from C.
 */
bool p2pdirect_vma_may_share(struct vm_area_struct *vma)
{
	return !!(vma->vm_flags & VM_MAYSHARE);
}

/* Whether @f is open for the access (FMODE_READ/FMODE_WRITE: cast macros). */
bool p2pdirect_file_may(struct file *f, bool write)
{
	return f->f_mode & (write ? FMODE_WRITE : FMODE_READ);
}

bool p2pdirect_bdev_read_only(struct block_device *bdev)
{
	return bdev_read_only(bdev);
}

/* --- Pages: the inline accessors rust/sys/gup.rs needs ------------------ */

bool p2pdirect_page_is_p2pdma(struct page *page)
{
	return is_pci_p2pdma_page(page);
}

/* Identifies the page's pgmap (compared, never dereferenced). */
const void *p2pdirect_page_pgmap(struct page *page)
{
	return page_pgmap(page);
}

u64 p2pdirect_page_phys(struct page *page)
{
	return page_to_phys(page);
}

void p2pdirect_sg_set_page(struct scatterlist *sg, struct page *page, unsigned int len,
			   unsigned int offset)
{
	sg_set_page(sg, page, len, offset);
}

struct page *p2pdirect_virt_to_page(void *kaddr)
{
	return virt_to_page(kaddr);
}

void p2pdirect_page_ref_set(struct page *page, int v)
{
	set_page_count(page, v);
}

bool p2pdirect_page_ref_freeze(struct page *page, int count)
{
	return page_ref_freeze(page, count);
}

void p2pdirect_page_ref_unfreeze(struct page *page, int count)
{
	page_ref_unfreeze(page, count);
}

void p2pdirect_cond_resched(void)
{
	cond_resched();
}

u64 p2pdirect_virt_to_phys(void *kaddr)
{
	return virt_to_phys(kaddr);
}

int p2pdirect_pci_domain(struct pci_dev *pdev)
{
	return pci_domain_nr(pdev->bus);
}

/* f_path sits in an anonymous union, which bindgen names per kernel version. */
const struct path *p2pdirect_file_path(struct file *f)
{
	return &f->f_path;
}

const struct cred *p2pdirect_current_cred(void)
{
	return current_cred();
}

/* --- Storage I/O --------------------------------------------------------- */

/* The events read(2)/write(2) send once data moved. */
void p2pdirect_fsnotify(struct file *f, bool write)
{
	if (write)
		fsnotify_modify(f);
	else
		fsnotify_access(f);
}

/* Whether @bdev's queue accepts P2PDMA pages (BLK_FEAT_*: cast macros). */
bool p2pdirect_bdev_p2pdma(struct block_device *bdev)
{
	return blk_queue_pci_p2pdma(bdev_get_queue(bdev));
}

/*
 * Whether the cache work before a direct I/O of [pos, pos + len) may wait:
 * writing back dirty pages, or (a WRITE) dropping cached ones, as
 * kiocb_write_and_wait() and kiocb_invalidate_pages() judge for IOCB_NOWAIT.
 */
bool p2pdirect_bdev_cache_busy(struct file *f, u64 pos, u64 len, bool write)
{
	struct address_space *m = f->f_mapping;
	u64 end = pos + len - 1;

	return filemap_range_needs_writeback(m, pos, end) ||
	       (write && filemap_range_has_page(m, pos, end));
}

/*
 * init_sync_kiocb() at @pos; with @complete an asynchronous kiocb, with
 * @nowait one that must not block (false, untouched: the file cannot).
 */
bool p2pdirect_kiocb_init(struct kiocb *k, struct file *f, loff_t pos,
			  void (*complete)(struct kiocb *, long), bool nowait)
{
	if (nowait && !(f->f_mode & FMODE_NOWAIT))
		return false;
	init_sync_kiocb(k, f);
	k->ki_pos = pos;
	k->ki_complete = complete;
	if (nowait)
		k->ki_flags |= IOCB_NOWAIT;
	return true;
}

void p2pdirect_kiocb_end_write(struct kiocb *k)
{
	kiocb_end_write(k);
}

/* --- The kernel API (include/linux/p2pdirect.h), defined in Rust -------- */

EXPORT_SYMBOL_GPL(p2pdirect_register_peer_memory_client);
EXPORT_SYMBOL_GPL(p2pdirect_unregister_peer_memory_client);
EXPORT_SYMBOL_GPL(p2pdirect_peer_get);
EXPORT_SYMBOL_GPL(p2pdirect_peer_dma_map);
EXPORT_SYMBOL_GPL(p2pdirect_peer_dma_unmap);
EXPORT_SYMBOL_GPL(p2pdirect_peer_page_size);
EXPORT_SYMBOL_GPL(p2pdirect_peer_put);
