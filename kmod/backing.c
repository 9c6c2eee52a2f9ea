// SPDX-License-Identifier: GPL-2.0
/*
 * The three kinds of backing behind /dev/cxlkvN:
 *   phys      a physical range named by module parameters, e.g. memory
 *             held back from the kernel with memmap=nn$ss or a CXL /
 *             soft-reserved range, claimed with request_mem_region();
 *   ivshmem   BAR2 of the ivshmem PCI device (1af4:1110), memory shared
 *             between virtual machines: the multi-host test rig;
 *   emulated  RAM allocated by this module, for tests only.
 */
#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/vmalloc.h>

#include "cxlkv_internal.h"

static unsigned long range_base;
module_param_named(phys_base, range_base, ulong, 0444);
MODULE_PARM_DESC(phys_base, "physical start of a reserved range to expose (memmap=nn$ss, CXL/soft-reserved)");

static unsigned long range_size;
module_param_named(phys_size, range_size, ulong, 0444);
MODULE_PARM_DESC(phys_size, "bytes of that range (multiple of 2 MiB); 0 = none");

static unsigned long emulated_size;
module_param(emulated_size, ulong, 0444);
MODULE_PARM_DESC(emulated_size, "bytes of an emulated range in module-allocated RAM (tests only); 0 = none");

static bool ivshmem = true;
module_param(ivshmem, bool, 0444);
MODULE_PARM_DESC(ivshmem, "drive ivshmem PCI devices (1af4:1110) and expose their BAR2");

static struct cxlkv_dev *phys_dev;
static struct cxlkv_dev *emulated_dev;

/*
 * Kernel access to [off, off+len) of the pool with the memory type that
 * user mappings of the same bytes have, so that PAT never sees two
 * conflicting types for one physical page.  Emulated backings are RAM that
 * is always mapped write-back.
 */
void *cxlkv_map(struct cxlkv_dev *d, u64 off, size_t len, u32 memtype)
{
	phys_addr_t pa;

	if (off > d->size || len > d->size - off)
		return NULL;
	if (d->kind == CXLKV_BACKING_EMULATED)
		return d->vbase + off;
	pa = d->phys + off;
	switch (memtype) {
	case CXLKV_MEM_WB:
		return memremap(pa, len, MEMREMAP_WB);
	case CXLKV_MEM_WC:
		return memremap(pa, len, MEMREMAP_WC);
	case CXLKV_MEM_UC:
		/* UC- like pgprot_noncached() of the user mappings */
		return (void __force *)ioremap(pa, len);
	}
	return NULL;
}

void cxlkv_unmap(struct cxlkv_dev *d, void *p, u32 memtype)
{
	if (!p || d->kind == CXLKV_BACKING_EMULATED)
		return;
	if (memtype == CXLKV_MEM_UC)
		iounmap((void __iomem __force *)p);
	else
		memunmap(p);
}

/* ---- phys ------------------------------------------------------------- */

int cxlkv_phys_init(void)
{
	struct cxlkv_dev *d;
	int ret;

	if (!range_size && !range_base)
		return 0;
	if (!range_size || !IS_ALIGNED(range_base, CXLKV_CARVE_ALIGN) ||
	    !IS_ALIGNED(range_size, CXLKV_CARVE_ALIGN) || range_size < CXLKV_MIN_POOL_SIZE ||
	    range_base + range_size < range_base) {
		pr_err("cxlkv: phys_base %#lx / phys_size %#lx: both must be 2 MiB aligned, size >= 4 MiB\n",
		       range_base, range_size);
		return -EINVAL;
	}
	/* Memory the kernel allocates from must never be handed to users. */
	if (region_intersects(range_base, range_size, IORESOURCE_SYSTEM_RAM,
			      IORES_DESC_NONE) != REGION_DISJOINT) {
		pr_err("cxlkv: [%#lx, %#lx) overlaps System RAM; reserve it first (memmap=nn$ss or a soft-reserved range)\n",
		       range_base, range_base + range_size);
		return -EINVAL;
	}
	d = cxlkv_dev_alloc(CXLKV_BACKING_PHYS);
	if (!d)
		return -ENOMEM;
	if (!request_mem_region(range_base, range_size, "cxlkv")) {
		pr_err("cxlkv: [%#lx, %#lx) is claimed by another driver (see /proc/iomem)\n",
		       range_base, range_base + range_size);
		cxlkv_dev_free(d);
		return -EBUSY;
	}
	d->region_claimed = true;
	d->phys = range_base;
	d->size = range_size;
	strscpy(d->backing_name, "phys", sizeof(d->backing_name));
	ret = cxlkv_dev_register(d);
	if (ret) {
		release_mem_region(range_base, range_size);
		cxlkv_dev_free(d);
		return ret;
	}
	phys_dev = d;
	return 0;
}

void cxlkv_phys_exit(void)
{
	if (!phys_dev)
		return;
	cxlkv_dev_unregister(phys_dev);
	release_mem_region(phys_dev->phys, phys_dev->size);
	cxlkv_dev_free(phys_dev);
	phys_dev = NULL;
}

/* ---- emulated (test only) -------------------------------------------- */

int cxlkv_emulated_init(void)
{
	struct cxlkv_dev *d;
	int ret;

	if (!emulated_size)
		return 0;
	if (!IS_ALIGNED(emulated_size, CXLKV_CARVE_ALIGN) || emulated_size < CXLKV_MIN_POOL_SIZE) {
		pr_err("cxlkv: emulated_size %#lx must be a multiple of 2 MiB, at least 4 MiB\n",
		       emulated_size);
		return -EINVAL;
	}
	d = cxlkv_dev_alloc(CXLKV_BACKING_EMULATED);
	if (!d)
		return -ENOMEM;
	/* zeroed and suitable for remap_vmalloc_range() */
	d->vbase = vmalloc_user(emulated_size);
	if (!d->vbase) {
		cxlkv_dev_free(d);
		return -ENOMEM;
	}
	d->size = emulated_size;
	strscpy(d->backing_name, "emulated (test only)", sizeof(d->backing_name));
	ret = cxlkv_dev_register(d);
	if (ret) {
		vfree(d->vbase);
		cxlkv_dev_free(d);
		return ret;
	}
	emulated_dev = d;
	return 0;
}

void cxlkv_emulated_exit(void)
{
	if (!emulated_dev)
		return;
	cxlkv_dev_unregister(emulated_dev);
	vfree(emulated_dev->vbase);
	cxlkv_dev_free(emulated_dev);
	emulated_dev = NULL;
}

/* ---- ivshmem ------------------------------------------------------------ */

#define IVSHMEM_BAR 2

static int cxlkv_ivshmem_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct cxlkv_dev *d;
	int ret;

	if (!(pci_resource_flags(pdev, IVSHMEM_BAR) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, IVSHMEM_BAR) < CXLKV_MIN_POOL_SIZE) {
		dev_err(&pdev->dev, "cxlkv: BAR2 is not a memory BAR of at least 4 MiB\n");
		return -ENODEV;
	}
	ret = pci_enable_device_mem(pdev);
	if (ret)
		return ret;
	ret = pci_request_region(pdev, IVSHMEM_BAR, "cxlkv");
	if (ret)
		goto err_disable;
	d = cxlkv_dev_alloc(CXLKV_BACKING_IVSHMEM);
	if (!d) {
		ret = -ENOMEM;
		goto err_release;
	}
	d->pdev = pdev;
	d->phys = pci_resource_start(pdev, IVSHMEM_BAR);
	d->size = round_down(pci_resource_len(pdev, IVSHMEM_BAR), CXLKV_CARVE_ALIGN);
	snprintf(d->backing_name, sizeof(d->backing_name), "ivshmem %s", pci_name(pdev));
	ret = cxlkv_dev_register(d);
	if (ret)
		goto err_free;
	pci_set_drvdata(pdev, d);
	return 0;

err_free:
	cxlkv_dev_free(d);
err_release:
	pci_release_region(pdev, IVSHMEM_BAR);
err_disable:
	pci_disable_device(pdev);
	return ret;
}

static void cxlkv_ivshmem_remove(struct pci_dev *pdev)
{
	struct cxlkv_dev *d = pci_get_drvdata(pdev);

	cxlkv_dev_unregister(d);
	cxlkv_dev_free(d);
	pci_release_region(pdev, IVSHMEM_BAR);
	pci_disable_device(pdev);
}

static const struct pci_device_id cxlkv_ivshmem_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },
	{ }
};
MODULE_DEVICE_TABLE(pci, cxlkv_ivshmem_ids);

static struct pci_driver cxlkv_ivshmem_driver = {
	.name = "cxlkv_ivshmem",
	.id_table = cxlkv_ivshmem_ids,
	.probe = cxlkv_ivshmem_probe,
	.remove = cxlkv_ivshmem_remove,
	/*
	 * Open files and mappings refer to the device; unbinding through
	 * sysfs while they exist would free it under them.  Removal happens
	 * at module unload, which open files prevent.
	 */
	.driver.suppress_bind_attrs = true,
};

static bool ivshmem_registered;

int cxlkv_ivshmem_init(void)
{
	int ret;

	if (!ivshmem)
		return 0;
	ret = pci_register_driver(&cxlkv_ivshmem_driver);
	if (!ret)
		ivshmem_registered = true;
	return ret;
}

void cxlkv_ivshmem_exit(void)
{
	if (ivshmem_registered)
		pci_unregister_driver(&cxlkv_ivshmem_driver);
	ivshmem_registered = false;
}
