// SPDX-License-Identifier: GPL-2.0
/*
 * C shim of p2pdirect: the C APIs the kernel's Rust crate does not bind
 * (static inline functions, headers outside its bindings). Called only from
 * rust/ffi.rs, which declares these prototypes by hand and states the
 * invariants each call relies on.
 */
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/ratelimit.h>

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
