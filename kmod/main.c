// SPDX-License-Identifier: GPL-2.0
/*
 * cxlkv.ko: exposes memory shared by several hosts (CXL Type-3 memory, an
 * ivshmem device between virtual machines, or a test-only emulated range)
 * as /dev/cxlkvN, with the pool superblock and carves of uapi/cxlkv_pool.h,
 * per-carve memory types, DDIO control and global lock slot ownership.
 */
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "cxlkv_internal.h"

unsigned int cxlkv_node_id;
module_param_named(node_id, cxlkv_node_id, uint, 0444);
MODULE_PARM_DESC(node_id, "this host's node id in the pool (0 .. max_nodes-1)");

/*
 * Permission model (kmod/README.md): the device file's own mode decides who
 * may open it; writing ioctls need the file open for writing; carve and
 * memory-type changes and format need CAP_SYS_ADMIN or admin_gid.
 */
int cxlkv_admin_gid = -1;
module_param_named(admin_gid, cxlkv_admin_gid, int, 0644);
MODULE_PARM_DESC(admin_gid, "group whose members may format, create/remove carves and set memory types without CAP_SYS_ADMIN (-1: none)");

unsigned int cxlkv_max_slots_per_file = 256;
module_param_named(max_slots_per_file, cxlkv_max_slots_per_file, uint, 0644);
MODULE_PARM_DESC(max_slots_per_file, "lock slots one open file may own at once (0: no limit)");

bool cxlkv_admin(void)
{
	int gid = READ_ONCE(cxlkv_admin_gid);

	if (gid >= 0) {
		kgid_t k = make_kgid(&init_user_ns, gid);

		if (gid_valid(k) && in_group_p(k))
			return true;
	}
	return capable(CAP_SYS_ADMIN);
}

static bool format;
module_param(format, bool, 0444);
MODULE_PARM_DESC(format, "write a fresh superblock and control carve on every backing at load (destroys the pool)");

static unsigned int format_max_nodes = 16;
module_param(format_max_nodes, uint, 0444);
MODULE_PARM_DESC(format_max_nodes, "max_nodes written by format=1 (1..64)");

static unsigned int format_max_locks = CXLKV_DEFAULT_MAX_LOCKS;
module_param(format_max_locks, uint, 0444);
MODULE_PARM_DESC(format_max_locks, "lock ids in the control carve written by format=1");

static DEFINE_IDA(cxlkv_ida);
static LIST_HEAD(cxlkv_devices);
static DEFINE_MUTEX(cxlkv_devices_lock);

static int cxlkv_open(struct inode *inode, struct file *f)
{
	struct cxlkv_dev *d = container_of(f->private_data, struct cxlkv_dev, misc);
	struct cxlkv_file *cf;

	cf = kzalloc(sizeof(*cf), GFP_KERNEL);
	if (!cf)
		return -ENOMEM;
	cf->dev = d;
	cf->tgid = task_tgid_nr(current);
	f->private_data = cf;
	return 0;
}

/*
 * Called when the last reference to the file goes, including when its
 * process dies: the global lock slots it owned are set idle so that other
 * hosts are not blocked by a dead holder.
 */
static int cxlkv_release(struct inode *inode, struct file *f)
{
	struct cxlkv_file *cf = f->private_data;

	cxlkv_lock_release_all(cf);
	kfree(cf);
	return 0;
}

static const struct file_operations cxlkv_fops = {
	.owner = THIS_MODULE,
	.open = cxlkv_open,
	.release = cxlkv_release,
	.unlocked_ioctl = cxlkv_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = cxlkv_mmap,
	.llseek = noop_llseek,
};

struct cxlkv_dev *cxlkv_dev_alloc(u32 kind)
{
	struct cxlkv_dev *d = kzalloc(sizeof(*d), GFP_KERNEL);

	if (!d)
		return NULL;
	d->kind = kind;
	d->index = -1;
	mutex_init(&d->lock);
	mutex_init(&d->maps_lock);
	INIT_LIST_HEAD(&d->maps);
	INIT_LIST_HEAD(&d->node);
	xa_init_flags(&d->locks, XA_FLAGS_ALLOC);
	return d;
}

void cxlkv_dev_free(struct cxlkv_dev *d)
{
	if (!d)
		return;
	xa_destroy(&d->locks);
	mutex_destroy(&d->lock);
	mutex_destroy(&d->maps_lock);
	kfree(d);
}

/* Format if asked, then make the backing visible as /dev/cxlkvN. */
int cxlkv_dev_register(struct cxlkv_dev *d)
{
	int ret;

	ret = ida_alloc(&cxlkv_ida, GFP_KERNEL);
	if (ret < 0)
		return ret;
	d->index = ret;
	snprintf(d->name, sizeof(d->name), "cxlkv%d", d->index);

	if (format) {
		mutex_lock(&d->lock);
		ret = cxlkv_format(d, format_max_nodes, format_max_locks);
		mutex_unlock(&d->lock);
		if (ret) {
			pr_err("%s: format of %s failed: %d\n", d->name, d->backing_name, ret);
			goto err_ida;
		}
	}

	d->misc.minor = MISC_DYNAMIC_MINOR;
	d->misc.name = d->name;
	d->misc.fops = &cxlkv_fops;
	d->misc.mode = 0600;
	ret = misc_register(&d->misc);
	if (ret)
		goto err_ida;

	mutex_lock(&cxlkv_devices_lock);
	list_add_tail(&d->node, &cxlkv_devices);
	mutex_unlock(&cxlkv_devices_lock);
	pr_info("%s: %s, %llu MiB at phys %pa, node %u%s\n", d->name, d->backing_name,
		d->size >> 20, &d->phys, cxlkv_node_id, format ? ", formatted" : "");
	return 0;

err_ida:
	ida_free(&cxlkv_ida, d->index);
	d->index = -1;
	return ret;
}

void cxlkv_dev_unregister(struct cxlkv_dev *d)
{
	if (d->index < 0)
		return;
	mutex_lock(&cxlkv_devices_lock);
	list_del_init(&d->node);
	mutex_unlock(&cxlkv_devices_lock);
	misc_deregister(&d->misc);
	ida_free(&cxlkv_ida, d->index);
	d->index = -1;
}

static int __init cxlkv_init(void)
{
	int ret;

	if (format && (format_max_nodes < 1 || format_max_nodes > CXLKV_MAX_NODES ||
		       format_max_locks < CXLKV_MIN_LOCKS || format_max_locks > CXLKV_MAX_LOCKS)) {
		pr_err("cxlkv: format_max_nodes must be 1..%u and format_max_locks %u..%u\n",
		       CXLKV_MAX_NODES, CXLKV_MIN_LOCKS, CXLKV_MAX_LOCKS);
		return -EINVAL;
	}
	if (cxlkv_node_id >= CXLKV_MAX_NODES) {
		pr_err("cxlkv: node_id %u is not below %u\n", cxlkv_node_id, CXLKV_MAX_NODES);
		return -EINVAL;
	}

	ret = cxlkv_phys_init();
	if (ret)
		return ret;
	ret = cxlkv_emulated_init();
	if (ret)
		goto err_phys;
	ret = cxlkv_ivshmem_init();
	if (ret)
		goto err_emulated;
	return 0;

err_emulated:
	cxlkv_emulated_exit();
err_phys:
	cxlkv_phys_exit();
	return ret;
}

static void __exit cxlkv_exit(void)
{
	cxlkv_ivshmem_exit();
	cxlkv_emulated_exit();
	cxlkv_phys_exit();
	/* The root ports' allocating-write setting is put back as found. */
	cxlkv_ddio_restore_all();
	ida_destroy(&cxlkv_ida);
}

module_init(cxlkv_init);
module_exit(cxlkv_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION(CXLKV_MODULE_VERSION);
MODULE_DESCRIPTION("cxlkv: shared memory pool devices for a rack-wide KV cache");
