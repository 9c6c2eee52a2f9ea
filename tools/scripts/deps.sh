#!/bin/sh
# Install the Debian packages cxlkv needs, or print the exact command.
# Called by `make deps` (and so by `make run` / `make test`).
set -eu

PKGS="build-essential cmake pkg-config libspdlog-dev libfmt-dev libgtest-dev libgmock-dev \
liburing-dev libxxhash-dev libb2-dev spin fio \
qemu-system-x86 linux-image-amd64 linux-headers-amd64 busybox-static cpio kmod dkms \
python3 python3-venv python3-numpy python3-torch python3-pytest python3-setuptools python3-pip \
libmicrohttpd-dev python3-prometheus-client librsvg2-bin python3-pil \
help2man go-md2man bash-completion \
debhelper dh-dkms dh-python lintian fakeroot dpkg-dev"
# libb2-dev: BLAKE2b of engine block keys in the library (same keys as hashlib);
# libmicrohttpd-dev: cxlkvd's metrics endpoint (HTTP/1.1 parsing, limits, error replies);
# python3-prometheus-client: the tests parse the exposition with Prometheus' own parser;
# librsvg2-bin, python3-pil: the tests render the SVG pictures to PNG (rsvg-convert)
# and read its pixels.
# help2man, go-md2man: the man pages (packaging/man); bash-completion: the
# completion test; debhelper, dh-dkms, dh-python, lintian, fakeroot,
# dpkg-dev: make deb (debian/) and its test.

if ! command -v dpkg-query >/dev/null 2>&1; then
	echo "cxlkv: dpkg-query not found; the set-up expects Debian 12. Install the equivalents of:" >&2
	echo "  $PKGS" >&2
	exit 1
fi

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0

cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" != 0 ]; then
	echo "cxlkv: missing Debian packages:$missing" >&2
	echo "cxlkv: run as root:  $cmd" >&2
	echo "cxlkv: (or: sudo make deps)" >&2
	exit 1
fi
echo "cxlkv: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet.
if ! $cmd; then
	apt-get update
	$cmd
fi
