/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * ioctl ABI of /dev/cxlkvN (kmod/cxlkv.ko).
 *
 * Handshake: a client calls CXLKV_IOC_GET_VERSION first and refuses to go
 * on unless abi_version == CXLKV_IOCTL_ABI_VERSION; then CXLKV_IOC_INFO
 * tells it the size and kind of the backing.  Every command encodes the
 * size of its argument struct (_IOR/_IOW/_IOWR), so a caller built against
 * a different struct layout gets -ENOTTY instead of a misread buffer.
 * Structs are fixed-width, explicitly padded and end in reserved fields that
 * must be zero on input (the module returns -EINVAL otherwise), so they can
 * grow in a later ABI version without changing size.
 *
 * mmap: the file offset is a pool offset.  A mapping must lie inside one
 * carve (any sub-range of it, page aligned) and gets that carve's memory
 * type; the only other mappable range is the superblock page (offset 0,
 * 4 KiB, read-only, write-back).  Everything else is refused with -EINVAL.
 */
#ifndef _UAPI_CXLKV_IOCTL_H
#define _UAPI_CXLKV_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#include "cxlkv_pool.h"

#define CXLKV_IOCTL_ABI_VERSION 1u
#define CXLKV_IOC_MAGIC         0xC7

/* ---- handshake ---------------------------------------------------------- */

struct cxlkv_ioc_version {
	__u32 abi_version;        /* out: CXLKV_IOCTL_ABI_VERSION */
	__u32 layout_version;     /* out: CXLKV_LAYOUT_VERSION the module writes */
	char  module_version[16]; /* out: e.g. "0.1.0" */
	__u64 reserved[2];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_version) == 40, "ioc_version size");

enum cxlkv_backing_kind {
	CXLKV_BACKING_PHYS     = 1,  /* physical range given by module parameter */
	CXLKV_BACKING_IVSHMEM  = 2,  /* ivshmem PCI device BAR2 */
	CXLKV_BACKING_EMULATED = 3,  /* module-allocated RAM, for tests only */
};

/* MTRR state of the backing range as far as the module can tell. */
enum cxlkv_mtrr_state {
	CXLKV_MTRR_UNAVAILABLE = 0,  /* kernel exports no MTRR lookup */
};

/* cxlkv_ioc_info.flags */
#define CXLKV_INFO_F_FORMATTED  (1u << 0)  /* a valid superblock is present */
#define CXLKV_INFO_F_PAT        (1u << 1)  /* PAT enabled: memory types enforced */

struct cxlkv_ioc_info {
	__u64 size;               /* bytes of the backing (pool size if formatted) */
	__u64 phys_base;          /* physical address, 0 for emulated */
	__u32 backing;            /* enum cxlkv_backing_kind */
	__u32 node_id;            /* module parameter node_id */
	__u32 ncarves;            /* from the superblock, 0 if unformatted */
	__u32 lock_slots_in_use;  /* slots owned by open files on this host */
	__u32 mtrr_state;         /* enum cxlkv_mtrr_state */
	__u32 flags;              /* CXLKV_INFO_F_* */
	__u32 max_nodes;          /* from the superblock, 0 if unformatted */
	__u32 max_locks;          /* from the control carve, 0 if none */
	char  backing_name[32];   /* "phys", "ivshmem 0000:00:03.0", "emulated (test only)" */
	__u64 reserved[4];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_info) == 112, "ioc_info size");

/* ---- format ------------------------------------------------------------- */

/*
 * FORMAT: write a fresh superblock without carves (what Region::format does
 * for file-like pools); the runtime then creates the standard carves with
 * CARVE_CREATE.  Needs CAP_SYS_ADMIN.  -EEXIST if a valid superblock is
 * present and CXLKV_FORMAT_F_FORCE is not given; -EBUSY while carves are
 * mapped or lock slots owned on this host.
 */
#define CXLKV_FORMAT_F_FORCE    (1u << 0)

struct cxlkv_ioc_format {
	__u32 max_nodes;          /* 1 .. CXLKV_MAX_NODES */
	__u32 flags;              /* CXLKV_FORMAT_F_* */
	__u64 reserved[3];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_format) == 32, "ioc_format size");

/* ---- carves -------------------------------------------------------------- */

/*
 * CARVE_CREATE: in name, size (rounded up to 2 MiB), memtype, flags
 * (CXLKV_CARVE_F_*); out offset (first fit after the superblock).
 * CARVE_LOOKUP: in name; out the whole entry.
 * The entry is struct cxlkv_carve from cxlkv_pool.h, the on-pool layout itself.
 */
#define CXLKV_CARVE_RM_FORCE    (1u << 0)  /* remove a CXLKV_CARVE_F_SYSTEM carve */

struct cxlkv_ioc_carve_remove {
	char  name[CXLKV_CARVE_NAME_MAX];
	__u32 flags;              /* CXLKV_CARVE_RM_* */
	__u32 reserved0;
	__u64 reserved[2];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_carve_remove) == 56, "ioc_carve_remove size");

struct cxlkv_ioc_carve_list {
	__u32 count;              /* out: carves in use */
	__u32 reserved0;
	__u64 generation;         /* out: superblock generation read */
	struct cxlkv_carve carves[CXLKV_MAX_CARVES];  /* out: [0, count) sorted by offset */
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_carve_list) == 16 + 64 * CXLKV_MAX_CARVES,
		    "ioc_carve_list size");

/* ---- memory type --------------------------------------------------------- */

struct cxlkv_ioc_memtype {
	char  name[CXLKV_CARVE_NAME_MAX];  /* carve */
	__u32 memtype;            /* in (SET) / out (GET): enum cxlkv_memtype */
	__u32 mappings;           /* out: live user mappings of the carve on this host */
	__u64 reserved[2];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_memtype) == 56, "ioc_memtype size");

/* ---- DDIO ---------------------------------------------------------------- */

#define CXLKV_DDIO_F_FORCE      (1u << 0)  /* act on a root port not known to be an Intel IIO port */

struct cxlkv_ioc_ddio {
	__u32 domain;             /* in: PCI device below the root port */
	__u8  bus;
	__u8  devfn;
	__u16 reserved0;
	__u32 flags;              /* in: CXLKV_DDIO_F_* */
	__u32 enable;             /* in (SET): 1 allocating writes on, 0 off; out: state read back */
	__u32 port_domain;        /* out: the root port found */
	__u8  port_bus;
	__u8  port_devfn;
	__u16 port_vendor;
	__u16 port_device;
	__u16 known;              /* out: 1 if the port is a known Intel IIO root port */
	__u32 perfctrlsts;        /* out: raw perfctrlsts_0 (config offset 0x180) */
	__u64 reserved[2];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_ddio) == 48, "ioc_ddio size");

#define CXLKV_DDIO_PERFCTRLSTS  0x180
#define CXLKV_DDIO_ALLOC_FLOW   (1u << 7)  /* Use_Allocating_Flow_Wr */

/* ---- global lock slots ----------------------------------------------------- */

/*
 * LOCK_ALLOC makes the calling file the owner of this node's slot of a lock
 * (-EBUSY if another file owns it; owning it again from the same file
 * succeeds).  LOCK_FREE, and closing the file (also at process death), set
 * the slot idle keeping its ticket.  Ownership is exclusive per node: own
 * the slot before posting WAITING and free it after the release, so that
 * the next process of this node can own it.
 */
/*
 * Permissions (kmod/README.md): LOCK_ALLOC and LOCK_FREE need the file open
 * for writing (-EBADF).  Ids below CXLKV_LOCK_FIRST_USER (uapi/cxlkv_ctrl.h)
 * belong to the runtime's own layers: ALLOC of one needs
 * CXLKV_LOCK_F_RUNTIME (else -EPERM), and CXLKV_LOCK_ANY never picks one.
 * Each open file owns at most the module parameter max_slots_per_file slots
 * (-EDQUOT beyond).
 */
#define CXLKV_LOCK_ANY          0xffffffffu  /* ALLOC: pick the lowest free id >= CXLKV_LOCK_FIRST_USER */
#define CXLKV_LOCK_F_RUNTIME    (1u << 0)    /* ALLOC: the caller is the cxlkv runtime (reserved ids) */

struct cxlkv_ioc_lock {
	__u32 lock_id;            /* in: id or CXLKV_LOCK_ANY (ALLOC); out: id */
	__u32 node;               /* out: this host's node id */
	__u64 slot_off;           /* out: pool offset of struct cxlkv_lock_slot */
	__u64 grant_off;          /* out: pool offset of the lock's struct cxlkv_lock_grant */
	__u32 flags;              /* in (ALLOC): CXLKV_LOCK_F_*; must be 0 for FREE */
	__u32 reserved0;
	__u64 reserved[1];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_lock) == 40, "ioc_lock size");

struct cxlkv_ioc_lock_entry {
	__u32 lock_id;
	__u32 owner_pid;          /* tgid of the process whose file owns the slot */
	__u64 request;            /* slot request word as read from the pool */
	__u32 mine;               /* 1 if owned by the calling file */
	__u32 reserved0;
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_lock_entry) == 24, "ioc_lock_entry size");

#define CXLKV_LOCK_LIST_MAX     64u

struct cxlkv_ioc_lock_list {
	__u32 start;              /* in: first lock id to report */
	__u32 count;              /* out: entries filled */
	__u32 total;              /* out: slots in use on this host */
	__u32 next;               /* out: start value for the next call, CXLKV_LOCK_ANY at end */
	struct cxlkv_ioc_lock_entry entries[CXLKV_LOCK_LIST_MAX];
};
CXLKV_STATIC_ASSERT(sizeof(struct cxlkv_ioc_lock_list) == 16 + 24 * CXLKV_LOCK_LIST_MAX,
		    "ioc_lock_list size");

/* ---- commands ------------------------------------------------------------ */

#define CXLKV_IOC_GET_VERSION   _IOR(CXLKV_IOC_MAGIC, 0x00, struct cxlkv_ioc_version)
#define CXLKV_IOC_INFO          _IOR(CXLKV_IOC_MAGIC, 0x01, struct cxlkv_ioc_info)
#define CXLKV_IOC_FORMAT        _IOW(CXLKV_IOC_MAGIC, 0x02, struct cxlkv_ioc_format)
#define CXLKV_IOC_CARVE_CREATE  _IOWR(CXLKV_IOC_MAGIC, 0x10, struct cxlkv_carve)
#define CXLKV_IOC_CARVE_LOOKUP  _IOWR(CXLKV_IOC_MAGIC, 0x11, struct cxlkv_carve)
#define CXLKV_IOC_CARVE_LIST    _IOR(CXLKV_IOC_MAGIC, 0x12, struct cxlkv_ioc_carve_list)
#define CXLKV_IOC_CARVE_REMOVE  _IOW(CXLKV_IOC_MAGIC, 0x13, struct cxlkv_ioc_carve_remove)
#define CXLKV_IOC_MEMTYPE_GET   _IOWR(CXLKV_IOC_MAGIC, 0x20, struct cxlkv_ioc_memtype)
#define CXLKV_IOC_MEMTYPE_SET   _IOW(CXLKV_IOC_MAGIC, 0x21, struct cxlkv_ioc_memtype)
#define CXLKV_IOC_DDIO_GET      _IOWR(CXLKV_IOC_MAGIC, 0x30, struct cxlkv_ioc_ddio)
#define CXLKV_IOC_DDIO_SET      _IOWR(CXLKV_IOC_MAGIC, 0x31, struct cxlkv_ioc_ddio)
#define CXLKV_IOC_LOCK_ALLOC    _IOWR(CXLKV_IOC_MAGIC, 0x40, struct cxlkv_ioc_lock)
#define CXLKV_IOC_LOCK_FREE     _IOW(CXLKV_IOC_MAGIC, 0x41, struct cxlkv_ioc_lock)
#define CXLKV_IOC_LOCK_LIST     _IOWR(CXLKV_IOC_MAGIC, 0x42, struct cxlkv_ioc_lock_list)

#endif /* _UAPI_CXLKV_IOCTL_H */
