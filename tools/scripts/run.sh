#!/bin/sh
# The main job: cxlkv-replay on an embedded pool (no module, no CXL): 2 MiB
# pages in a private tmpfs when run as root, else a shm pool in /dev/shm.
# A lock manager, prefill and decode worker processes (one node each) replay
# the built-in workload, or a Mooncake JSONL trace with TRACE=path, then the
# sweep: capacities of 5%, 10%, 25% and 50% of the distinct blocks, each hit
# ratio beside the block-LRU reference's at the same capacity.  Exit status 0 only with 0 errors
# and (unbounded) a token hit ratio equal to the trace's prefix reuse.
# SSD=path adds an SSD tier on that file (a real file system, e.g. /tmp, not
# tmpfs): memory is then bounded (CAPACITY=blocks, default a quarter of the
# distinct blocks), evicted blocks are demoted to the SSD, and the summary
# shows both tiers' hits and bytes.
#   TRACE=path  REQUESTS=n  PREFILL=p  DECODE=d  SSD=path  SSD_SIZE=MiB  CAPACITY=blocks  REPLAY_ARGS="..."
set -eu
B=${CXLKV_BUILD:-build}
set -- --prefill "${PREFILL:-2}" --decode "${DECODE:-2}"
if [ -n "${TRACE:-}" ]; then
	set -- "$@" --trace "$TRACE" --requests "${REQUESTS:-150}"
elif [ -n "${REQUESTS:-}" ]; then
	set -- "$@" --requests "$REQUESTS"
fi
# shellcheck disable=SC2086
exec "$B/tools/cxlkv-replay" "$@" ${SSD:+--ssd "$SSD"} ${SSD_SIZE:+--ssd-size "$SSD_SIZE"} \
	${CAPACITY:+--capacity "$CAPACITY"} --sweep ${REPLAY_ARGS:-}
