#!/bin/sh
# All benchmarks; one flat JSON object in build/bench/results.json.
set -eu
B=${CXLKV_BUILD:-build}
mkdir -p "$B/bench"
"$B/tools/cxlkv-bench" --out "$B/bench/results.json"
cat "$B/bench/results.json"
