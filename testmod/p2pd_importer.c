// SPDX-License-Identifier: GPL-2.0
/*
 * p2pd_importer: a dma-buf importer for the tests, playing an RDMA driver
 * (ibv_reg_dmabuf_mr's kernel side) on a PCI device of the VM.
 *
 * Each open file of debugfs p2pd_importer/ctl is one importer. Commands
 * written to it (one per write; an error is the write's result):
 *   attach FD BDF [nop2p] [norevoke] [lazy]
 *	dma_buf_dynamic_attach() of dma-buf FD for PCI function BDF;
 *	nop2p: without allow_peer2peer; norevoke: without an
 *	invalidate_mappings callback; lazy: the callback only counts, the
 *	mapping stays until "unmap" (an importer slow to let go)
 *   map	dma_buf_map_attachment(), bidirectional
 *   unmap	dma_buf_unmap_attachment()
 *   detach	dma_buf_detach() and dma_buf_put()
 *   dma OFF LEN SEED
 *	the importer's device DMAs LEN (<= 4096) bytes of the pattern
 *	byte j = (j * 7 + SEED) & 0xff to byte OFF of its mapping (hex OFF
 *	and LEN, one DMA segment): an RDMA write. Only for an importer
 *	attached for the edu device (QEMU's educational PCI device,
 *	1234:11e8, whose DMA engine this module drives as its PCI driver)
 *   keep	the module takes the importer over: closing the file leaves
 *		it attached (and mapped), and unloading the module releases it
 *		(an RDMA driver unloaded while a memory region is registered)
 *   fence	adds a fence of the importer's own to the dma-buf's
 *		reservation object (a write job of its device still running),
 *		not signalled until "signal" or detach
 *   signal	signals that fence
 * Reading gives "attached A mapped M invalidations N segs S" and a line
 * "seg DMA_ADDR LEN" per DMA segment of the mapping (hex). Closing the file
 * unmaps and detaches, unless kept.
 *
 * Each open file of p2pd_importer/peer is a consumer of p2pdirect's kernel
 * API (include/linux/p2pdirect.h), taking a user range of the writer:
 *   acquire ADDR SIZE BDF [write|noinval|putincb|slow]
 *	p2pdirect_peer_get() of [ADDR, ADDR + SIZE) (hex), then
 *	p2pdirect_peer_dma_map() for PCI function BDF; noinval passes no
 *	invalidation callback (which p2pdirect refuses); slow makes the
 *	callback take 2 s (after it counted itself); putincb maps the
 *	range and hands it to the callback, which puts it itself (as the API
 *	advises against): the file is then not attached, its other commands
 *	never see the range, and closing it puts the range if the callback
 *	did not
 *   map	p2pdirect_peer_dma_map() again
 *   unmap	p2pdirect_peer_dma_unmap()
 *   release	p2pdirect_peer_put()
 *   keep	as for ctl: the range stays held until the module unloads
 * Reading gives the same lines as ctl, "attached" meaning a range is held.
 */
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-fence.h>
#include <linux/dma-mapping.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/dma-resv.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/p2pdirect.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

MODULE_IMPORT_NS("DMA_BUF");

struct importer {
	struct mutex lock;	/* serialises commands of this file */
	struct list_head kept;	/* in kept_importers once kept */
	struct dma_buf *buf;
	struct dma_buf_attachment *att;
	struct pci_dev *pdev;
	struct sg_table *sgt;	/* under the reservation lock */
	bool lazy;
	unsigned int invalidations;
	struct dma_fence *fence;	/* "fence", until signalled (xchg) */
};

static struct dentry *dir;

/*
 * The edu device: a 4 KiB buffer and a DMA engine copying between it and a
 * bus address, one transfer at a time, done about 100 ms after it starts.
 * QEMU 7.2 stops the whole VM (hw_error) for a transfer that reaches the
 * buffer's last byte, so at most EDU_CHUNK bytes go at a time.
 */
#define EDU_DMA_SRC	0x80
#define EDU_DMA_DST	0x88
#define EDU_DMA_CNT	0x90
#define EDU_DMA_CMD	0x98
#define EDU_DMA_RUN	0x1
#define EDU_DMA_TO_PCI	0x2
#define EDU_BUF		0x40000
#define EDU_BUF_SIZE	4096
#define EDU_CHUNK	2048

static struct {
	struct mutex lock;	/* serialises transfers and binding */
	struct pci_dev *pdev;	/* bound, or NULL */
	bool stuck;		/* a transfer timed out: bus mastering is off */
	void __iomem *regs;
	u8 *buf;		/* coherent: what the engine fetches */
	dma_addr_t buf_dma;
} edu = { .lock = __MUTEX_INITIALIZER(edu.lock) };

/* One transfer of @len bytes from @src to @dst; waits up to 5 s for it. */
static int edu_transfer(u64 src, u64 dst, u64 len, u64 cmd)
{
	int i;

	writeq(src, edu.regs + EDU_DMA_SRC);
	writeq(dst, edu.regs + EDU_DMA_DST);
	writeq(len, edu.regs + EDU_DMA_CNT);
	writeq(cmd | EDU_DMA_RUN, edu.regs + EDU_DMA_CMD);
	for (i = 0; i < 250; i++) {
		if (!(readq(edu.regs + EDU_DMA_CMD) & EDU_DMA_RUN))
			return 0;
		msleep(20);
	}
	/* It may still write: no more DMA from this device at all. */
	pci_clear_master(edu.pdev);
	edu.stuck = true;
	pci_err(edu.pdev, "DMA transfer timed out; bus mastering off\n");
	return -ETIMEDOUT;
}

/* @pdev's edu engine writes @len pattern bytes at bus or DMA address @addr. */
static int edu_write(struct pci_dev *pdev, u64 addr, u32 len, u8 seed)
{
	int ret = -EOPNOTSUPP;
	u32 j;

	mutex_lock(&edu.lock);
	if (edu.pdev && edu.pdev == pdev && edu.stuck) {
		ret = -EIO;
	} else if (edu.pdev && edu.pdev == pdev) {
		for (j = 0; j < len; j++)
			edu.buf[j] = j * 7 + seed;
		for (j = 0, ret = 0; j < len && !ret; j += EDU_CHUNK) {
			u32 n = min(len - j, EDU_CHUNK);

			ret = edu_transfer(edu.buf_dma + j, EDU_BUF, n, 0);
			if (!ret)
				ret = edu_transfer(EDU_BUF, addr + j, n, EDU_DMA_TO_PCI);
		}
	}
	mutex_unlock(&edu.lock);
	return ret;
}

static int edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	void __iomem *regs;
	int ret;

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	regs = pcim_iomap_region(pdev, 0, "p2pd_importer");
	if (IS_ERR(regs))
		return PTR_ERR(regs);
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		return ret;
	pci_set_master(pdev);
	mutex_lock(&edu.lock);
	if (edu.pdev) {
		ret = -EBUSY;
		goto out;
	}
	edu.buf = dmam_alloc_coherent(&pdev->dev, EDU_BUF_SIZE, &edu.buf_dma, GFP_KERNEL);
	if (!edu.buf) {
		ret = -ENOMEM;
		goto out;
	}
	edu.regs = regs;
	edu.pdev = pdev;
	edu.stuck = false;
out:
	mutex_unlock(&edu.lock);
	return ret;
}

/* No transfer runs (they finish under the lock); no later one may start. */
static void edu_remove(struct pci_dev *pdev)
{
	pci_clear_master(pdev);
	mutex_lock(&edu.lock);
	edu.pdev = NULL;
	edu.regs = NULL;
	edu.buf = NULL;
	mutex_unlock(&edu.lock);
}

static const struct pci_device_id edu_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) },
	{ }
};

static struct pci_driver edu_driver = {
	.name = "p2pd_importer",
	.id_table = edu_ids,
	.probe = edu_probe,
	.remove = edu_remove,
};

/* What files gave the module ("keep"): released when it unloads. */
static DEFINE_MUTEX(kept_lock);
static LIST_HEAD(kept_importers);
static LIST_HEAD(kept_peers);

/* Reservation lock held by the caller (dma_buf_invalidate_mappings). */
static void importer_invalidate(struct dma_buf_attachment *att)
{
	struct importer *im = att->importer_priv;

	im->invalidations++;
	pr_info("p2pd_importer: %s: mapping invalidated%s\n", pci_name(im->pdev),
		im->lazy ? " (lazy: kept until unmap)" : "");
	if (!im->lazy && im->sgt) {
		dma_buf_unmap_attachment(att, im->sgt, DMA_BIDIRECTIONAL);
		im->sgt = NULL;
	}
}

static const struct dma_buf_attach_ops ops_p2p = {
	.allow_peer2peer = true,
	.invalidate_mappings = importer_invalidate,
};

static const struct dma_buf_attach_ops ops_nop2p = {
	.allow_peer2peer = false,
	.invalidate_mappings = importer_invalidate,
};

static const struct dma_buf_attach_ops ops_norevoke = {
	.allow_peer2peer = true,
};

static void importer_unmap(struct importer *im)
{
	dma_resv_lock(im->buf->resv, NULL);
	if (im->sgt)
		dma_buf_unmap_attachment(im->att, im->sgt, DMA_BIDIRECTIONAL);
	im->sgt = NULL;
	dma_resv_unlock(im->buf->resv);
}

static const char *importer_fence_name(struct dma_fence *f)
{
	return "p2pd_importer";
}

static const struct dma_fence_ops importer_fence_ops = {
	.get_driver_name = importer_fence_name,
	.get_timeline_name = importer_fence_name,
};

static int importer_fence(struct importer *im)
{
	struct dma_fence *f;
	int ret;

	if (!im->att)
		return -ENOTCONN;
	if (READ_ONCE(im->fence))
		return -EBUSY;
	f = kzalloc_obj(*f);
	if (!f)
		return -ENOMEM;
	/* The fence's own lock: the fence may outlive the importer. */
	dma_fence_init(f, &importer_fence_ops, NULL, dma_fence_context_alloc(1), 1);
	dma_resv_lock(im->buf->resv, NULL);
	ret = dma_resv_reserve_fences(im->buf->resv, 1);
	if (!ret)
		dma_resv_add_fence(im->buf->resv, f, DMA_RESV_USAGE_WRITE);
	dma_resv_unlock(im->buf->resv);
	if (ret) {
		dma_fence_put(f);
		return ret;
	}
	WRITE_ONCE(im->fence, f);
	return 0;
}

/*
 * Takes no lock: a FREE waiting for the fence holds the buffer's
 * reservation lock, which a read of the file may be waiting for under
 * im->lock.
 */
static int importer_signal(struct importer *im)
{
	struct dma_fence *f = xchg(&im->fence, NULL);

	if (!f)
		return -ENOENT;
	dma_fence_signal(f);
	dma_fence_put(f);
	return 0;
}

static void importer_detach(struct importer *im)
{
	importer_signal(im);
	if (!im->att)
		return;
	importer_unmap(im);
	dma_buf_detach(im->buf, im->att);
	dma_buf_put(im->buf);
	pci_dev_put(im->pdev);
	im->att = NULL;
	im->buf = NULL;
	im->pdev = NULL;
}

static int importer_attach(struct importer *im, char *args)
{
	const struct dma_buf_attach_ops *ops = &ops_p2p;
	char *fd_s = strsep(&args, " "), *bdf = strsep(&args, " "), *opt;
	struct dma_buf_attachment *att;
	struct dma_buf *buf;
	struct pci_dev *pdev;
	struct device *dev;
	int fd, ret;

	if (im->att)
		return -EBUSY;
	if (!fd_s || !bdf || kstrtoint(fd_s, 10, &fd))
		return -EINVAL;
	im->lazy = false;
	while ((opt = strsep(&args, " "))) {
		if (!strcmp(opt, "nop2p"))
			ops = &ops_nop2p;
		else if (!strcmp(opt, "norevoke"))
			ops = &ops_norevoke;
		else if (!strcmp(opt, "lazy"))
			im->lazy = true;
		else if (*opt)
			return -EINVAL;
	}
	dev = bus_find_device_by_name(&pci_bus_type, NULL, bdf);
	if (!dev)
		return -ENODEV;
	pdev = to_pci_dev(dev);
	buf = dma_buf_get(fd);
	if (IS_ERR(buf)) {
		ret = PTR_ERR(buf);
		goto put_dev;
	}
	/* Set before the attachment is listed: a revocation may call in at once. */
	im->buf = buf;
	im->pdev = pdev;
	im->invalidations = 0;
	att = dma_buf_dynamic_attach(buf, &pdev->dev, ops, im);
	if (IS_ERR(att)) {
		ret = PTR_ERR(att);
		im->buf = NULL;
		im->pdev = NULL;
		dma_buf_put(buf);
		goto put_dev;
	}
	im->att = att;
	return 0;
put_dev:
	put_device(dev);
	return ret;
}

static int importer_map(struct importer *im)
{
	struct sg_table *sgt;
	int ret = 0;

	if (!im->att)
		return -ENOTCONN;
	dma_resv_lock(im->buf->resv, NULL);
	if (im->sgt) {
		ret = -EBUSY;
		goto out;
	}
	sgt = dma_buf_map_attachment(im->att, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt))
		ret = PTR_ERR(sgt);
	else
		im->sgt = sgt;
out:
	dma_resv_unlock(im->buf->resv);
	return ret;
}

/*
 * "dma OFF LEN SEED": through the mapping, under the reservation lock, so a
 * revocation waits for the transfer as for an importer's DMA in flight (for
 * up to a few hundred ms here; a real importer would publish a fence).
 */
static int importer_dma(struct importer *im, char *args)
{
	char *off_s = strsep(&args, " "), *len_s = strsep(&args, " "), *seed_s = args;
	struct scatterlist *sg;
	u64 off, len, at;
	unsigned int i;
	int ret = -ENOTCONN;
	u8 seed;

	if (!off_s || !len_s || !seed_s || kstrtou64(off_s, 16, &off) ||
	    kstrtou64(len_s, 16, &len) || kstrtou8(seed_s, 10, &seed) || !len ||
	    len > EDU_BUF_SIZE)
		return -EINVAL;
	if (!im->att)
		return -ENOTCONN;
	dma_resv_lock(im->buf->resv, NULL);
	if (!im->sgt)
		goto out;
	ret = -ERANGE;
	at = 0;
	for_each_sgtable_dma_sg(im->sgt, sg, i) {
		if (off >= at && off - at < sg_dma_len(sg) &&
		    len <= sg_dma_len(sg) - (off - at)) {
			ret = edu_write(im->pdev, sg_dma_address(sg) + off - at, len, seed);
			break;
		}
		at += sg_dma_len(sg);
	}
out:
	dma_resv_unlock(im->buf->resv);
	return ret;
}

/* Copies one command in: its verb and the rest (NULL if none). */
static int read_cmd(const char __user *ubuf, size_t len, char *cmd, size_t size, char **verb,
		    char **args)
{
	if (len >= size)
		return -EINVAL;
	if (copy_from_user(cmd, ubuf, len))
		return -EFAULT;
	cmd[len] = '\0';
	*args = strim(cmd);
	*verb = strsep(args, " ");
	return 0;
}

/* Hands an importer or consumer to the module, once. */
static int keep(struct list_head *node, struct list_head *list)
{
	int ret = -EALREADY;

	mutex_lock(&kept_lock);
	if (list_empty(node)) {
		list_add_tail(node, list);
		ret = 0;
	}
	mutex_unlock(&kept_lock);
	return ret;
}

/* Whether the file still owns its importer or consumer (else the module does). */
static bool owned(struct list_head *node)
{
	bool ret;

	mutex_lock(&kept_lock);
	ret = list_empty(node);
	mutex_unlock(&kept_lock);
	return ret;
}

static ssize_t ctl_write(struct file *f, const char __user *ubuf, size_t len, loff_t *pos)
{
	struct importer *im = f->private_data;
	char cmd[96], *args, *verb;
	int ret;

	ret = read_cmd(ubuf, len, cmd, sizeof(cmd), &verb, &args);
	if (ret)
		return ret;
	if (!strcmp(verb, "signal")) {
		ret = importer_signal(im);
		return ret ? ret : len;
	}
	mutex_lock(&im->lock);
	if (!strcmp(verb, "attach") && args)
		ret = importer_attach(im, args);
	else if (!strcmp(verb, "map"))
		ret = importer_map(im);
	else if (!strcmp(verb, "unmap"))
		ret = im->att ? (importer_unmap(im), 0) : -ENOTCONN;
	else if (!strcmp(verb, "detach"))
		ret = im->att ? (importer_detach(im), 0) : -ENOTCONN;
	else if (!strcmp(verb, "dma") && args)
		ret = importer_dma(im, args);
	else if (!strcmp(verb, "keep"))
		ret = im->att ? keep(&im->kept, &kept_importers) : -ENOTCONN;
	else if (!strcmp(verb, "fence"))
		ret = importer_fence(im);
	else
		ret = -EINVAL;
	mutex_unlock(&im->lock);
	return ret ? ret : len;
}

static ssize_t ctl_read(struct file *f, char __user *ubuf, size_t len, loff_t *pos)
{
	struct importer *im = f->private_data;
	struct scatterlist *sg;
	size_t cap = 4096, n = 0;
	unsigned int i, segs = 0;
	ssize_t ret;
	char *out;

	out = kmalloc(cap, GFP_KERNEL);
	if (!out)
		return -ENOMEM;
	mutex_lock(&im->lock);
	if (im->att)
		dma_resv_lock(im->buf->resv, NULL);
	if (im->sgt)
		segs = im->sgt->nents;
	n += scnprintf(out + n, cap - n, "attached %d mapped %d invalidations %u segs %u\n",
		       !!im->att, !!im->sgt, im->invalidations, segs);
	if (im->sgt)
		for_each_sgtable_dma_sg(im->sgt, sg, i)
			n += scnprintf(out + n, cap - n, "seg %llx %x\n",
				       (u64)sg_dma_address(sg), sg_dma_len(sg));
	if (im->att)
		dma_resv_unlock(im->buf->resv);
	mutex_unlock(&im->lock);
	/* Each read gives the whole state (the file is not seekable). */
	ret = simple_read_from_buffer(ubuf, len, &(loff_t){ 0 }, out, n);
	kfree(out);
	return ret;
}

static int ctl_open(struct inode *inode, struct file *f)
{
	struct importer *im = kzalloc(sizeof(*im), GFP_KERNEL);

	if (!im)
		return -ENOMEM;
	mutex_init(&im->lock);
	INIT_LIST_HEAD(&im->kept);
	f->private_data = im;
	return nonseekable_open(inode, f);
}

static int ctl_release(struct inode *inode, struct file *f)
{
	struct importer *im = f->private_data;

	if (!owned(&im->kept))
		return 0;
	importer_detach(im);
	mutex_destroy(&im->lock);
	kfree(im);
	return 0;
}

static const struct file_operations ctl_fops = {
	.owner = THIS_MODULE,
	.open = ctl_open,
	.release = ctl_release,
	.read = ctl_read,
	.write = ctl_write,
};

#define PEER_SEGS 16

struct peer_user {
	struct mutex lock;	/* serialises commands of this file */
	struct list_head kept;	/* in kept_peers once kept */
	struct p2pdirect_peer_mem *mem;
	struct pci_dev *pdev;
	struct p2pdirect_peer_seg segs[PEER_SEGS];
	int nsegs;		/* mapped segments; 0: not mapped */
	atomic_t invalidations;
	struct p2pdirect_peer_mem *cb_mem;	/* putincb: the callback's to put */
	bool slow;		/* the callback sleeps 2 s */
};

/* The range of putincb, if the callback has not put it: put now. */
static void put_cb_mem(struct peer_user *pu)
{
	struct p2pdirect_peer_mem *mem = xchg(&pu->cb_mem, NULL);

	if (mem)
		p2pdirect_peer_put(mem);
}

/*
 * Told the memory goes: takes no lock (p2pdirect_peer_put() waits for it).
 * Its put (putincb) comes last: once it put, the file's release may free
 * @pu at once.
 */
static void peer_invalidate(void *priv)
{
	struct peer_user *pu = priv;

	atomic_inc(&pu->invalidations);
	WRITE_ONCE(pu->nsegs, 0);
	if (READ_ONCE(pu->slow))
		msleep(2000);
	put_cb_mem(pu);
}

static int peer_map(struct peer_user *pu)
{
	int seen = atomic_read(&pu->invalidations);
	int n = p2pdirect_peer_dma_map(pu->mem, &pu->pdev->dev, pu->segs, PEER_SEGS);

	if (n < 0)
		return n;
	/* An invalidation that came meanwhile already unmapped it. */
	if (atomic_read(&pu->invalidations) == seen)
		WRITE_ONCE(pu->nsegs, n);
	return 0;
}

static int peer_unmap(struct peer_user *pu)
{
	p2pdirect_peer_dma_unmap(pu->mem);
	WRITE_ONCE(pu->nsegs, 0);
	return 0;
}

static void peer_release(struct peer_user *pu)
{
	if (!pu->mem)
		return;
	p2pdirect_peer_put(pu->mem);
	pci_dev_put(pu->pdev);
	pu->mem = NULL;
	pu->pdev = NULL;
	pu->nsegs = 0;
}

static int peer_acquire(struct peer_user *pu, char *args)
{
	char *addr_s = strsep(&args, " "), *size_s = strsep(&args, " ");
	char *bdf = strsep(&args, " "), *opt = strsep(&args, " ");
	struct p2pdirect_peer_mem *mem;
	unsigned long addr, size;
	struct device *dev;
	int ret;

	if (pu->mem || READ_ONCE(pu->cb_mem))
		return -EBUSY;
	if (!addr_s || !size_s || !bdf || kstrtoul(addr_s, 16, &addr) ||
	    kstrtoul(size_s, 16, &size) ||
	    (opt && strcmp(opt, "write") && strcmp(opt, "noinval") && strcmp(opt, "putincb") &&
	     strcmp(opt, "slow")))
		return -EINVAL;
	dev = bus_find_device_by_name(&pci_bus_type, NULL, bdf);
	if (!dev)
		return -ENODEV;
	WRITE_ONCE(pu->slow, opt && !strcmp(opt, "slow"));
	mem = p2pdirect_peer_get(addr, size, opt && !strcmp(opt, "write"),
				 opt && !strcmp(opt, "noinval") ? NULL : peer_invalidate, pu);
	if (IS_ERR(mem)) {
		put_device(dev);
		return PTR_ERR(mem);
	}
	if (opt && !strcmp(opt, "putincb")) {
		ret = p2pdirect_peer_dma_map(mem, dev, pu->segs, PEER_SEGS);
		put_device(dev);
		if (ret < 0) {
			p2pdirect_peer_put(mem);
			return ret;
		}
		WRITE_ONCE(pu->nsegs, ret);
		/* An invalidation before this point finds none: the close puts it. */
		xchg(&pu->cb_mem, mem);
		return 0;
	}
	pu->mem = mem;
	pu->pdev = to_pci_dev(dev);
	ret = peer_map(pu);
	if (ret)
		peer_release(pu);
	return ret;
}

static ssize_t peer_write(struct file *f, const char __user *ubuf, size_t len, loff_t *pos)
{
	struct peer_user *pu = f->private_data;
	char cmd[96], *args, *verb;
	int ret;

	ret = read_cmd(ubuf, len, cmd, sizeof(cmd), &verb, &args);
	if (ret)
		return ret;
	mutex_lock(&pu->lock);
	if (!strcmp(verb, "acquire") && args)
		ret = peer_acquire(pu, args);
	else if (!pu->mem)
		ret = -ENOTCONN;
	else if (!strcmp(verb, "map"))
		ret = peer_map(pu);
	else if (!strcmp(verb, "unmap"))
		ret = peer_unmap(pu);
	else if (!strcmp(verb, "release"))
		ret = (peer_release(pu), 0);
	else if (!strcmp(verb, "keep"))
		ret = keep(&pu->kept, &kept_peers);
	else
		ret = -EINVAL;
	mutex_unlock(&pu->lock);
	return ret ? ret : len;
}

static ssize_t peer_read(struct file *f, char __user *ubuf, size_t len, loff_t *pos)
{
	struct peer_user *pu = f->private_data;
	size_t cap = 2048, n = 0;
	int i, segs;
	ssize_t ret;
	char *out;

	out = kmalloc(cap, GFP_KERNEL);
	if (!out)
		return -ENOMEM;
	mutex_lock(&pu->lock);
	segs = READ_ONCE(pu->nsegs);
	n += scnprintf(out + n, cap - n, "attached %d mapped %d invalidations %u segs %d\n",
		       !!pu->mem, segs > 0, atomic_read(&pu->invalidations), segs);
	for (i = 0; i < segs; i++)
		n += scnprintf(out + n, cap - n, "seg %llx %llx\n", pu->segs[i].addr,
			       pu->segs[i].len);
	if (pu->mem)
		n += scnprintf(out + n, cap - n, "pagesize %lu\n",
			       p2pdirect_peer_page_size(pu->mem));
	mutex_unlock(&pu->lock);
	ret = simple_read_from_buffer(ubuf, len, &(loff_t){ 0 }, out, n);
	kfree(out);
	return ret;
}

static int peer_open(struct inode *inode, struct file *f)
{
	struct peer_user *pu = kzalloc(sizeof(*pu), GFP_KERNEL);

	if (!pu)
		return -ENOMEM;
	mutex_init(&pu->lock);
	INIT_LIST_HEAD(&pu->kept);
	f->private_data = pu;
	return nonseekable_open(inode, f);
}

static int peer_file_release(struct inode *inode, struct file *f)
{
	struct peer_user *pu = f->private_data;

	if (!owned(&pu->kept))
		return 0;
	peer_release(pu);
	put_cb_mem(pu);
	mutex_destroy(&pu->lock);
	kfree(pu);
	return 0;
}

static const struct file_operations peer_fops = {
	.owner = THIS_MODULE,
	.open = peer_open,
	.release = peer_file_release,
	.read = peer_read,
	.write = peer_write,
};

static int __init importer_init(void)
{
	int ret = pci_register_driver(&edu_driver);

	if (ret)
		return ret;
	dir = debugfs_create_dir("p2pd_importer", NULL);
	debugfs_create_file("ctl", 0600, dir, NULL, &ctl_fops);
	debugfs_create_file("peer", 0600, dir, NULL, &peer_fops);
	return 0;
}

/* No file is open (each holds the module): what is kept is the module's alone. */
static void __exit importer_exit(void)
{
	struct peer_user *pu, *pn;
	struct importer *im, *in;

	debugfs_remove_recursive(dir);
	list_for_each_entry_safe(im, in, &kept_importers, kept) {
		if (im->att)
			pr_info("p2pd_importer: unloading: %s detaches\n", pci_name(im->pdev));
		importer_detach(im);
		mutex_destroy(&im->lock);
		kfree(im);
	}
	list_for_each_entry_safe(pu, pn, &kept_peers, kept) {
		if (pu->mem)
			pr_info("p2pd_importer: unloading: %s releases its range\n",
				pci_name(pu->pdev));
		peer_release(pu);
		put_cb_mem(pu);
		mutex_destroy(&pu->lock);
		kfree(pu);
	}
	pci_unregister_driver(&edu_driver);
}

module_init(importer_init);
module_exit(importer_exit);
MODULE_DESCRIPTION("dma-buf importer for p2pdirect's tests");
MODULE_LICENSE("GPL");
