// SPDX-License-Identifier: GPL-2.0
/*
 * ioctl dispatch for /dev/cxlkvN (ABI: uapi/cxlkv_ioctl.h).
 *
 * Every command is matched whole (number, direction and argument size), so
 * a caller built against another struct size gets -ENOTTY.  Arguments are
 * copied in before dev->lock is taken and copied out after it is dropped
 * (see the locking order in cxlkv_internal.h).  Reserved input fields must
 * be zero so that they can take a meaning later.
 */
#include <linux/fs.h>
#include <linux/pgtable.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "cxlkv_internal.h"

static bool zeroed(const void *p, size_t n)
{
	return !memchr_inv(p, 0, n);
}

static int do_version(void __user *arg)
{
	struct cxlkv_ioc_version v = {
		.abi_version = CXLKV_IOCTL_ABI_VERSION,
		.layout_version = CXLKV_LAYOUT_VERSION,
	};

	strscpy(v.module_version, CXLKV_MODULE_VERSION, sizeof(v.module_version));
	return copy_to_user(arg, &v, sizeof(v)) ? -EFAULT : 0;
}

static int do_info(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_ioc_info in = {};
	struct cxlkv_superblock *sb;

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	in.size = d->size;
	in.phys_base = d->phys;
	in.backing = d->kind;
	in.node_id = cxlkv_node_id;
	in.mtrr_state = CXLKV_MTRR_UNAVAILABLE;	/* mtrr_type_lookup() is not exported */
	if (d->kind != CXLKV_BACKING_EMULATED && pat_enabled())
		in.flags |= CXLKV_INFO_F_PAT;
	strscpy(in.backing_name, d->backing_name, sizeof(in.backing_name));

	mutex_lock(&d->lock);
	in.lock_slots_in_use = d->nlocks;
	if (!cxlkv_sb_read_quiet(d, sb, true)) {
		in.flags |= CXLKV_INFO_F_FORMATTED;
		in.size = sb->pool_size;
		in.ncarves = sb->ncarves;
		in.max_nodes = sb->max_nodes;
		if (cxlkv_sb_find(sb, CXLKV_CARVE_CONTROL) >= 0)
			cxlkv_ctrl_limits(d, sb, &in.max_locks);
	}
	mutex_unlock(&d->lock);
	kfree(sb);
	return copy_to_user(arg, &in, sizeof(in)) ? -EFAULT : 0;
}

static int do_format(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_ioc_format a;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.max_nodes < 1 || a.max_nodes > CXLKV_MAX_NODES ||
	    (a.flags & ~CXLKV_FORMAT_F_FORCE) || !zeroed(a.reserved, sizeof(a.reserved)))
		return -EINVAL;
	if (!cxlkv_admin())
		return -EPERM;
	mutex_lock(&d->lock);
	mutex_lock(&d->maps_lock);
	ret = cxlkv_format_empty(d, a.max_nodes, a.flags & CXLKV_FORMAT_F_FORCE);
	mutex_unlock(&d->maps_lock);
	mutex_unlock(&d->lock);
	if (ret == -EBUSY)
		cxlkv_diag(d, "format refused: carves are mapped or lock slots owned on this host");
	else if (ret == -EEXIST)
		cxlkv_diag(d, "format refused: the pool holds a valid superblock (force to overwrite)");
	return ret;
}

static int do_carve_create(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_carve c;
	int ret;

	if (copy_from_user(&c, arg, sizeof(c)))
		return -EFAULT;
	if (!cxlkv_name_valid(c.name) || !c.size || c.offset || c.reserved ||
	    c.memtype > CXLKV_MEM_MAX || (c.flags & ~CXLKV_CARVE_F_ALL)) {
		cxlkv_diag(d, "carve create: bad name, size, memtype, flags or nonzero offset/reserved");
		return -EINVAL;
	}
	mutex_lock(&d->lock);
	ret = cxlkv_carve_create(d, &c);
	mutex_unlock(&d->lock);
	if (ret)
		return ret;
	return copy_to_user(arg, &c, sizeof(c)) ? -EFAULT : 0;
}

static int do_carve_lookup(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_superblock *sb;
	struct cxlkv_carve c;
	int ret, i;

	if (copy_from_user(&c, arg, sizeof(c)))
		return -EFAULT;
	if (!cxlkv_name_valid(c.name))
		return -EINVAL;
	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	mutex_lock(&d->lock);
	ret = cxlkv_sb_read(d, sb);
	mutex_unlock(&d->lock);
	if (!ret) {
		i = cxlkv_sb_find(sb, c.name);
		if (i < 0)
			ret = -ENOENT;
		else
			c = sb->carves[i];
	}
	kfree(sb);
	if (ret)
		return ret;
	return copy_to_user(arg, &c, sizeof(c)) ? -EFAULT : 0;
}

static int do_carve_list(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_ioc_carve_list *l;
	struct cxlkv_superblock *sb;
	int ret;

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	l = kzalloc(sizeof(*l), GFP_KERNEL);
	ret = -ENOMEM;
	if (!sb || !l)
		goto out;
	mutex_lock(&d->lock);
	ret = cxlkv_sb_read(d, sb);
	mutex_unlock(&d->lock);
	if (ret)
		goto out;
	l->count = sb->ncarves;
	l->generation = sb->generation;
	memcpy(l->carves, sb->carves, sb->ncarves * sizeof(sb->carves[0]));
	ret = copy_to_user(arg, l, sizeof(*l)) ? -EFAULT : 0;
out:
	kfree(l);
	kfree(sb);
	return ret;
}

static int do_carve_remove(struct cxlkv_dev *d, void __user *arg)
{
	struct cxlkv_ioc_carve_remove r;
	int ret;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	if (!cxlkv_name_valid(r.name) || (r.flags & ~CXLKV_CARVE_RM_FORCE) || r.reserved0 ||
	    !zeroed(r.reserved, sizeof(r.reserved)))
		return -EINVAL;
	mutex_lock(&d->lock);
	ret = cxlkv_carve_remove(d, r.name, r.flags);
	mutex_unlock(&d->lock);
	if (ret == -EPERM)
		cxlkv_diag(d, "carve %s is a system carve; remove it with the force flag", r.name);
	else if (ret == -EBUSY)
		cxlkv_diag(d, "carve %s is mapped on this host", r.name);
	return ret;
}

static int do_memtype(struct cxlkv_dev *d, void __user *arg, bool set)
{
	struct cxlkv_ioc_memtype m;
	struct cxlkv_superblock *sb;
	int ret, i;

	if (copy_from_user(&m, arg, sizeof(m)))
		return -EFAULT;
	if (!cxlkv_name_valid(m.name) || !zeroed(m.reserved, sizeof(m.reserved)) ||
	    (set && (m.memtype > CXLKV_MEM_MAX || m.mappings)))
		return -EINVAL;
	if (set) {
		mutex_lock(&d->lock);
		ret = cxlkv_memtype_set(d, m.name, m.memtype);
		mutex_unlock(&d->lock);
		if (ret == -EBUSY)
			cxlkv_diag(d, "memtype of carve %s not changed: it is mapped on this host",
				   m.name);
		return ret;
	}
	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	mutex_lock(&d->lock);
	ret = cxlkv_sb_read(d, sb);
	mutex_unlock(&d->lock);
	if (!ret) {
		i = cxlkv_sb_find(sb, m.name);
		if (i < 0) {
			ret = -ENOENT;
		} else {
			m.memtype = sb->carves[i].memtype;
			m.mappings = cxlkv_mappings_of(d, sb->carves[i].offset);
		}
	}
	kfree(sb);
	if (ret)
		return ret;
	return copy_to_user(arg, &m, sizeof(m)) ? -EFAULT : 0;
}

static int do_ddio(struct cxlkv_dev *d, void __user *arg, bool set)
{
	struct cxlkv_ioc_ddio a;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.reserved0 || (a.flags & ~CXLKV_DDIO_F_FORCE) || !zeroed(a.reserved, sizeof(a.reserved)) ||
	    a.enable > 1 || (!set && a.enable))
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	ret = set ? cxlkv_ddio_set(d, &a) : cxlkv_ddio_get(d, &a);
	if (ret)
		return ret;
	return copy_to_user(arg, &a, sizeof(a)) ? -EFAULT : 0;
}

static int do_lock(struct cxlkv_file *cf, void __user *arg, bool alloc)
{
	struct cxlkv_ioc_lock a;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	/* node, slot_off and grant_off are outputs: ignored on input */
	if (!zeroed(a.reserved, sizeof(a.reserved)) || a.reserved0 ||
	    (a.flags & ~CXLKV_LOCK_F_RUNTIME) || (!alloc && a.flags) ||
	    (!alloc && a.lock_id == CXLKV_LOCK_ANY))
		return -EINVAL;
	ret = alloc ? cxlkv_lock_alloc(cf, &a) : cxlkv_lock_free(cf, &a);
	if (ret || !alloc)
		return ret;
	if (copy_to_user(arg, &a, sizeof(a))) {
		/* the caller cannot learn its slot: do not leave it owned */
		cxlkv_lock_free(cf, &a);
		return -EFAULT;
	}
	return 0;
}

static int do_lock_list(struct cxlkv_file *cf, void __user *arg)
{
	struct cxlkv_ioc_lock_list *l;
	u32 start;
	int ret;

	if (get_user(start, (u32 __user *)arg))
		return -EFAULT;
	l = kzalloc(sizeof(*l), GFP_KERNEL);
	if (!l)
		return -ENOMEM;
	l->start = start;
	ret = cxlkv_lock_list(cf, l);
	if (!ret && copy_to_user(arg, l, sizeof(*l)))
		ret = -EFAULT;
	kfree(l);
	return ret;
}

long cxlkv_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct cxlkv_file *cf = f->private_data;
	struct cxlkv_dev *d = cf->dev;
	void __user *u = (void __user *)arg;

	switch (cmd) {
	case CXLKV_IOC_GET_VERSION:
		return do_version(u);
	case CXLKV_IOC_INFO:
		return do_info(d, u);
	case CXLKV_IOC_FORMAT:
	case CXLKV_IOC_CARVE_CREATE:
	case CXLKV_IOC_CARVE_REMOVE:
	case CXLKV_IOC_MEMTYPE_SET:
		/* changes to the pool layout: a writable file and an administrator */
		if (!(f->f_mode & FMODE_WRITE))
			return -EBADF;
		if (cmd == CXLKV_IOC_FORMAT)
			return do_format(d, u);
		if (!cxlkv_admin()) {
			cxlkv_diag(d, "carve and memory type changes need CAP_SYS_ADMIN or the admin_gid group");
			return -EPERM;
		}
		if (cmd == CXLKV_IOC_CARVE_CREATE)
			return do_carve_create(d, u);
		if (cmd == CXLKV_IOC_CARVE_REMOVE)
			return do_carve_remove(d, u);
		return do_memtype(d, u, true);
	case CXLKV_IOC_CARVE_LOOKUP:
		return do_carve_lookup(d, u);
	case CXLKV_IOC_CARVE_LIST:
		return do_carve_list(d, u);
	case CXLKV_IOC_MEMTYPE_GET:
		return do_memtype(d, u, false);
	case CXLKV_IOC_DDIO_GET:
		return do_ddio(d, u, false);
	case CXLKV_IOC_DDIO_SET:
		return do_ddio(d, u, true);
	case CXLKV_IOC_LOCK_ALLOC:
	case CXLKV_IOC_LOCK_FREE:
		/* owning a slot sets pool state on the owner's behalf: writers only */
		if (!(f->f_mode & FMODE_WRITE))
			return -EBADF;
		return do_lock(cf, u, cmd == CXLKV_IOC_LOCK_ALLOC);
	case CXLKV_IOC_LOCK_LIST:
		return do_lock_list(cf, u);
	}
	if (_IOC_TYPE(cmd) == CXLKV_IOC_MAGIC)
		cxlkv_diag(d, "unknown ioctl %#x (nr %#x, size %u): ABI version mismatch?",
			   cmd, _IOC_NR(cmd), _IOC_SIZE(cmd));
	return -ENOTTY;
}
