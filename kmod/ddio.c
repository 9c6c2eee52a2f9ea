// SPDX-License-Identifier: GPL-2.0
/*
 * DDIO control.  Intel Data Direct I/O lets inbound PCIe writes allocate
 * lines in the last-level cache.  For GPU-to-pool copies that only pollutes
 * the cache and, on a non-coherent pool, leaves dirty lines behind, so
 * Beluga turns it off on the root port above the GPU.  The knob is bit 7
 * (Use_Allocating_Flow_Wr) of perfctrlsts_0 at config offset 0x180 of Intel
 * IIO root ports.  Other ports may have anything at 0x180, so they are
 * refused unless the caller forces it; every write is read back, and the
 * values found are restored when the module is unloaded.
 */
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>

#include "cxlkv_internal.h"

/* Intel IIO PCIe root ports known to implement perfctrlsts_0. */
static const u16 iio_root_ports[] = {
	0x2030, 0x2031, 0x2032, 0x2033,		/* Skylake-SP / Cascade Lake */
	0x347a, 0x347b, 0x347c, 0x347d,		/* Ice Lake-SP */
	0x352a, 0x352b, 0x352c, 0x352d,		/* Sapphire Rapids */
};

struct ddio_saved {
	struct list_head node;
	struct pci_dev *port;			/* reference held */
	u32 orig;
};

static LIST_HEAD(ddio_saved_list);
static DEFINE_MUTEX(ddio_lock);

static bool port_known(struct pci_dev *port)
{
	size_t i;

	if (port->vendor != PCI_VENDOR_ID_INTEL)
		return false;
	for (i = 0; i < ARRAY_SIZE(iio_root_ports); i++)
		if (port->device == iio_root_ports[i])
			return true;
	return false;
}

/* The root port above the device named in `a`, with a reference. */
static struct pci_dev *find_port(struct cxlkv_dev *d, struct cxlkv_ioc_ddio *a)
{
	struct pci_dev *pdev, *port;

	pdev = pci_get_domain_bus_and_slot(a->domain, a->bus, a->devfn);
	if (!pdev) {
		cxlkv_diag(d, "ddio: no PCI device %04x:%02x:%02x.%d", a->domain, a->bus,
			   PCI_SLOT(a->devfn), PCI_FUNC(a->devfn));
		return ERR_PTR(-ENODEV);
	}
	port = pcie_find_root_port(pdev);
	if (!port) {
		cxlkv_diag(d, "ddio: no PCIe root port above %s", pci_name(pdev));
		pci_dev_put(pdev);
		return ERR_PTR(-ENODEV);
	}
	pci_dev_get(port);
	pci_dev_put(pdev);
	a->port_domain = pci_domain_nr(port->bus);
	a->port_bus = port->bus->number;
	a->port_devfn = port->devfn;
	a->port_vendor = port->vendor;
	a->port_device = port->device;
	a->known = port_known(port);
	if (port->cfg_size < CXLKV_DDIO_PERFCTRLSTS + 4) {
		cxlkv_diag(d, "ddio: root port %s has no extended config space", pci_name(port));
		pci_dev_put(port);
		return ERR_PTR(-EOPNOTSUPP);
	}
	return port;
}

static int read_ctl(struct pci_dev *port, u32 *v)
{
	return pcibios_err_to_errno(pci_read_config_dword(port, CXLKV_DDIO_PERFCTRLSTS, v));
}

/* Reports the port and its raw register; `enable` is meaningful only if known. */
int cxlkv_ddio_get(struct cxlkv_dev *d, struct cxlkv_ioc_ddio *a)
{
	struct pci_dev *port = find_port(d, a);
	int ret;

	if (IS_ERR(port))
		return PTR_ERR(port);
	ret = read_ctl(port, &a->perfctrlsts);
	a->enable = !!(a->perfctrlsts & CXLKV_DDIO_ALLOC_FLOW);
	pci_dev_put(port);
	return ret;
}

static int remember_original(struct pci_dev *port, u32 orig)
{
	struct ddio_saved *s;

	list_for_each_entry(s, &ddio_saved_list, node)
		if (s->port == port)
			return 0;
	s = kzalloc(sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	s->port = pci_dev_get(port);
	s->orig = orig;
	list_add(&s->node, &ddio_saved_list);
	return 0;
}

int cxlkv_ddio_set(struct cxlkv_dev *d, struct cxlkv_ioc_ddio *a)
{
	struct pci_dev *port = find_port(d, a);
	u32 orig, want, got;
	int ret;

	if (IS_ERR(port))
		return PTR_ERR(port);
	if (!a->known && !(a->flags & CXLKV_DDIO_F_FORCE)) {
		cxlkv_diag(d, "ddio: root port %s (%04x:%04x) is not a known Intel IIO root port; refusing to write config offset 0x180 (force to override)",
			   pci_name(port), port->vendor, port->device);
		ret = -EOPNOTSUPP;
		goto out_put;
	}
	mutex_lock(&ddio_lock);
	ret = read_ctl(port, &orig);
	if (ret)
		goto out;
	ret = remember_original(port, orig);
	if (ret)
		goto out;
	want = a->enable ? orig | CXLKV_DDIO_ALLOC_FLOW : orig & ~CXLKV_DDIO_ALLOC_FLOW;
	ret = pcibios_err_to_errno(pci_write_config_dword(port, CXLKV_DDIO_PERFCTRLSTS, want));
	if (!ret)
		ret = read_ctl(port, &got);
	if (!ret && (got & CXLKV_DDIO_ALLOC_FLOW) != (want & CXLKV_DDIO_ALLOC_FLOW)) {
		cxlkv_diag(d, "ddio: root port %s: Use_Allocating_Flow_Wr did not latch (wrote %#x, read %#x)",
			   pci_name(port), want, got);
		pci_write_config_dword(port, CXLKV_DDIO_PERFCTRLSTS, orig);
		ret = -EIO;
	}
	if (!ret) {
		a->perfctrlsts = got;
		a->enable = !!(got & CXLKV_DDIO_ALLOC_FLOW);
	}
out:
	mutex_unlock(&ddio_lock);
out_put:
	pci_dev_put(port);
	return ret;
}

void cxlkv_ddio_restore_all(void)
{
	struct ddio_saved *s, *t;

	mutex_lock(&ddio_lock);
	list_for_each_entry_safe(s, t, &ddio_saved_list, node) {
		pci_write_config_dword(s->port, CXLKV_DDIO_PERFCTRLSTS, s->orig);
		pr_info("cxlkv: ddio: restored perfctrlsts_0 %#x on root port %s\n",
			s->orig, pci_name(s->port));
		pci_dev_put(s->port);
		list_del(&s->node);
		kfree(s);
	}
	mutex_unlock(&ddio_lock);
}
