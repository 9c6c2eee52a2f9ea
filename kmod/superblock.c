// SPDX-License-Identifier: GPL-2.0
/*
 * The pool superblock and its carve table, as laid out in uapi/cxlkv_pool.h and
 * shared with the userspace runtime on every host.  The superblock is read
 * after invalidating its lines and written, checksummed, then flushed
 * (coherence contract rules 3 and 4).  Callers hold dev->lock; hosts do not
 * serialize carve changes among themselves (one operator at a time, as for
 * `cxlkvctl carve`).
 */
#include <linux/random.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/timekeeping.h>
#include <asm/cacheflush.h>

#include "cxlkv_internal.h"

int cxlkv_name_valid(const char *name)
{
	size_t n = strnlen(name, CXLKV_CARVE_NAME_MAX);
	size_t i;

	if (n == 0 || n >= CXLKV_CARVE_NAME_MAX)
		return 0;
	for (i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return 0;
	}
	/* Bytes after the NUL are zero, so every host stores the same name. */
	for (; i < CXLKV_CARVE_NAME_MAX; i++)
		if (name[i])
			return 0;
	return 1;
}

/* Same rules as the runtime's validate_superblock(); reason for the log. */
static const char *sb_problem(const struct cxlkv_superblock *sb, u64 backing_size)
{
	u64 prev_end = CXLKV_FIRST_CARVE_OFF;
	u32 i;

	if (sb->magic != CXLKV_SB_MAGIC)
		return "no superblock (not formatted)";
	if (sb->layout_version != CXLKV_LAYOUT_VERSION)
		return "unsupported layout version";
	if (sb->sb_size != CXLKV_SB_SIZE)
		return "bad superblock size";
	if (sb->checksum != cxlkv_sb_checksum(sb))
		return "checksum mismatch";
	if (!sb->pool_size || sb->pool_size > backing_size ||
	    sb->pool_size % CXLKV_CARVE_ALIGN || sb->pool_size < CXLKV_MIN_POOL_SIZE)
		return "pool size does not fit the backing";
	if (sb->max_nodes < 1 || sb->max_nodes > CXLKV_MAX_NODES)
		return "bad max_nodes";
	if (sb->ncarves > CXLKV_MAX_CARVES)
		return "too many carves";
	for (i = 0; i < sb->ncarves; i++) {
		const struct cxlkv_carve *c = &sb->carves[i];

		if (!cxlkv_name_valid(c->name))
			return "bad carve name";
		if (c->offset % CXLKV_CARVE_ALIGN || !c->size || c->size % CXLKV_CARVE_ALIGN)
			return "carve not 2 MiB aligned";
		if (c->offset < prev_end || c->offset > sb->pool_size ||
		    c->size > sb->pool_size - c->offset)
			return "carves overlap, are unsorted or leave the pool";
		if (c->memtype > CXLKV_MEM_MAX || (c->flags & ~CXLKV_CARVE_F_ALL))
			return "bad carve memtype or flags";
		prev_end = c->offset + c->size;
	}
	return NULL;
}

int cxlkv_sb_read_quiet(struct cxlkv_dev *d, struct cxlkv_superblock *sb, bool quiet)
{
	const char *why;
	void *p;

	p = cxlkv_map(d, 0, CXLKV_SB_SIZE, CXLKV_MEM_WB);
	if (!p)
		return -ENOMEM;
	/* rule 4: drop stale lines before reading what another host wrote */
	clflush_cache_range(p, CXLKV_SB_SIZE);
	memcpy(sb, p, CXLKV_SB_SIZE);
	cxlkv_unmap(d, p, CXLKV_MEM_WB);

	why = sb_problem(sb, d->size);
	if (!why)
		return 0;
	if (!quiet)
		cxlkv_diag(d, "superblock of %s: %s", d->backing_name, why);
	return sb->magic == CXLKV_SB_MAGIC ? -EUCLEAN : -ENODATA;
}

int cxlkv_sb_read(struct cxlkv_dev *d, struct cxlkv_superblock *sb)
{
	return cxlkv_sb_read_quiet(d, sb, false);
}

int cxlkv_sb_write(struct cxlkv_dev *d, struct cxlkv_superblock *sb)
{
	void *p;

	sb->generation++;
	sb->checksum = cxlkv_sb_checksum(sb);
	p = cxlkv_map(d, 0, CXLKV_SB_SIZE, CXLKV_MEM_WB);
	if (!p)
		return -ENOMEM;
	memcpy(p, sb, CXLKV_SB_SIZE);
	/* rule 3: the update is visible to other hosts only once flushed */
	clflush_cache_range(p, CXLKV_SB_SIZE);
	cxlkv_unmap(d, p, CXLKV_MEM_WB);
	return 0;
}

int cxlkv_sb_find(const struct cxlkv_superblock *sb, const char *name)
{
	u32 i;

	for (i = 0; i < sb->ncarves; i++)
		if (!strncmp(sb->carves[i].name, name, CXLKV_CARVE_NAME_MAX))
			return i;
	return -1;
}

/* First fit after the superblock; returns the offset or 0 if none. */
static u64 first_fit(const struct cxlkv_superblock *sb, u64 size, u32 *slot)
{
	u64 start = CXLKV_FIRST_CARVE_OFF;
	u32 i;

	for (i = 0; i < sb->ncarves; i++) {
		if (sb->carves[i].offset >= start && sb->carves[i].offset - start >= size) {
			*slot = i;
			return start;
		}
		start = sb->carves[i].offset + sb->carves[i].size;
	}
	if (start <= sb->pool_size && sb->pool_size - start >= size) {
		*slot = sb->ncarves;
		return start;
	}
	return 0;
}

/* c: name, size, memtype, flags validated by the caller; offset, size out. */
int cxlkv_carve_create(struct cxlkv_dev *d, struct cxlkv_carve *c)
{
	struct cxlkv_superblock *sb;
	u64 size, off;
	u32 slot = 0;
	int ret;

	if (c->size > U64_MAX - CXLKV_CARVE_ALIGN)
		return -EINVAL;
	size = round_up(c->size, CXLKV_CARVE_ALIGN);
	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	ret = cxlkv_sb_read(d, sb);
	if (ret)
		goto out;
	ret = -EEXIST;
	if (cxlkv_sb_find(sb, c->name) >= 0)
		goto out;
	ret = -ENOSPC;
	if (sb->ncarves >= CXLKV_MAX_CARVES)
		goto out;
	off = first_fit(sb, size, &slot);
	if (!off)
		goto out;
	memmove(&sb->carves[slot + 1], &sb->carves[slot],
		(sb->ncarves - slot) * sizeof(sb->carves[0]));
	c->offset = off;
	c->size = size;
	c->reserved = 0;
	sb->carves[slot] = *c;
	sb->ncarves++;
	ret = cxlkv_sb_write(d, sb);
out:
	kfree(sb);
	return ret;
}

int cxlkv_carve_remove(struct cxlkv_dev *d, const char *name, u32 flags)
{
	struct cxlkv_superblock *sb;
	int ret, i;

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	ret = cxlkv_sb_read(d, sb);
	if (ret)
		goto out;
	i = cxlkv_sb_find(sb, name);
	ret = -ENOENT;
	if (i < 0)
		goto out;
	ret = -EPERM;
	if ((sb->carves[i].flags & CXLKV_CARVE_F_SYSTEM) && !(flags & CXLKV_CARVE_RM_FORCE))
		goto out;
	ret = -EBUSY;
	if (cxlkv_mappings_of(d, sb->carves[i].offset))
		goto out;
	memmove(&sb->carves[i], &sb->carves[i + 1],
		(sb->ncarves - i - 1) * sizeof(sb->carves[0]));
	sb->ncarves--;
	memset(&sb->carves[sb->ncarves], 0, sizeof(sb->carves[0]));
	ret = cxlkv_sb_write(d, sb);
out:
	kfree(sb);
	return ret;
}

/*
 * The new type applies to mappings made from now on.  A carve mapped on
 * this host keeps its type until unmapped: two types for one page would
 * break PAT's rule of one memory type per physical page.
 */
int cxlkv_memtype_set(struct cxlkv_dev *d, const char *name, u32 memtype)
{
	struct cxlkv_superblock *sb;
	int ret, i;

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	ret = cxlkv_sb_read(d, sb);
	if (ret)
		goto out;
	i = cxlkv_sb_find(sb, name);
	ret = -ENOENT;
	if (i < 0)
		goto out;
	ret = 0;
	if (sb->carves[i].memtype == memtype)
		goto out;
	ret = -EBUSY;
	if (cxlkv_mappings_of(d, sb->carves[i].offset))
		goto out;
	sb->carves[i].memtype = memtype;
	ret = cxlkv_sb_write(d, sb);
out:
	kfree(sb);
	return ret;
}

/* A fresh superblock image (no carves), continuing the old generation. */
static void sb_init(struct cxlkv_dev *d, struct cxlkv_superblock *sb, u32 max_nodes, u64 old_gen)
{
	memset(sb, 0, sizeof(*sb));
	sb->magic = CXLKV_SB_MAGIC;
	sb->layout_version = CXLKV_LAYOUT_VERSION;
	sb->sb_size = CXLKV_SB_SIZE;
	sb->pool_size = round_down(d->size, CXLKV_CARVE_ALIGN);
	sb->max_nodes = max_nodes;
	get_random_bytes(sb->pool_id, sizeof(sb->pool_id));
	sb->format_time_ns = ktime_get_real_ns();
	/* keep counting across formats so that a cached copy never looks current */
	sb->generation = old_gen;
}

/*
 * CXLKV_IOC_FORMAT: a superblock without carves, as Region::format writes;
 * the runtime then creates the standard carves through the carve ioctls.
 * Refused while anything on this host uses the pool.
 */
int cxlkv_format_empty(struct cxlkv_dev *d, u32 max_nodes, bool force)
{
	struct cxlkv_superblock *sb;
	u64 gen = 0;
	int ret;

	if (d->nlocks || !list_empty(&d->maps))
		return -EBUSY;
	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	ret = cxlkv_sb_read_quiet(d, sb, true);
	if (!ret && !force) {
		ret = -EEXIST;
		goto out;
	}
	if (sb->magic == CXLKV_SB_MAGIC)
		gen = sb->generation;
	sb_init(d, sb, max_nodes, gen);
	ret = cxlkv_sb_write(d, sb);
out:
	kfree(sb);
	return ret;
}

/*
 * format=1: a fresh superblock with one carve, the control carve, laid out
 * as uapi/cxlkv_ctrl.h and the runtime's plan_control() do.  The carve is
 * written and flushed before the superblock that makes it visible (rule 3).
 */
int cxlkv_format(struct cxlkv_dev *d, u32 max_nodes, u32 max_locks)
{
	struct cxlkv_superblock *sb;
	struct cxlkv_ctrl_header h = {};
	struct cxlkv_lock_grant *g;
	u64 ctrl_bytes, ctrl_size, pool_size;
	void *p;
	u32 i;
	int ret;

	pool_size = round_down(d->size, CXLKV_CARVE_ALIGN);
	h.magic = CXLKV_CTRL_MAGIC;
	h.version = CXLKV_CTRL_VERSION;
	h.max_nodes = max_nodes;
	h.max_locks = max_locks;
	h.lease_off = sizeof(struct cxlkv_ctrl_header);
	h.node_table_off = h.lease_off + sizeof(struct cxlkv_lease);
	h.lock_table_off = h.node_table_off + (u64)max_nodes * sizeof(struct cxlkv_node_entry);
	h.grant_table_off = h.lock_table_off +
			    (u64)max_locks * max_nodes * sizeof(struct cxlkv_lock_slot);
	h.doorbell_off = h.grant_table_off + (u64)max_locks * sizeof(struct cxlkv_lock_grant);
	ctrl_bytes = h.doorbell_off + (u64)max_nodes * sizeof(struct cxlkv_doorbell);
	h.checksum = cxlkv_ctrl_header_checksum(&h);	/* checked at open */
	if (WARN_ON_ONCE(ctrl_bytes != cxlkv_ctrl_carve_bytes(max_nodes, max_locks)))
		return -EINVAL;
	ctrl_size = round_up(ctrl_bytes, CXLKV_CARVE_ALIGN);
	if (CXLKV_FIRST_CARVE_OFF + ctrl_size > pool_size) {
		pr_err("%s: %llu bytes are too small for a %llu byte control carve\n",
		       d->name, pool_size, ctrl_size);
		return -ENOSPC;
	}

	p = cxlkv_map(d, CXLKV_FIRST_CARVE_OFF, ctrl_size, CXLKV_MEM_WB);
	if (!p)
		return -ENOMEM;
	memset(p, 0, ctrl_size);
	memcpy(p, &h, sizeof(h));
	g = p + h.grant_table_off;
	for (i = 0; i < max_locks; i++)
		g[i].node = CXLKV_GRANT_NONE;
	/* rule 3: control carve contents reach memory before the superblock names it */
	clflush_cache_range(p, ctrl_size);
	cxlkv_unmap(d, p, CXLKV_MEM_WB);

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		return -ENOMEM;
	sb_init(d, sb, max_nodes, 0);
	sb->ncarves = 1;
	strscpy(sb->carves[0].name, CXLKV_CARVE_CONTROL, CXLKV_CARVE_NAME_MAX);
	sb->carves[0].offset = CXLKV_FIRST_CARVE_OFF;
	sb->carves[0].size = ctrl_size;
	sb->carves[0].memtype = CXLKV_MEM_WB;
	sb->carves[0].flags = CXLKV_CARVE_F_SYSTEM;
	ret = cxlkv_sb_write(d, sb);
	kfree(sb);
	return ret;
}
