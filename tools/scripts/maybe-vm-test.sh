#!/bin/sh
# Run the QEMU kernel-module tests when their packages are present.
set -eu
if command -v qemu-system-x86_64 >/dev/null 2>&1 && ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 \
   && ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1 && [ -x tests/vm/run.sh ]; then
	exec make --no-print-directory vm-test
fi
echo "cxlkv: vm-test skipped (needs qemu-system-x86, linux-image-amd64, linux-headers-amd64)"
