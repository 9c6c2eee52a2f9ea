#!/bin/sh
# ctest entry of a Python test file: pytest with Debian's python3 (which sees
# python3-torch / -numpy / -pytest from `make deps`).  The output goes to
# stdout and to OUTDIR/pytest.out; OUTDIR/pytest.log gets pytest's summary
# line, which the Makefile prints after ctest.  Exit 77 (skip) when the
# modules are missing.  Without FILE, every test of tests/python.
# usage: run_pytest.sh PYTHON OUTDIR [FILE...]
PY=$1
OUT=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
if ! "$PY" -c "import pytest, numpy, torch" 2>/dev/null; then
	echo "python tests: $PY lacks pytest/numpy/torch (make deps installs python3-pytest python3-numpy python3-torch)" | tee "$OUT/pytest.log"
	exit 77
fi
if [ $# -eq 0 ]; then set -- "$HERE"; fi
"$PY" -m pytest -p no:cacheprovider -q -rs "$@" >"$OUT/pytest.out" 2>&1
rc=$?
cat "$OUT/pytest.out"
# pytest's summary line ("N passed, M skipped in Xs"), for the Makefile.
grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped)|no tests ran" "$OUT/pytest.out" | tail -n1 | sed 's/^=* *//; s/ *=*$//; s/^/python tests ('"$(basename "$OUT")"'): /' >"$OUT/pytest.log"
exit $rc
