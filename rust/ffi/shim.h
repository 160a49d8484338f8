/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C shim's functions, called from rust/ffi.rs (which repeats these
 * prototypes by hand in its extern block: keep the two in step).
 */
#ifndef P2PDIRECT_SHIM_H
#define P2PDIRECT_SHIM_H

#include <linux/fs.h>
#include <linux/mm_types.h>
#include <linux/pci.h>

struct p2pdirect_pin;

bool p2pdirect_ratelimit(void);
int p2pdirect_p2pdma_add_bar(struct pci_dev *pdev, int bar);
void *p2pdirect_p2pmem_alloc(struct pci_dev *pdev, size_t size);
void p2pdirect_p2pmem_free(struct pci_dev *pdev, void *addr, size_t size);
u64 p2pdirect_p2pmem_bus_addr(struct pci_dev *pdev, void *addr);
int p2pdirect_p2pdma_distance(struct pci_dev *provider, struct pci_dev *client);
u32 p2pdirect_pci_addr(struct pci_dev *pdev);
bool p2pdirect_bar_is_mem(struct pci_dev *pdev, int bar);
struct pci_dev *p2pdirect_next_nvme(struct pci_dev *prev);
void p2pdirect_pci_dev_put(struct pci_dev *pdev);
struct pci_dev *p2pdirect_pci_dev_get(struct pci_dev *pdev);
void p2pdirect_pages_hold(void *kaddr, size_t len);
bool p2pdirect_pages_idle(void *kaddr, size_t len);
void p2pdirect_pages_release(void *kaddr, size_t len);
int p2pdirect_vm_insert(struct vm_area_struct *vma, void *kaddr, size_t len);
struct address_space *p2pdirect_file_mapping(struct file *file);
void p2pdirect_unmap_mapping(struct address_space *mapping, loff_t off, loff_t len);
unsigned long p2pdirect_vma_pgoff(struct vm_area_struct *vma);
void p2pdirect_msleep(unsigned int ms);
bool p2pdirect_vma_may_share(struct vm_area_struct *vma);
bool p2pdirect_has_published_p2pmem(struct pci_dev *pdev);
struct pci_dev *p2pdirect_next_published(struct pci_dev *prev);
int p2pdirect_bar_of_bus_addr(struct pci_dev *pdev, u64 bus, u64 *start, u64 *len);
bool p2pdirect_user_range_is_devmem(u64 addr, u64 len, u64 *offset);
int p2pdirect_user_addr_is_p2pdma(u64 addr);
struct p2pdirect_pin *p2pdirect_pin_user(u64 addr, u64 len, bool write);
bool p2pdirect_pin_is_p2pdma(struct p2pdirect_pin *pin);
int p2pdirect_pin_dma_map(struct p2pdirect_pin *pin, struct pci_dev *pdev);
unsigned int p2pdirect_pin_dma_segs(struct p2pdirect_pin *pin, u64 *addr, u64 *len,
				    unsigned int max);
void p2pdirect_pin_dma_unmap(struct p2pdirect_pin *pin);
void p2pdirect_unpin(struct p2pdirect_pin *pin);
struct pci_dev *p2pdirect_block_dma_pci(struct file *file);

#endif /* P2PDIRECT_SHIM_H */
