#!/bin/bash
# make vm-test: cxlkv.ko in QEMU guests (TCG; no CXL hardware needed).
#
#   1. memmap   memory reserved with memmap=64M$0x10000000 -> phys backing:
#               every ioctl and its errors, mmap rules, PAT types, lock slot
#               release on close and death, DDIO refusal on QEMU's root ports,
#               runtime tests, ioctl fuzz, rmmod; then the emulated backing;
#               then, as uid 65534, the permission model (read-only file,
#               CAP_SYS_ADMIN / admin_gid, reserved lock ids, slots per file)
#               and the ioctl fuzz
#   2. ivshmem  ivshmem-plain on a /dev/shm file -> ivshmem backing: the same
#               ABI checks and the runtime tests
#   3. twohost  two guests on one ivshmem file: data written in one is read
#               in the other; a counter bumped N times by each under the
#               cross-host lock ends at exactly 2N; then the shared-memory RPC
#               (rpc_node_helper): guest 0 formats the pool with an rpc carve
#               and serves, guest 1 calls it RPC_N times at queue depth 1 and
#               RPC_N times at depth 16 and checks every reply
# Every guest fails the step on BUG/WARNING/Oops in dmesg; panic_on_warn and
# oops=panic make such a guest stop at once.  Every qemu run has a timeout.
#
# Environment: CXLKV_BUILD (CMake build dir, for cxlkvctl and the runtime
# tests), VMTEST_KVER (kernel release to boot), FUZZ_ITERS, TWOHOST_N,
# VMTEST_KEEP=1 to keep the work directory, VMTEST_ONLY=twohost to run only
# the two-host guests (VMTEST_ONLY=memmap: only the memmap guest), VMTEST_NOLOCK=1 to increment without the lock (the
# two-host check must then FAIL: it shows the test catches lost updates).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${CXLKV_BUILD:-$ROOT/build}
FUZZ_ITERS=${FUZZ_ITERS:-5000}
TWOHOST_N=${TWOHOST_N:-1000}
QEMU_TIMEOUT=${QEMU_TIMEOUT:-240}

say() { echo "vm-test: $*"; }
die() { echo "vm-test: FAIL: $*" >&2; exit 1; }

# ---- kernel: the newest installed image with matching headers ----------
KVER=${VMTEST_KVER:-}
if [ -z "$KVER" ]; then
	for k in $(ls /boot/vmlinuz-*-amd64 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -V); do
		[ -d "/usr/src/linux-headers-$k" ] && KVER=$k
	done
fi
[ -n "$KVER" ] || die "no /boot/vmlinuz-*-amd64 with matching /usr/src/linux-headers-* (apt install linux-image-amd64 linux-headers-amd64)"
KERNEL=/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || die "$KERNEL is not readable"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (apt install qemu-system-x86)"
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] && file -L "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' \
	|| BUSYBOX=/bin/busybox
ldd "$BUSYBOX" >/dev/null 2>&1 && die "$BUSYBOX is not static (apt install busybox-static)"

WORK=$(mktemp -d /tmp/cxlkv-vmtest.XXXXXX)
SHM=/dev/shm/cxlkv-vmtest-$$
cleanup() {
	rm -f "$SHM"
	if [ "${VMTEST_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- build: module for that kernel, static guest test program ------------
say "kernel $KVER"
make -s -C "$ROOT/kmod" KDIR="/usr/src/linux-headers-$KVER" >"$WORK/kmod-build.log" 2>&1 \
	|| { cat "$WORK/kmod-build.log"; die "module build failed"; }
cc -static -O2 -Wall -Wextra -Werror -I "$ROOT/uapi" -o "$WORK/cxlkv_vmtest" \
	"$ROOT/tests/vm/cxlkv_vmtest.c" "$ROOT"/tests/vm/vmtest_*.c || die "cxlkv_vmtest build failed"

# ---- initramfs ---------------------------------------------------------------
R=$WORK/root
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,lib,lib64,cxlkv}
cp "$BUSYBOX" "$R/bin/busybox"
cp "$ROOT/kmod/cxlkv.ko" "$WORK/cxlkv_vmtest" "$R/cxlkv/"
cp "$ROOT/tests/vm/guest-init.sh" "$R/init"
chmod +x "$R/init"

# Userspace binaries from the CMake build, with the shared libraries ldd names.
# The binaries go in without debug info: unstripped they are ~165 MiB, and the
# memmap guest (512 MiB less the 64 MiB reserved) ran out of room unpacking
# the initramfs ("Initramfs unpacking failed: write error", no init).
copy_with_libs() {
	local bin=$1 lib
	cp "$bin" "$R/cxlkv/"
	strip --strip-debug "$R/cxlkv/$(basename "$bin")"
	for lib in $(ldd "$bin" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | sort -u); do
		mkdir -p "$R$(dirname "$lib")"
		cp -L "$lib" "$R$lib"
	done
}
RUNTIME_BINS=""
# cxlkvd is the lock manager for the lock_counter_helper step, not a step itself.
if [ -x "$BUILD/tools/cxlkvd" ]; then copy_with_libs "$BUILD/tools/cxlkvd"; fi
for b in "$BUILD/tools/cxlkvctl" "$BUILD/tests/dev_backend_test" "$BUILD/tests/lock_counter_helper"; do
	if [ -x "$b" ]; then
		copy_with_libs "$b"
		RUNTIME_BINS="$RUNTIME_BINS $(basename "$b")"
	fi
done
[ -n "$RUNTIME_BINS" ] || say "no runtime binaries in $BUILD (run 'make build' first): runtime steps skipped"
# The shared-memory RPC between the two hosts (docs/rpc.md "The RPC"): one guest serves, the other calls.
RPC_STEPS=""
if [ -x "$BUILD/tests/rpc_node_helper" ]; then
	copy_with_libs "$BUILD/tests/rpc_node_helper"
	RPC_STEPS="rpc"
else
	say "no rpc_node_helper in $BUILD: the two-host rpc step is skipped"
fi
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) >"$WORK/initramfs.gz"

# ---- guests ----------------------------------------------------------------------
# boot NAME CMDLINE [qemu args...]: the serial log goes to $WORK/NAME.log
boot() {
	local name=$1 cmdline=$2
	shift 2
	timeout --foreground -k 5 "$QEMU_TIMEOUT" qemu-system-x86_64 \
		-accel tcg -cpu max -machine q35 -smp 1 -m 512M \
		-display none -monitor none -serial "file:$WORK/$name.log" -no-reboot \
		-kernel "$KERNEL" -initrd "$WORK/initramfs.gz" \
		-append "console=ttyS0 loglevel=1 panic=-1 panic_on_warn=1 oops=panic $cmdline" \
		-device pcie-root-port,id=rp1,chassis=1 -device ioh3420,id=rp2,chassis=2 \
		"$@" </dev/null >"$WORK/$name.qemu" 2>&1 || echo "qemu exit status $?" >>"$WORK/$name.qemu"
}

# check NAME STEP...: every step reported PASS and the guest finished cleanly
FAILED=0
check() {
	local name=$1 step ok=1
	shift
	for step in "$@"; do
		if grep -q "^STEP $step PASS" "$WORK/$name.log"; then
			say "$name: $step PASS"
		else
			say "$name: $step FAIL"
			ok=0
		fi
	done
	grep -q '^VMTEST DONE' "$WORK/$name.log" || { say "$name: guest did not finish (timeout, panic or oops)"; ok=0; }
	if grep -qE 'BUG:|WARNING:|Oops|Kernel panic|general protection fault' "$WORK/$name.log"; then
		say "$name: kernel problem on the console"; ok=0
	fi
	if [ $ok = 0 ]; then
		FAILED=1
		echo "----- $name serial log (last 80 lines) -----"
		tail -n 80 "$WORK/$name.log"
		cat "$WORK/$name.qemu" 2>/dev/null || true
		echo "-----"
	fi
}

ivshmem_dev() { # ivshmem-plain behind the QEMU root port, on file $1
	echo -object "memory-backend-file,id=pool,size=64M,share=on,mem-path=$1" \
		-device "ivshmem-plain,memdev=pool,bus=rp1"
}

T0=$(date +%s)
say "dkms: add + build in private trees"
rc=0
"$ROOT/tests/vm/dkms-check.sh" || rc=$?
case $rc in 0|77) ;; *) FAILED=1 ;; esac

ARGS="vmtest.fuzz=$FUZZ_ITERS vmtest.n=$TWOHOST_N ${VMTEST_NOLOCK:+vmtest.nolock=nolock} vmtest.bins=$(echo $RUNTIME_BINS | tr ' ' ,) ${RPC_STEPS:+vmtest.rpc=${RPC_N:-200}}"
RT_STEPS=""
for b in $RUNTIME_BINS; do RT_STEPS="$RT_STEPS runtime-$b"; done

if [ "${VMTEST_ONLY:-}" != twohost ]; then
say "guest 1: memmap-reserved range, then the emulated range"
boot memmap "memmap=64M\$0x10000000 vmtest.run=memmap $ARGS"
check memmap insmod-phys abi-phys $RT_STEPS fuzz rmmod-phys ddio-restored insmod-emulated abi-emulated rmmod-emulated \
	insmod-unpriv unpriv fuzz-unpriv rmmod-unpriv dmesg
fi
if [ -z "${VMTEST_ONLY:-}" ]; then
say "guest 2: ivshmem"
rm -f "$SHM"
boot ivshmem "vmtest.run=ivshmem $ARGS" $(ivshmem_dev "$SHM")
check ivshmem insmod-ivshmem abi-ivshmem $RT_STEPS rmmod-ivshmem dmesg
fi

if [ "${VMTEST_ONLY:-}" != memmap ]; then
say "guests 3+4: two hosts on one ivshmem file"
rm -f "$SHM"
boot twohost0 "vmtest.run=twohost0 $ARGS" $(ivshmem_dev "$SHM") &
P0=$!
boot twohost1 "vmtest.run=twohost1 $ARGS" $(ivshmem_dev "$SHM") &
P1=$!
wait $P0 $P1 || true
check twohost0 insmod-node0 twohost $RPC_STEPS rmmod dmesg
check twohost1 insmod-node1 twohost $RPC_STEPS rmmod dmesg
grep -h '^twohost:' "$WORK"/twohost?.log || true
grep -h '^rpc:' "$WORK"/twohost?.log || true
fi

say "done in $(( $(date +%s) - T0 )) s"
if [ $FAILED = 0 ]; then
	say "PASS"
else
	VMTEST_KEEP=1
	die "see the logs above"
fi
