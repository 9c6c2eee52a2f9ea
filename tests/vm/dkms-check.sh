#!/bin/bash
# Check that dkms.conf works: `dkms add` and `dkms build` of cxlkv for the
# installed Debian kernel, in private source and dkms trees (nothing under
# /usr/src or /var/lib/dkms is touched).  Prints PASS or FAIL; exits 77 when
# dkms or the kernel headers are missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NAME=$(sed -n 's/^PACKAGE_NAME="\(.*\)"/\1/p' "$ROOT/dkms.conf")
VER=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$ROOT/dkms.conf")

command -v dkms >/dev/null || { echo "dkms-check: SKIP (dkms not installed)"; exit 77; }
KVER=${VMTEST_KVER:-}
if [ -z "$KVER" ]; then
	for h in $(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V); do
		KVER=${h#/usr/src/linux-headers-}
	done
fi
[ -n "$KVER" ] || { echo "dkms-check: SKIP (no linux-headers-*-amd64)"; exit 77; }

T=$(mktemp -d /tmp/cxlkv-dkms.XXXXXX)
trap 'rm -rf "$T"' EXIT
SRC=$T/src/$NAME-$VER
mkdir -p "$SRC" "$T/dkms" "$T/install"
# What a source package ships for the module: dkms.conf, kmod/, uapi/.
cp "$ROOT/dkms.conf" "$SRC/"
cp -r "$ROOT/uapi" "$SRC/"
mkdir -p "$SRC/kmod"
cp "$ROOT"/kmod/{Makefile,Kbuild,*.c,*.h} "$SRC/kmod/"

D="dkms --sourcetree $T/src --dkmstree $T/dkms --installtree $T/install"
KSRC=/usr/src/linux-headers-$KVER
if $D add -m "$NAME" -v "$VER" >"$T/log" 2>&1 &&
   $D build -m "$NAME" -v "$VER" -k "$KVER" --kernelsourcedir "$KSRC" >>"$T/log" 2>&1 &&
   ls "$T/dkms/$NAME/$VER/$KVER/x86_64/module/$NAME.ko"* >/dev/null 2>&1; then
	echo "dkms-check: dkms add + build of $NAME $VER for $KVER: PASS"
else
	cat "$T/log"
	find "$T/dkms" -name make.log -exec cat {} \; 2>/dev/null || true
	echo "dkms-check: dkms add + build of $NAME $VER for $KVER: FAIL"
	exit 1
fi
