#!/bin/sh
# Soak group of `make bench` (also `make soak` alone): the full-pool test of
# tests/multiproc/kv_full_pool_test.cpp -- writers killed at random (kill -9)
# on a pool kept at its capacity -- run for CXLKV_SOAK_SECONDS (default 180)
# instead of the 20 s of `make test`.  Its figures (processes killed, blocks
# acknowledged / verified / wrong / lost, leftovers of dead writers that
# outlived the bound, the kv check audit, the fresh writer) are merged into
# build/bench/results.json as soak.full_pool.<figure>; the run's log is
# build/bench/soak-full-pool.log.  Exits 1 when the test fails.
set -eu
B=${CXLKV_BUILD:-build}
S=${CXLKV_SOAK_SECONDS:-180}
mkdir -p "$B/bench"
log="$B/bench/soak-full-pool.log"
rc=0
CXLKV_FULL_POOL_SECONDS="$S" CXLKV_FULL_POOL_STRICT=1 CXLKV_TEST_TOOLS="$B/tools" nice "$B/tests/kv_full_pool_test" >"$log" 2>&1 || rc=$?
line=$(grep '^full-pool: seconds=' "$log" | tail -n 1 || true)
/usr/bin/python3 - "$B/bench/results.json" "$rc" "$line" <<'PY'
import json, os, sys
path, rc, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
res = {}
if os.path.exists(path):
    with open(path) as f:
        res = json.load(f)
for field in line.split()[1:]:
    k, _, v = field.partition("=")
    try:
        res["soak.full_pool." + k] = int(v)
    except ValueError:
        pass
res["soak.full_pool.passed"] = 1 if rc == 0 and line else 0
with open(path, "w") as f:
    json.dump(res, f, indent=1, sort_keys=True)
PY
echo "soak: ${line:-no figures (see $log)}" >&2
if [ "$rc" != 0 ]; then
	echo "soak: kv_full_pool_test failed (exit $rc): $log" >&2
	exit 1
fi
