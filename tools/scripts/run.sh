#!/bin/sh
# The main job on the embedded default pool (shm, no module, no CXL).
set -eu
B=${CXLKV_BUILD:-build}
POOL=${POOL:-shm:cxlkv-run:1G}
"$B/tools/cxlkvctl" --pool "$POOL" format --force
"$B/tools/cxlkvctl" --pool "$POOL" info
