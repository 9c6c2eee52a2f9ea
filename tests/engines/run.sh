#!/bin/sh
# ctest entry of the engine tests: pytest in the engine environment
# (tools/scripts/engines.sh, made by `make deps`), on the test files given.
# A missing environment is a failure, unless CXLKV_SKIP_ENGINES=1 says to
# skip (exit 77); CI does not set it.
# usage: run.sh OUTDIR TEST_FILE... [-- pytest args]
OUT=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${CXLKV_ENGINE_VENV:-$ROOT/.venv-engines}
mkdir -p "$OUT"
if [ "${CXLKV_SKIP_ENGINES:-0}" = 1 ]; then
	echo "engine tests: skipped (CXLKV_SKIP_ENGINES=1)"
	exit 77
fi
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.cxlkv-stamp" ]; then
	echo "engine tests: no engine environment in $VENV; run 'make deps' (or CXLKV_SKIP_ENGINES=1 to skip them)" >&2
	exit 1
fi
cd "$HERE" || exit 1
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs -x "$@"
