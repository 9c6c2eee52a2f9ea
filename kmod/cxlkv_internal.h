/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxlkv.ko internals: one struct cxlkv_dev per backing range, exposed as
 * the misc device /dev/cxlkvN; one struct cxlkv_file per open file.
 *
 * Locking order (never take them the other way round):
 *   mmap_lock -> dev->lock -> dev->maps_lock
 * ioctls copy their arguments in before taking dev->lock and out after
 * dropping it, so no user fault (which takes mmap_lock) happens under it.
 */
#ifndef CXLKV_INTERNAL_H
#define CXLKV_INTERNAL_H

#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/types.h>
#include <linux/xarray.h>

#include "cxlkv_pool.h"
#include "cxlkv_ioctl.h"

#define CXLKV_MODULE_VERSION "0.1.0"

struct cxlkv_dev {
	struct miscdevice misc;
	char name[16];			/* "cxlkvN" */
	int index;
	struct list_head node;		/* in cxlkv_devices */

	u32 kind;			/* enum cxlkv_backing_kind */
	char backing_name[32];
	phys_addr_t phys;		/* 0 for emulated */
	u64 size;			/* bytes of the backing */
	void *vbase;			/* emulated only: vmalloc_user() memory */
	struct pci_dev *pdev;		/* ivshmem only */
	bool region_claimed;		/* phys only: request_mem_region() held */

	struct mutex lock;		/* superblock updates, lock slot table */
	struct xarray locks;		/* lock id -> owning struct cxlkv_file */
	u32 nlocks;

	struct mutex maps_lock;		/* the mapping records below */
	struct list_head maps;		/* struct cxlkv_map_rec, one per mapped carve */
};

/* Live user mappings of one carve on this host (vm_operations open/close). */
struct cxlkv_map_rec {
	struct list_head node;
	struct cxlkv_dev *dev;
	u64 offset;			/* carve offset: identifies the carve */
	u64 size;
	u32 memtype;
	int nvma;
};

struct cxlkv_file {
	struct cxlkv_dev *dev;
	pid_t tgid;			/* opener, recorded as lock slot owner_pid */
	u32 nslots;			/* lock slots this file owns (dev->lock) */
};

/* Rate-limited diagnostic naming the device and the calling process. */
#define cxlkv_diag(d, fmt, ...)						\
	pr_warn_ratelimited("%s: %s[%d]: " fmt "\n", (d)->name,	\
			    current->comm, task_tgid_nr(current), ##__VA_ARGS__)

extern unsigned int cxlkv_node_id;
extern int cxlkv_admin_gid;
extern unsigned int cxlkv_max_slots_per_file;

/* main.c: CAP_SYS_ADMIN, or membership of the admin_gid group. */
bool cxlkv_admin(void);

/* main.c */
int cxlkv_dev_register(struct cxlkv_dev *d);
void cxlkv_dev_unregister(struct cxlkv_dev *d);
struct cxlkv_dev *cxlkv_dev_alloc(u32 kind);
void cxlkv_dev_free(struct cxlkv_dev *d);

/* backing.c: kernel access to pool bytes with a given memory type. */
void *cxlkv_map(struct cxlkv_dev *d, u64 off, size_t len, u32 memtype);
void cxlkv_unmap(struct cxlkv_dev *d, void *p, u32 memtype);
int cxlkv_phys_init(void);
void cxlkv_phys_exit(void);
int cxlkv_emulated_init(void);
void cxlkv_emulated_exit(void);
int cxlkv_ivshmem_init(void);
void cxlkv_ivshmem_exit(void);

/* superblock.c (callers hold dev->lock) */
int cxlkv_sb_read(struct cxlkv_dev *d, struct cxlkv_superblock *sb);
int cxlkv_sb_read_quiet(struct cxlkv_dev *d, struct cxlkv_superblock *sb, bool quiet);
int cxlkv_sb_write(struct cxlkv_dev *d, struct cxlkv_superblock *sb);
int cxlkv_sb_find(const struct cxlkv_superblock *sb, const char *name);
int cxlkv_name_valid(const char *name);
int cxlkv_carve_create(struct cxlkv_dev *d, struct cxlkv_carve *c);
int cxlkv_carve_remove(struct cxlkv_dev *d, const char *name, u32 flags);
int cxlkv_memtype_set(struct cxlkv_dev *d, const char *name, u32 memtype);
int cxlkv_format(struct cxlkv_dev *d, u32 max_nodes, u32 max_locks);
int cxlkv_format_empty(struct cxlkv_dev *d, u32 max_nodes, bool force);

/* mmap.c */
int cxlkv_mmap(struct file *f, struct vm_area_struct *vma);
int cxlkv_mappings_of(struct cxlkv_dev *d, u64 carve_off);

/* lockslot.c */
int cxlkv_lock_alloc(struct cxlkv_file *cf, struct cxlkv_ioc_lock *a);
int cxlkv_lock_free(struct cxlkv_file *cf, struct cxlkv_ioc_lock *a);
int cxlkv_lock_list(struct cxlkv_file *cf, struct cxlkv_ioc_lock_list *l);
void cxlkv_lock_release_all(struct cxlkv_file *cf);
int cxlkv_ctrl_limits(struct cxlkv_dev *d, const struct cxlkv_superblock *sb,
		      u32 *max_locks);

/* ddio.c */
int cxlkv_ddio_get(struct cxlkv_dev *d, struct cxlkv_ioc_ddio *a);
int cxlkv_ddio_set(struct cxlkv_dev *d, struct cxlkv_ioc_ddio *a);
void cxlkv_ddio_restore_all(void);

/* ioctl.c */
long cxlkv_ioctl(struct file *f, unsigned int cmd, unsigned long arg);

#endif /* CXLKV_INTERNAL_H */
