// SPDX-License-Identifier: GPL-2.0
/*
 * mmap of /dev/cxlkvN: the file offset is a pool offset.  A mapping lies
 * inside one carve and gets that carve's memory type; the superblock page
 * may be mapped read-only so that readers can poll it.  Everything else is
 * refused.  Live mappings are counted per carve (vm_operations open/close)
 * so that changing the type or removing a mapped carve can be refused.
 *
 * Memory types are enforced by PAT: remap_pfn_range() reserves the type for
 * the mapped physical range and fails if that range already has another.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/version.h>
#include <linux/vmalloc.h>

#include "cxlkv_internal.h"

static void cxlkv_set_vm_flags(struct vm_area_struct *vma, unsigned long set,
			       unsigned long clear)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_mod(vma, set, clear);
#else
	vma->vm_flags = (vma->vm_flags | set) & ~clear;
#endif
}

int cxlkv_mappings_of(struct cxlkv_dev *d, u64 carve_off)
{
	struct cxlkv_map_rec *r;
	int n = 0;

	mutex_lock(&d->maps_lock);
	list_for_each_entry(r, &d->maps, node)
		if (r->offset == carve_off)
			n += r->nvma;
	mutex_unlock(&d->maps_lock);
	return n;
}

static void cxlkv_vm_open(struct vm_area_struct *vma)
{
	struct cxlkv_map_rec *r = vma->vm_private_data;

	mutex_lock(&r->dev->maps_lock);
	r->nvma++;
	mutex_unlock(&r->dev->maps_lock);
}

static void cxlkv_vm_close(struct vm_area_struct *vma)
{
	struct cxlkv_map_rec *r = vma->vm_private_data;
	struct cxlkv_dev *d = r->dev;

	mutex_lock(&d->maps_lock);
	if (--r->nvma == 0) {
		list_del(&r->node);
		kfree(r);
	}
	mutex_unlock(&d->maps_lock);
}

/*
 * PAT reserves the memory type for the whole range of a VM_PFNMAP mapping
 * and frees it by exact range when the vma goes; a vma split by a partial
 * munmap() or mprotect() would free pieces that were never reserved and
 * leak the reservation.  So a pool mapping is unmapped whole.
 */
static int cxlkv_vm_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	struct cxlkv_map_rec *r = vma->vm_private_data;

	cxlkv_diag(r->dev, "partial unmap or mprotect of a pool mapping refused");
	return -EINVAL;
}

static const struct vm_operations_struct cxlkv_vm_ops = {
	.open = cxlkv_vm_open,
	.close = cxlkv_vm_close,
	.may_split = cxlkv_vm_may_split,
};

/* Count one more mapping of the carve; the record lives while any exist. */
static struct cxlkv_map_rec *map_rec_get(struct cxlkv_dev *d, const struct cxlkv_carve *c)
{
	struct cxlkv_map_rec *r;

	mutex_lock(&d->maps_lock);
	list_for_each_entry(r, &d->maps, node) {
		if (r->offset == c->offset) {
			r->nvma++;
			goto out;
		}
	}
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (r) {
		r->dev = d;
		r->offset = c->offset;
		r->size = c->size;
		r->memtype = c->memtype;
		r->nvma = 1;
		list_add(&r->node, &d->maps);
	}
out:
	mutex_unlock(&d->maps_lock);
	return r;
}

static pgprot_t memtype_prot(pgprot_t prot, u32 memtype)
{
	switch (memtype) {
	case CXLKV_MEM_WC:
		return pgprot_writecombine(prot);
	case CXLKV_MEM_UC:
		return pgprot_noncached(prot);
	default:
		return prot;
	}
}

static int map_pages(struct cxlkv_dev *d, struct vm_area_struct *vma, u64 off, u64 len)
{
	if (d->kind == CXLKV_BACKING_EMULATED)
		/* RAM pages: always write-back, see backing.c */
		return remap_vmalloc_range(vma, d->vbase, off >> PAGE_SHIFT);
	return io_remap_pfn_range(vma, vma->vm_start, (d->phys + off) >> PAGE_SHIFT, len,
				  vma->vm_page_prot);
}

/* Device memory is VM_IO (no get_user_pages, no core dumps); RAM is not. */
static unsigned long io_flags(struct cxlkv_dev *d)
{
	if (d->kind == CXLKV_BACKING_EMULATED)
		return VM_DONTEXPAND | VM_DONTDUMP;
	return VM_IO | VM_DONTEXPAND | VM_DONTDUMP;
}

int cxlkv_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct cxlkv_file *cf = f->private_data;
	struct cxlkv_dev *d = cf->dev;
	struct cxlkv_superblock *sb = NULL;
	const struct cxlkv_carve *c = NULL;
	struct cxlkv_map_rec *r;
	u64 off, len;
	u32 i;
	int ret;

	len = vma->vm_end - vma->vm_start;
	if (vma->vm_pgoff > (U64_MAX >> PAGE_SHIFT))
		return -EINVAL;
	off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	if (!(vma->vm_flags & VM_SHARED)) {
		cxlkv_diag(d, "mmap at %#llx refused: pool mappings must be MAP_SHARED", off);
		return -EINVAL;
	}

	if (off == 0) {
		/* The superblock page: read-only, write-back like the kernel's view. */
		if (len != PAGE_SIZE || (vma->vm_flags & VM_WRITE)) {
			cxlkv_diag(d, "mmap of the superblock must be one read-only page");
			return -EINVAL;
		}
		cxlkv_set_vm_flags(vma, io_flags(d), VM_MAYWRITE);
		return map_pages(d, vma, 0, len);
	}

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	mutex_lock(&d->lock);
	ret = cxlkv_sb_read(d, sb);
	if (ret)
		goto out;
	for (i = 0; i < sb->ncarves; i++) {
		const struct cxlkv_carve *k = &sb->carves[i];

		if (off >= k->offset && off - k->offset < k->size &&
		    len <= k->size - (off - k->offset))
			c = k;
	}
	ret = -EINVAL;
	if (!c) {
		cxlkv_diag(d, "mmap [%#llx, +%#llx) refused: not inside one carve", off, len);
		goto out;
	}
	ret = -ENOMEM;
	r = map_rec_get(d, c);
	if (!r)
		goto out;
	if (d->kind != CXLKV_BACKING_EMULATED)
		vma->vm_page_prot = memtype_prot(vma->vm_page_prot, c->memtype);
	cxlkv_set_vm_flags(vma, io_flags(d), 0);
	vma->vm_private_data = r;
	ret = map_pages(d, vma, off, len);
	if (ret) {
		cxlkv_diag(d, "mmap of carve %s failed: %d (memory type conflict?)", c->name, ret);
		cxlkv_vm_close(vma);
		goto out;
	}
	vma->vm_ops = &cxlkv_vm_ops;
out:
	mutex_unlock(&d->lock);
	kfree(sb);
	return ret;
}
