// SPDX-License-Identifier: GPL-2.0
/*
 * C shim of p2pdirect: static inlines and cast macros the Rust crate does not bind.
 * Rust's declarations are bindgen's of these; rust/sys/ states their invariants.
 */
#include <linux/blkdev.h>
#include <linux/dma-buf-mapping.h>	/* for bindgen: P2P dma-buf maps */
#include <linux/export.h>
#include <linux/filelock.h>
#include <linux/fsnotify.h>
#include <linux/io_uring/cmd.h>		/* for bindgen: the io_uring command */
#include <linux/memremap.h>
#include <linux/pagemap.h>
#include <linux/pci.h>
#include <linux/ratelimit.h>
#include <linux/scatterlist.h>
#include <xen/xen.h>

#include "../../include/linux/p2pdirect.h"	/* the kernel API, defined in Rust */

/* What rust/sys/uring_cmd.rs relies on, checked against the headers. */
#define SQEO(f, off) (offsetof(struct io_uring_sqe, f) == (off))
static_assert(offsetof(struct io_kiocb, cmd) == 0 && SQEO(cmd, 48) && SQEO(addr, 16) &&
	      SQEO(len, 24) && SQEO(buf_index, 40) && SQEO(file_index, 44));
static_assert(IO_URING_CMD_TASK_WORK_ISSUE_FLAGS == IO_URING_F_COMPLETE_DEFER);

/* Flags behind cast macros, for bindgen (7.2's bindings define VM_MAYSHARE as VM_MAYEXEC). */
const fmode_t P2PDIRECT_FMODE_READ = FMODE_READ;
const fmode_t P2PDIRECT_FMODE_WRITE = FMODE_WRITE;
const fmode_t P2PDIRECT_FMODE_NOWAIT = FMODE_NOWAIT;
const int P2PDIRECT_IOCB_NOWAIT = IOCB_NOWAIT;
const int P2PDIRECT_IOCB_DIRECT = IOCB_DIRECT;
const vm_flags_t P2PDIRECT_VM_MAYSHARE = VM_MAYSHARE;
const blk_features_t P2PDIRECT_BLK_FEAT_PCI_P2PDMA = BLK_FEAT_PCI_P2PDMA;
const unsigned int P2PDIRECT_IOU_F_TWQ_LAZY_WAKE = IOU_F_TWQ_LAZY_WAKE;

static DEFINE_RATELIMIT_STATE(p2pdirect_rs, 5 * HZ, 10);

bool p2pdirect_ratelimit(void)
{
	return __ratelimit(&p2pdirect_rs);
}

bool p2pdirect_bdev_read_only(struct block_device *bdev)
{
	return bdev_read_only(bdev);
}

/* f_path sits in an anonymous union, which bindgen names per kernel version. */
const struct path *p2pdirect_file_path(struct file *f)
{
	return &f->f_path;
}

/* break_lease()'s test: an open of the file would find leases to break. */
bool p2pdirect_has_leases(struct file *f)
{
	struct file_lock_context *ctx = locks_inode_context(file_inode(f));

	return ctx && !list_empty_careful(&ctx->flc_lease);
}

/* A rescheduling point; whether the task is being killed (fatal_signal_pending()). */
bool p2pdirect_resched(void)
{
	cond_resched();
	return fatal_signal_pending(current);
}

int p2pdirect_pci_domain(struct pci_dev *pdev)
{
	return pci_domain_nr(pdev->bus);
}

bool p2pdirect_page_is_p2pdma(struct page *page)
{
	return is_pci_p2pdma_page(page);
}

/* Identifies the page's pgmap (compared, never dereferenced). */
const void *p2pdirect_page_pgmap(struct page *page)
{
	return page_pgmap(page);
}

/* bvec_try_merge_page()'s own conditions for a vector across pages. */
bool p2pdirect_bvec_spans_pages(void)
{
	return !IS_ENABLED(CONFIG_KMSAN) && !xen_domain();
}

u64 p2pdirect_page_phys(struct page *page)
{
	return page_to_phys(page);
}

struct page *p2pdirect_virt_to_page(void *kaddr)
{
	return virt_to_page(kaddr);
}

void *p2pdirect_page_address(struct page *page)
{
	return page_address(page);
}

void p2pdirect_sg_set_page(struct scatterlist *sg, struct page *p, unsigned int len, unsigned int off)
{
	sg_set_page(sg, p, len, off);
}

/* The count from @old to @new atomically (as page_ref_freeze()); false, unchanged, if not @old. */
bool p2pdirect_page_ref_swap(struct page *page, int old, int new)
{
	return atomic_cmpxchg(&page->_refcount, old, new) == old;
}

/* The events read(2)/write(2) send once data moved. */
void p2pdirect_fsnotify(struct file *f, bool write)
{
	if (write)
		fsnotify_modify(f);
	else
		fsnotify_access(f);
}

bool p2pdirect_range_needs_writeback(struct address_space *m, loff_t start, loff_t end)
{
	return filemap_range_needs_writeback(m, start, end);
}

void p2pdirect_init_sync_kiocb(struct kiocb *k, struct file *f)
{
	init_sync_kiocb(k, f);
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
