// SPDX-License-Identifier: GPL-2.0
/*
 * C shim of p2pdirect: the C APIs the kernel's Rust crate does not bind
 * (static inline functions, headers outside its bindings). Called only from
 * rust/ffi.rs, which declares these prototypes by hand and states the
 * invariants each call relies on.
 */
#include <linux/blkdev.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/ratelimit.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "shim.h"

static DEFINE_RATELIMIT_STATE(p2pdirect_rs, 5 * HZ, 10);

bool p2pdirect_ratelimit(void)
{
	return __ratelimit(&p2pdirect_rs);
}

/* --- PCI P2PDMA ---------------------------------------------------------- */

int p2pdirect_p2pdma_add_bar(struct pci_dev *pdev, int bar)
{
	return pci_p2pdma_add_resource(pdev, bar, 0, 0);
}

void *p2pdirect_p2pmem_alloc(struct pci_dev *pdev, size_t size)
{
	return pci_alloc_p2pmem(pdev, size);
}

void p2pdirect_p2pmem_free(struct pci_dev *pdev, void *addr, size_t size)
{
	pci_free_p2pmem(pdev, addr, size);
}

u64 p2pdirect_p2pmem_bus_addr(struct pci_dev *pdev, void *addr)
{
	return pci_p2pmem_virt_to_bus(pdev, addr);
}

int p2pdirect_p2pdma_distance(struct pci_dev *provider, struct pci_dev *client)
{
	return pci_p2pdma_distance(provider, &client->dev, false);
}

u32 p2pdirect_pci_addr(struct pci_dev *pdev)
{
	return ((u32)pci_domain_nr(pdev->bus) << 16) | ((u32)pdev->bus->number << 8) |
	       pdev->devfn;
}

bool p2pdirect_bar_is_mem(struct pci_dev *pdev, int bar)
{
	return !!(pci_resource_flags(pdev, bar) & IORESOURCE_MEM);
}

/*
 * Walks the NVMe controllers: NULL starts, the previous one continues (its
 * reference is dropped), NULL ends. The returned device holds a reference.
 */
struct pci_dev *p2pdirect_next_nvme(struct pci_dev *prev)
{
	return pci_get_class(PCI_CLASS_STORAGE_EXPRESS, prev);
}

void p2pdirect_pci_dev_put(struct pci_dev *pdev)
{
	pci_dev_put(pdev);
}

struct pci_dev *p2pdirect_pci_dev_get(struct pci_dev *pdev)
{
	return pci_dev_get(pdev);
}

/* --- Pages of p2pdirect's allocations ------------------------------------ */

/*
 * While an allocation lives, p2pdirect holds one reference on each of its
 * pages; mappings and pins add theirs on top. The reference is set and
 * cleared directly, never dropped with put_page(): a page reaching zero
 * through put_page() would be handed back to the P2PDMA pool page by page,
 * while the pool sees the whole BAR as p2pdirect's.
 */
void p2pdirect_pages_hold(void *kaddr, size_t len)
{
	size_t off;

	for (off = 0; off < len; off += PAGE_SIZE)
		set_page_count(virt_to_page(kaddr + off), 1);
}

bool p2pdirect_pages_idle(void *kaddr, size_t len)
{
	size_t off;

	for (off = 0; off < len; off += PAGE_SIZE)
		if (page_ref_count(virt_to_page(kaddr + off)) != 1)
			return false;
	return true;
}

void p2pdirect_pages_release(void *kaddr, size_t len)
{
	size_t off;

	for (off = 0; off < len; off += PAGE_SIZE)
		set_page_count(virt_to_page(kaddr + off), 0);
}

/* A fault in a device-memory mapping means its pages were taken away. */
static vm_fault_t p2pdirect_vm_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct p2pdirect_vm_ops = {
	.fault = p2pdirect_vm_fault,
};

/* Maps len bytes of device memory at kaddr into the whole of vma. */
int p2pdirect_vm_insert(struct vm_area_struct *vma, void *kaddr, size_t len)
{
	unsigned long addr;
	int ret;

	if (vma->vm_end - vma->vm_start != len)
		return -EINVAL;
	vma->vm_ops = &p2pdirect_vm_ops;
	for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE) {
		ret = vm_insert_page(vma, addr, virt_to_page(kaddr + (addr - vma->vm_start)));
		if (ret)
			return ret;
	}
	return 0;
}

struct address_space *p2pdirect_file_mapping(struct file *file)
{
	return file->f_mapping;
}

void p2pdirect_unmap_mapping(struct address_space *mapping, loff_t off, loff_t len)
{
	unmap_mapping_range(mapping, off, len, 1);
}

unsigned long p2pdirect_vma_pgoff(struct vm_area_struct *vma)
{
	return vma->vm_pgoff;
}

void p2pdirect_msleep(unsigned int ms)
{
	msleep(ms);
}

/*
 * Linux 7.2's Rust bindings define VM_MAYSHARE as VM_MAYEXEC
 * (rust/bindings/bindings_helper.h), so the flag is read here, from C.
 */
bool p2pdirect_vma_may_share(struct vm_area_struct *vma)
{
	return !!(vma->vm_flags & VM_MAYSHARE);
}

/*
 * Whether @pdev's driver published P2PDMA memory (pci_has_p2pmem() is private
 * to the PCI core): the published provider closest to a device is the device
 * itself, at distance 0, exactly when it published.
 */
bool p2pdirect_has_published_p2pmem(struct pci_dev *pdev)
{
	struct device *client = &pdev->dev;
	struct pci_dev *closest = pci_p2pmem_find_many(&client, 1);
	bool published = closest == pdev;

	pci_dev_put(closest);
	return published;
}

/*
 * Walks the PCI functions whose P2PDMA memory their driver published (the
 * NVMe CMB, for one): NULL starts, the previous one continues (its reference
 * is dropped), NULL ends. The returned device holds a reference.
 */
struct pci_dev *p2pdirect_next_published(struct pci_dev *prev)
{
	struct pci_dev *pdev = prev;

	while ((pdev = pci_get_device(PCI_ANY_ID, PCI_ANY_ID, pdev)))
		if (p2pdirect_has_published_p2pmem(pdev))
			return pdev;
	return NULL;
}

/* The memory BAR that holds bus address @bus: its index, bus start and size. */
int p2pdirect_bar_of_bus_addr(struct pci_dev *pdev, u64 bus, u64 *start, u64 *len)
{
	int bar;

	for (bar = 0; bar < PCI_STD_NUM_BARS; bar++) {
		u64 s = pci_bus_address(pdev, bar), l = pci_resource_len(pdev, bar);

		if ((pci_resource_flags(pdev, bar) & IORESOURCE_MEM) && l && bus >= s &&
		    bus - s < l) {
			*start = s;
			*len = l;
			return bar;
		}
	}
	return -ENOENT;
}

/* --- Peer-memory clients: pinning user ranges and mapping them for DMA ---- */

struct p2pdirect_pin {
	struct page **pages;
	unsigned long npages;
	unsigned int offset;	/* of the range in its first page */
	u64 len;
	struct sg_table sgt;
	struct device *dma_dev;	/* set while mapped */
};

/*
 * Whether [addr, addr + len) lies in one p2pdirect device-memory mapping of
 * current; if so, *offset is the device file offset the mapping starts at.
 */
bool p2pdirect_user_range_is_devmem(u64 addr, u64 len, u64 *offset)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	bool ret;

	if (!mm || addr + len < addr)
		return false;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, addr);
	ret = vma && vma->vm_ops == &p2pdirect_vm_ops && addr + len <= vma->vm_end;
	if (ret)
		*offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
	mmap_read_unlock(mm);
	return ret;
}

/* 1 if the page at addr is P2PDMA memory, 0 if it is not, <0 on error. */
int p2pdirect_user_addr_is_p2pdma(u64 addr)
{
	struct page *page;
	int ret;

	ret = pin_user_pages_fast(addr & PAGE_MASK, 1, FOLL_PCI_P2PDMA, &page);
	if (ret != 1)
		return ret < 0 ? ret : -EFAULT;
	ret = is_pci_p2pdma_page(page);
	unpin_user_page(page);
	return ret;
}

/*
 * Pins [addr, addr + len) of current; ERR_PTR on failure. Not FOLL_LONGTERM:
 * GUP refuses it with FOLL_PCI_P2PDMA, so that the device's pgmap can always
 * be unplugged; long-lived users must drop their pins when invalidated.
 */
struct p2pdirect_pin *p2pdirect_pin_user(u64 addr, u64 len, bool write)
{
	unsigned int gup = FOLL_PCI_P2PDMA | (write ? FOLL_WRITE : 0);
	struct p2pdirect_pin *pin;
	u64 first = addr & PAGE_MASK;
	long pinned;

	if (!len || addr + len < addr)
		return ERR_PTR(-EINVAL);
	pin = kzalloc_obj(*pin, GFP_KERNEL);
	if (!pin)
		return ERR_PTR(-ENOMEM);
	pin->npages = (PAGE_ALIGN(addr + len) - first) >> PAGE_SHIFT;
	pin->offset = addr & ~PAGE_MASK;
	pin->len = len;
	pin->pages = kvmalloc_array(pin->npages, sizeof(*pin->pages), GFP_KERNEL);
	if (!pin->pages) {
		kfree(pin);
		return ERR_PTR(-ENOMEM);
	}
	pinned = pin_user_pages_fast(first, pin->npages, gup, pin->pages);
	if (pinned != pin->npages) {
		if (pinned > 0)
			unpin_user_pages(pin->pages, pinned);
		kvfree(pin->pages);
		kfree(pin);
		return ERR_PTR(pinned < 0 ? pinned : -EFAULT);
	}
	return pin;
}

bool p2pdirect_pin_is_p2pdma(struct p2pdirect_pin *pin)
{
	unsigned long i;

	for (i = 0; i < pin->npages; i++)
		if (!is_pci_p2pdma_page(pin->pages[i]))
			return false;
	return true;
}

/* Maps the pinned pages for DMA by @pdev: -EREMOTEIO if it cannot reach them. */
int p2pdirect_pin_dma_map(struct p2pdirect_pin *pin, struct pci_dev *pdev)
{
	int ret;

	if (pin->dma_dev)
		return -EBUSY;
	ret = sg_alloc_table_from_pages(&pin->sgt, pin->pages, pin->npages, pin->offset,
					pin->len, GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(&pdev->dev, &pin->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret) {
		sg_free_table(&pin->sgt);
		return ret;
	}
	pin->dma_dev = get_device(&pdev->dev);
	return 0;
}

/* Copies up to @max DMA segments; returns how many there are. */
unsigned int p2pdirect_pin_dma_segs(struct p2pdirect_pin *pin, u64 *addr, u64 *len,
				    unsigned int max)
{
	struct scatterlist *sg;
	unsigned int i, n = 0;

	if (!pin->dma_dev)
		return 0;
	for_each_sgtable_dma_sg(&pin->sgt, sg, i) {
		if (n < max) {
			addr[n] = sg_dma_address(sg);
			len[n] = sg_dma_len(sg);
		}
		n++;
	}
	return n;
}

void p2pdirect_pin_dma_unmap(struct p2pdirect_pin *pin)
{
	if (!pin->dma_dev)
		return;
	dma_unmap_sgtable(pin->dma_dev, &pin->sgt, DMA_BIDIRECTIONAL, 0);
	sg_free_table(&pin->sgt);
	put_device(pin->dma_dev);
	pin->dma_dev = NULL;
}

void p2pdirect_unpin(struct p2pdirect_pin *pin)
{
	p2pdirect_pin_dma_unmap(pin);
	unpin_user_pages(pin->pages, pin->npages);
	kvfree(pin->pages);
	kfree(pin);
}

/*
 * The PCI function that does DMA for the block device open as @file, with a
 * reference: the first PCI device above its disk (the NVMe controller).
 */
struct pci_dev *p2pdirect_block_dma_pci(struct file *file)
{
	struct block_device *bdev;
	struct device *dev;

	if (!S_ISBLK(file_inode(file)->i_mode))
		return ERR_PTR(-ENOTBLK);
	bdev = file_bdev(file);
	for (dev = disk_to_dev(bdev->bd_disk); dev; dev = dev->parent)
		if (dev_is_pci(dev))
			return pci_dev_get(to_pci_dev(dev));
	return ERR_PTR(-ENODEV);
}
