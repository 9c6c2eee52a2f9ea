#!/bin/sh
# Run the QEMU kernel-module tests (make vm-test) when what they need is
# installed: qemu-system-x86, linux-image-amd64, linux-headers-amd64,
# busybox-static, cpio (all in `make deps`).  Otherwise say what is missing.
set -eu
missing=""
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$missing qemu-system-x86"
ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || missing="$missing linux-image-amd64"
ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1 || missing="$missing linux-headers-amd64"
[ -x /bin/busybox ] || missing="$missing busybox-static"
command -v cpio >/dev/null 2>&1 || missing="$missing cpio"
if [ -z "$missing" ] && [ -x tests/vm/run.sh ]; then
	exec make --no-print-directory vm-test
fi
echo "cxlkv: vm-test skipped (missing:$missing)"
