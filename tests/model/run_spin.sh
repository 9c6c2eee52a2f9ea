#!/bin/sh
# Check a Promela model with spin: generate the verifier, compile, run.
# Fails on an assertion violation, an invalid end state or any error.
#   run_spin.sh MODEL.pml WORKDIR [-DBROKEN]
set -eu
model=$1
work=$2
shift 2
mkdir -p "$work"
cd "$work"
spin -a "$@" "$model" >/dev/null
cc -O2 -w -DSAFETY -DNOFAIR -DCOLLAPSE -o pan pan.c
./pan -m100000 > pan.out 2>&1 || true
cat pan.out
grep -q "errors: 0" pan.out
