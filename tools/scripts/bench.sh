#!/bin/sh
# All benchmarks; one flat JSON object in build/bench/results.json.
set -eu
B=${CXLKV_BUILD:-build}
mkdir -p "$B/bench"
"$B/tools/cxlkv-bench" --out "$B/bench/results.json"
# py group: the Python package beside the kv group (merges py.* into the file).
if /usr/bin/python3 -c "import numpy, torch" 2>/dev/null; then
	CXLKV_BUILD="$B" /usr/bin/python3 tools/bench/py_bench.py --results "$B/bench/results.json" >/dev/null
else
	echo "bench: py group skipped (/usr/bin/python3 lacks numpy/torch: make deps)" >&2
fi
# soak group: writers killed at random on a full pool, for minutes
# (tools/scripts/soak.sh; CXLKV_SOAK_SECONDS, 0 leaves it out).
if [ "${CXLKV_SOAK_SECONDS:-180}" != 0 ]; then
	# A failed soak is a figure (soak.full_pool.passed 0), not the end of the bench.
	CXLKV_BUILD="$B" tools/scripts/soak.sh || echo "bench: soak failed (soak.full_pool.passed = 0)" >&2
fi
# damage group: the damaged-pool campaign (tests/damage/damage_campaign.py),
# every kind of damage with two seeds and the Python readers, for at most
# 10 minutes: damage.inputs / .refused / .accepted / .unclear / .crashes /
# .hangs / .wrong_status0 (and per target class) merged into the file.
if /usr/bin/python3 -c "import numpy" 2>/dev/null; then
	CXLKV_TEST_TOOLS="$B/tools" CXLKV_LIB="$B/libruntime/libcxlkv.so" /usr/bin/python3 tests/damage/damage_campaign.py \
		--seeds 2 --python --pnm --budget-s 600 --results "$B/bench/results.json" --json "$B/bench/damage.json" >&2
else
	echo "bench: damage group skipped (/usr/bin/python3 lacks numpy: make deps)" >&2
fi
# engine group: real vLLM engines with and without cxlkv, LMCache beside
# them (tools/bench/engine_bench.py), in the engine environment (make deps).
VENV=${CXLKV_ENGINE_VENV:-$(pwd)/.venv-engines}
if [ "${CXLKV_SKIP_ENGINES:-0}" = 1 ]; then
	echo "bench: engine group skipped (CXLKV_SKIP_ENGINES=1)" >&2
elif [ -x "$VENV/bin/python" ]; then
	CXLKV_BUILD="$B" CXLKV_LIB="$B/libruntime/libcxlkv.so" CXLKV_TEST_TOOLS="$B/tools" \
		"$VENV/bin/python" tools/bench/engine_bench.py --results "$B/bench/results.json" >/dev/null
else
	echo "bench: no engine environment in $VENV: run 'make deps' (or CXLKV_SKIP_ENGINES=1 to leave the engine group out)" >&2
	exit 1
fi
# remote group: a prefix fetched from another rack through Mooncake Store
# over TCP (tools/bench/remote_bench.py, docs/remote.md), beside the local
# fetch and a plain socket copy of the same bytes, in the engine environment
# (which pins Mooncake).  The racks' hosts get network namespaces when this
# runs as root; remote.netns says whether they did.
if [ "${CXLKV_SKIP_ENGINES:-0}" = 1 ]; then
	echo "bench: remote group skipped (CXLKV_SKIP_ENGINES=1)" >&2
else
	CXLKV_BUILD="$B" CXLKV_LIB="$B/libruntime/libcxlkv.so" \
		"$VENV/bin/python" tools/bench/remote_bench.py --results "$B/bench/results.json" >/dev/null ||
		echo "bench: remote group failed (see $B/bench/remote/)" >&2
	# The replay across racks (docs/remote.md "Replay across racks"): 2 and 4
	# racks sharing one Mooncake Store beside one shared pool of the same
	# total capacity and beside isolated pools (replay_racks.*).  Blocks of
	# 4 KiB for 2 racks and 8 KiB for 4, so that the store (16 MiB a rack)
	# has room for about as many blocks as the pools in both.
	for rb in "2 4096" "4 8192"; do
		set -- $rb
		CXLKV_PYTHON="$VENV/bin/python" CXLKV_LIB="$B/libruntime/libcxlkv.so" \
			"$B/tools/cxlkv-replay" --racks "$1" --segment-mib 16 --block-bytes "$2" --capacity-blocks 8192 \
			--logdir "$B/bench/replay_racks" --results "$B/bench/results.json" >/dev/null ||
			echo "bench: replay across $1 racks failed (see $B/bench/replay_racks/)" >&2
	done
fi
# The picture: each metric against its same-run baseline and target.
"$B/tools/cxlkv-bench" --report-svg "$B/bench/results.json" "$B/bench/report.svg"
cat "$B/bench/results.json"
