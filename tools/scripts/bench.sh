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
# The picture: each metric against its same-run baseline and target.
"$B/tools/cxlkv-bench" --report-svg "$B/bench/results.json" "$B/bench/report.svg"
cat "$B/bench/results.json"
