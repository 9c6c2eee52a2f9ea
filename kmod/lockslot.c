// SPDX-License-Identifier: GPL-2.0
/*
 * Ownership of this node's global lock slots (uapi/cxlkv_ctrl.h).
 *
 * The lock protocol itself (tickets, grants, the lock manager) runs in
 * userspace.  The module records which open file owns this node's slot of
 * each lock id, and when that file is closed -- also when its process dies
 * holding the lock -- it sets the slot idle on the owner's behalf so that
 * the lock manager can grant the lock to another node.
 *
 * `request` is written by both the runtime and the kernel of this node, so
 * it is written only with 8-byte non-temporal stores (rule 1), then flushed
 * and fenced so that the lock manager on another host sees it (rule 3).
 */
#include <linux/slab.h>
#include <asm/special_insns.h>

#include "cxlkv_internal.h"

/* rule 1: a line with several writers is written with non-temporal stores */
static inline void nt_store64(void *p, u64 v)
{
	asm volatile("movnti %1, %0" : "=m" (*(u64 *)p) : "r" (v) : "memory");
}

struct ctrl_view {
	struct cxlkv_carve carve;
	struct cxlkv_ctrl_header h;
};

/* Find and check the control carve; callers hold dev->lock. */
static int ctrl_locate(struct cxlkv_dev *d, const struct cxlkv_superblock *sb,
		       struct ctrl_view *v)
{
	u64 nslots, end;
	void *p;
	int i;

	i = cxlkv_sb_find(sb, CXLKV_CARVE_CONTROL);
	if (i < 0) {
		cxlkv_diag(d, "pool has no control carve");
		return -ENOENT;
	}
	v->carve = sb->carves[i];
	p = cxlkv_map(d, v->carve.offset, sizeof(v->h), v->carve.memtype);
	if (!p)
		return -ENOMEM;
	/* rule 4: the header may have been written by another host */
	clflush(p);
	mb();
	memcpy(&v->h, p, sizeof(v->h));
	cxlkv_unmap(d, p, v->carve.memtype);

	if (v->h.magic != CXLKV_CTRL_MAGIC || v->h.version != CXLKV_CTRL_VERSION ||
	    v->h.checksum != cxlkv_ctrl_header_checksum(&v->h) ||
	    v->h.max_nodes != sb->max_nodes || !v->h.max_locks ||
	    v->h.max_locks > CXLKV_MAX_LOCKS || v->h.lock_table_off % CXLKV_LINE_SIZE ||
	    v->h.grant_table_off % CXLKV_LINE_SIZE)
		goto bad;
	nslots = (u64)v->h.max_locks * v->h.max_nodes;
	end = v->h.lock_table_off + nslots * sizeof(struct cxlkv_lock_slot);
	if (v->h.lock_table_off >= v->carve.size || end > v->carve.size)
		goto bad;
	end = v->h.grant_table_off + (u64)v->h.max_locks * sizeof(struct cxlkv_lock_grant);
	if (v->h.grant_table_off >= v->carve.size || end > v->carve.size)
		goto bad;
	if (cxlkv_node_id >= v->h.max_nodes) {
		cxlkv_diag(d, "node_id %u is not below the pool's max_nodes %u",
			   cxlkv_node_id, v->h.max_nodes);
		return -EINVAL;
	}
	return 0;
bad:
	cxlkv_diag(d, "control carve header is damaged or not initialized");
	return -EUCLEAN;
}

static int ctrl_get(struct cxlkv_dev *d, struct ctrl_view *v)
{
	struct cxlkv_superblock *sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	int ret;

	if (!sb)
		return -ENOMEM;
	ret = cxlkv_sb_read(d, sb);
	if (!ret)
		ret = ctrl_locate(d, sb, v);
	kfree(sb);
	return ret;
}

int cxlkv_ctrl_limits(struct cxlkv_dev *d, const struct cxlkv_superblock *sb, u32 *max_locks)
{
	struct ctrl_view v;
	int ret = ctrl_locate(d, sb, &v);

	*max_locks = ret ? 0 : v.h.max_locks;
	return ret;
}

static u64 slot_off(const struct ctrl_view *v, u32 lock_id)
{
	return v->carve.offset + cxlkv_lock_slot_off(&v->h, lock_id, cxlkv_node_id);
}

/*
 * Read this node's slot of lock_id; if `release`, set it idle keeping its
 * ticket; record owner_pid.  Returns the request word read.
 */
static int slot_update(struct cxlkv_dev *d, const struct ctrl_view *v, u32 lock_id,
		       bool write, bool release, u32 pid, u64 *request)
{
	void *p = cxlkv_map(d, slot_off(v, lock_id), sizeof(struct cxlkv_lock_slot),
			    v->carve.memtype);
	u64 req;

	if (!p)
		return -ENOMEM;
	/* rule 4: invalidate before reading what the runtime stored with movnti */
	clflush(p);
	mb();
	req = READ_ONCE(*(u64 *)p);
	if (write) {
		if (release)
			nt_store64(p, (req & ~CXLKV_SLOT_STATE_MASK) | CXLKV_SLOT_IDLE);
		/* owner_pid and the zero reserved0 beside it, as one 8-byte store */
		nt_store64(p + 8, pid);
		/* rule 3: the release reaches memory before we report it done */
		clflush(p);
		mb();
	}
	cxlkv_unmap(d, p, v->carve.memtype);
	if (request)
		*request = req;
	return 0;
}

int cxlkv_lock_alloc(struct cxlkv_file *cf, struct cxlkv_ioc_lock *a)
{
	struct cxlkv_dev *d = cf->dev;
	struct ctrl_view v;
	u32 id = a->lock_id;
	bool again = false;
	int ret;

	/* Reserved ids are the runtime's own layers' (uapi/cxlkv_ctrl.h). */
	if (id != CXLKV_LOCK_ANY && id < CXLKV_LOCK_FIRST_USER &&
	    !(a->flags & CXLKV_LOCK_F_RUNTIME)) {
		cxlkv_diag(d, "lock id %u is reserved for the cxlkv runtime (ids below %u)", id,
			   CXLKV_LOCK_FIRST_USER);
		return -EPERM;
	}
	mutex_lock(&d->lock);
	ret = ctrl_get(d, &v);
	if (ret)
		goto out;
	if (id != CXLKV_LOCK_ANY && id < v.h.max_locks && xa_load(&d->locks, id) == cf) {
		/* owned by this file already: owning again is not an error */
		again = true;
	} else if (id != CXLKV_LOCK_ANY && id >= v.h.max_locks) {
		cxlkv_diag(d, "lock id %u is not below max_locks %u", id, v.h.max_locks);
		ret = -EINVAL;
	} else if (cxlkv_max_slots_per_file && cf->nslots >= cxlkv_max_slots_per_file) {
		cxlkv_diag(d, "this file already owns %u lock slots (max_slots_per_file)", cf->nslots);
		ret = -EDQUOT;
	} else if (id == CXLKV_LOCK_ANY) {
		if (v.h.max_locks <= CXLKV_LOCK_FIRST_USER)
			ret = -EBUSY;
		else
			ret = xa_alloc(&d->locks, &id, cf,
				       XA_LIMIT(CXLKV_LOCK_FIRST_USER, v.h.max_locks - 1), GFP_KERNEL);
		if (ret == -EBUSY)
			cxlkv_diag(d, "all lock slots %u..%u of this node are owned",
				   CXLKV_LOCK_FIRST_USER, v.h.max_locks - 1);
	} else {
		ret = xa_insert(&d->locks, id, cf, GFP_KERNEL);
	}
	if (ret)
		goto out;
	ret = slot_update(d, &v, id, true, false, cf->tgid, NULL);
	if (ret) {
		if (!again)
			xa_erase(&d->locks, id);
		goto out;
	}
	if (!again) {
		d->nlocks++;
		cf->nslots++;
	}
	a->lock_id = id;
	a->node = cxlkv_node_id;
	a->slot_off = slot_off(&v, id);
	a->grant_off = v.carve.offset + v.h.grant_table_off +
		       (u64)id * sizeof(struct cxlkv_lock_grant);
out:
	mutex_unlock(&d->lock);
	return ret;
}

/* Drop ownership of one slot of `cf` (dev->lock held); the slot is set idle. */
static void release_one(struct cxlkv_dev *d, struct cxlkv_file *cf, const struct ctrl_view *v, u32 id)
{
	if (v)
		slot_update(d, v, id, true, true, 0, NULL);
	xa_erase(&d->locks, id);
	d->nlocks--;
	cf->nslots--;
}

int cxlkv_lock_free(struct cxlkv_file *cf, struct cxlkv_ioc_lock *a)
{
	struct cxlkv_dev *d = cf->dev;
	struct ctrl_view v;
	void *owner;
	int ret;

	mutex_lock(&d->lock);
	owner = xa_load(&d->locks, a->lock_id);
	ret = owner ? -EPERM : -ENOENT;
	if (owner != cf)
		goto out;
	ret = ctrl_get(d, &v);
	release_one(d, cf, ret ? NULL : &v, a->lock_id);
	a->node = cxlkv_node_id;
out:
	mutex_unlock(&d->lock);
	return ret;
}

void cxlkv_lock_release_all(struct cxlkv_file *cf)
{
	struct cxlkv_dev *d = cf->dev;
	struct ctrl_view v;
	unsigned long id;
	void *owner;
	bool have_ctrl;

	mutex_lock(&d->lock);
	if (!d->nlocks)
		goto out;
	have_ctrl = !ctrl_get(d, &v);
	xa_for_each(&d->locks, id, owner) {
		if (owner != cf)
			continue;
		if (!have_ctrl || id >= v.h.max_locks)
			pr_warn_ratelimited("%s: lock slot %lu of pid %d dropped without setting it idle: control carve unreadable\n",
					    d->name, id, cf->tgid);
		release_one(d, cf, have_ctrl && id < v.h.max_locks ? &v : NULL, id);
	}
out:
	mutex_unlock(&d->lock);
}

int cxlkv_lock_list(struct cxlkv_file *cf, struct cxlkv_ioc_lock_list *l)
{
	struct cxlkv_dev *d = cf->dev;
	struct ctrl_view v;
	unsigned long id;
	void *owner;
	bool have_ctrl;

	l->count = 0;
	l->next = CXLKV_LOCK_ANY;
	mutex_lock(&d->lock);
	l->total = d->nlocks;
	have_ctrl = d->nlocks && !ctrl_get(d, &v);
	xa_for_each_start(&d->locks, id, owner, l->start) {
		struct cxlkv_ioc_lock_entry *e;

		if (l->count == CXLKV_LOCK_LIST_MAX) {
			l->next = id;
			break;
		}
		e = &l->entries[l->count++];
		e->lock_id = id;
		e->owner_pid = ((struct cxlkv_file *)owner)->tgid;
		e->mine = owner == cf;
		if (have_ctrl && id < v.h.max_locks)
			slot_update(d, &v, id, false, false, 0, &e->request);
	}
	mutex_unlock(&d->lock);
	return 0;
}
