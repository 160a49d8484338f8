/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C shim's functions. Kbuild runs bindgen over this header to declare
 * them for Rust (rust/sys.rs, module `c`): nothing is declared twice.
 */
#ifndef P2PDIRECT_SHIM_H
#define P2PDIRECT_SHIM_H

#include <linux/dma-buf-mapping.h>	/* for bindgen: P2P dma-buf maps */
#include <linux/fs.h>
#include <linux/io_uring/cmd.h>	/* for bindgen: the io_uring command */
#include <linux/mm_types.h>
#include <linux/pci.h>

#include "../../include/linux/p2pdirect.h"	/* the kernel API, defined in Rust */

bool p2pdirect_ratelimit(void);
bool p2pdirect_file_may(struct file *f, bool write);
bool p2pdirect_bdev_read_only(struct block_device *bdev);
const struct path *p2pdirect_file_path(struct file *f);
const struct cred *p2pdirect_current_cred(void);
void p2pdirect_fsnotify(struct file *f, bool write);
bool p2pdirect_vma_may_share(struct vm_area_struct *vma);
bool p2pdirect_page_is_p2pdma(struct page *page);
const void *p2pdirect_page_pgmap(struct page *page);
u64 p2pdirect_page_phys(struct page *page);
struct scatterlist;
void p2pdirect_sg_set_page(struct scatterlist *sg, struct page *page, unsigned int len,
			   unsigned int offset);
struct page *p2pdirect_virt_to_page(void *kaddr);
void p2pdirect_page_ref_set(struct page *page, int v);
bool p2pdirect_page_ref_freeze(struct page *page, int count);
void p2pdirect_page_ref_unfreeze(struct page *page, int count);
void p2pdirect_cond_resched(void);
u64 p2pdirect_virt_to_phys(void *kaddr);
int p2pdirect_pci_domain(struct pci_dev *pdev);

bool p2pdirect_bdev_p2pdma(struct block_device *bdev);
bool p2pdirect_bdev_cache_busy(struct file *f, u64 pos, u64 len, bool write);
bool p2pdirect_kiocb_init(struct kiocb *k, struct file *f, loff_t pos,
			  void (*complete)(struct kiocb *, long), bool nowait);
void p2pdirect_kiocb_end_write(struct kiocb *k);

#endif /* P2PDIRECT_SHIM_H */
