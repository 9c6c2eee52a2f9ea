#!/bin/busybox sh
# /init of the vm-test initramfs (see tests/vm/run.sh).  Reads the scenario
# from the kernel command line (vmtest.run=...), runs its steps and prints
# "STEP <name> PASS|FAIL" for each, then "VMTEST DONE", then powers off.
/bin/busybox --install -s
export PATH=/cxlkv:/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t debugfs debugfs /sys/kernel/debug
mount -t tmpfs tmpfs /tmp

arg() { sed -n "s/.*vmtest\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
RUN=$(arg run)
FUZZ=$(arg fuzz)
N=$(arg n)
BINS=$(arg bins | tr , ' ')
NOLOCK=$(arg nolock)
RPC_N=$(arg rpc)
KO=/cxlkv/cxlkv.ko

step() { # step NAME COMMAND...
	name=$1
	shift
	echo "== $name: $*"
	if "$@"; then echo "STEP $name PASS"; else echo "STEP $name FAIL (exit $?)"; fi
}

load() { # insmod, then wait for devtmpfs to show /dev/cxlkv0
	insmod $KO "$@" || return 1
	i=0
	while [ ! -c /dev/cxlkv0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	[ -c /dev/cxlkv0 ]
}

# The first QEMU pcie-root-port (1b36:000c) as a BDF, for the DDIO commands.
root_port() {
	for d in /sys/bus/pci/devices/*; do
		if [ "$(cat $d/vendor)" = 0x1b36 ] && [ "$(cat $d/device)" = 0x000c ]; then
			basename $d
			return
		fi
	done
}

cxlkvctl_checks() {
	P="--pool dev:/dev/cxlkv0"
	RP=$(root_port)
	cxlkvctl $P format --force || return 1
	cxlkvctl $P info || return 1
	cxlkvctl $P carve rm kv --force || return 1
	cxlkvctl $P carve create scratch --size 3M || return 1
	cxlkvctl $P carve list | grep -q scratch || return 1
	cxlkvctl $P carve rm scratch || return 1
	cxlkvctl $P carve rm control 2>/dev/null && return 1
	cxlkvctl $P module info || return 1
	cxlkvctl $P --json module info || return 1
	cxlkvctl $P memtype get control || return 1
	cxlkvctl $P memtype set control wc || return 1
	[ "$(cxlkvctl $P memtype get control)" = "control wc" ] || return 1
	cxlkvctl $P memtype set control wb || return 1
	cxlkvctl $P memtype set nope uc 2>/dev/null && return 1
	cxlkvctl $P lock list || return 1
	cxlkvctl $P ddio status --pci "$RP" || return 1
	# QEMU's root port is not an Intel IIO port: refused without --force;
	# with --force the write happens (QEMU keeps bit 7 of 0x180) and is read
	# back; the module restores the original value at rmmod.
	cxlkvctl $P ddio off --pci "$RP" && return 1
	cxlkvctl $P ddio on --pci "$RP" --force | grep -q 'DDIO (Use_Allocating_Flow_Wr) on' || return 1
	cxlkvctl $P ddio off --pci "$RP" --force | grep -q 'DDIO (Use_Allocating_Flow_Wr) off' || return 1
	cxlkvctl $P ddio status --pci 0000:00:00.0 && return 1
	cxlkvctl $P ddio status --pci zz:1 && return 1
	return 0
}

# The real TwoTierLock (lock_counter_helper) on /dev/cxlkv0, with a cxlkvd
# manager: a holder killed with -9 has its global slot released by the
# module (gone from `lock list`, request word IDLE), and another process then
# takes the lock (recovering the node-local mutex: exit 4) and counts.
lock_kill_checks() {
	U=dev:/dev/cxlkv0
	# node-local memory (robust local-tier mutexes) lives in /dev/shm
	[ -d /dev/shm ] || { mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm; } || return 1
	cxlkvctl --pool $U format --force >/dev/null || return 1
	cxlkvd --pool $U --foreground &
	D=$!
	lock_counter_helper $U 0 hold >/tmp/held &
	H=$!
	i=0
	while ! grep -q held /tmp/held && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	grep -q held /tmp/held || { kill $D; return 1; }
	cxlkvctl --pool $U lock list
	cxlkvctl --pool $U lock list | grep -q "^128 *$H " || { kill $D; return 1; }
	kill -9 $H
	wait $H
	sleep 0.2
	cxlkvctl --pool $U lock list
	if cxlkvctl --pool $U lock list | grep -q "^128 "; then kill $D; return 1; fi
	lock_counter_helper $U 0 10
	rc=$?
	kill $D
	wait $D
	[ $rc = 4 ]
}

# The RPC helper attaches as a node: node-local state lives in /dev/shm.
rpc_helper() {
	mkdir -p /dev/shm
	grep -q ' /dev/shm ' /proc/mounts || mount -t tmpfs tmpfs /dev/shm || return 1
	rpc_node_helper "$@"
}

runtime_steps() {
	for b in $BINS; do
		case $b in
		cxlkvctl) step runtime-cxlkvctl cxlkvctl_checks ;;
		lock_counter_helper) step runtime-lock_counter_helper lock_kill_checks ;;
		*) step runtime-$b env CXLKV_TEST_DEV=/dev/cxlkv0 $b ;;
		esac
	done
}

dmesg_clean() {
	if dmesg | grep -E 'BUG:|WARNING:|Oops|Call Trace|general protection'; then
		return 1
	fi
	dmesg | grep -iE 'cxlkv|PAT' | tail -n 40
	echo "dmesg: $(dmesg | grep -c cxlkv) cxlkv lines, clean"
}

# perfctrlsts_0 (config offset 0x180) of the QEMU root port, as hex
perfctrlsts() {
	hexdump -s 384 -n 4 -e '1/4 "%08x"' /sys/bus/pci/devices/$(root_port)/config
}

ddio_restored() {
	now=$(perfctrlsts)
	echo "perfctrlsts before load $DDIO_BEFORE, after unload $now"
	[ "$now" = "$DDIO_BEFORE" ]
}

case $RUN in
memmap)
	DDIO_BEFORE=$(perfctrlsts)
	step insmod-phys load phys_base=0x10000000 phys_size=0x4000000 format=1 ivshmem=0
	step abi-phys cxlkv_vmtest abi /dev/cxlkv0 phys
	runtime_steps
	step fuzz cxlkv_vmtest fuzz /dev/cxlkv0 "$FUZZ" 42
	step rmmod-phys rmmod cxlkv
	step ddio-restored ddio_restored
	step insmod-emulated load emulated_size=0x1000000 format=1 ivshmem=0
	step abi-emulated cxlkv_vmtest abi /dev/cxlkv0 emulated
	step rmmod-emulated rmmod cxlkv
	# the permission model and the fuzz as uid 65534, on a fresh standard pool
	step insmod-unpriv load emulated_size=0x1000000 format=1 ivshmem=0
	step unpriv cxlkv_vmtest unpriv /dev/cxlkv0
	step fuzz-unpriv cxlkv_vmtest fuzz-unpriv /dev/cxlkv0 "$FUZZ"
	step rmmod-unpriv rmmod cxlkv
	;;
ivshmem)
	step insmod-ivshmem load format=1
	step abi-ivshmem cxlkv_vmtest abi /dev/cxlkv0 ivshmem
	runtime_steps
	step rmmod-ivshmem rmmod cxlkv
	;;
twohost0)
	step insmod-node0 load node_id=0 format=1
	step twohost cxlkv_vmtest twohost /dev/cxlkv0 0 "$N" $NOLOCK
	[ -n "$RPC_N" ] && step rpc rpc_helper vmserver dev:/dev/cxlkv0 0 "$RPC_N"
	step rmmod rmmod cxlkv
	;;
twohost1)
	step insmod-node1 load node_id=1
	step twohost cxlkv_vmtest twohost /dev/cxlkv0 1 "$N" $NOLOCK
	[ -n "$RPC_N" ] && step rpc rpc_helper vmclient dev:/dev/cxlkv0 1 "$RPC_N"
	step rmmod rmmod cxlkv
	;;
*)
	echo "vmtest: unknown scenario '$RUN'"
	;;
esac
step dmesg dmesg_clean
echo "VMTEST DONE"
poweroff -f
