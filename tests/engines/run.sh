#!/bin/sh
# ctest entry of the engine tests: pytest in the engine environment
# (tools/scripts/engines.sh, made by `make deps`), on the test files given.
# A missing environment is a failure, unless CXLKV_SKIP_ENGINES=1 says to
# skip (exit 77); CI does not set it.  The output goes to stdout and to
# OUTDIR/NAME.out; pytest's summary line to OUTDIR/NAME.log, which the
# Makefile prints after ctest.
# usage: run.sh OUTDIR NAME TEST_FILE... [pytest args]
OUT=$1
NAME=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${CXLKV_ENGINE_VENV:-$ROOT/.venv-engines}
mkdir -p "$OUT"
if [ "${CXLKV_SKIP_ENGINES:-0}" = 1 ]; then
	echo "engine tests ($NAME): skipped (CXLKV_SKIP_ENGINES=1)" | tee "$OUT/$NAME.log"
	exit 77
fi
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.cxlkv-stamp" ]; then
	echo "engine tests ($NAME): no engine environment in $VENV; run 'make deps' (or CXLKV_SKIP_ENGINES=1 to skip them)" |
		tee "$OUT/$NAME.log" >&2
	exit 1
fi
cd "$HERE" || exit 1
# The engines' compile caches stay in the build tree, not in /tmp.
export TORCHINDUCTOR_CACHE_DIR="$OUT/torchinductor" TRITON_CACHE_DIR="$OUT/triton"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs -x --durations=8 "$@" >"$OUT/$NAME.out" 2>&1
rc=$?
cat "$OUT/$NAME.out"
grep -E "^(=+ )?[0-9]+ (passed|failed|error)|no tests ran" "$OUT/$NAME.out" | tail -n1 |
	sed "s/^=* *//; s/ *=*\$//; s/^/engine tests ($NAME): /" >"$OUT/$NAME.log"
exit $rc
