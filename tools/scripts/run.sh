#!/bin/sh
# The main job on the embedded default pool (shm, no module, no CXL).
# Interim (until the KV store lands): format the pool with the standard
# carves and print its layout.
set -eu
B=${CXLKV_BUILD:-build}
POOL=${POOL:-shm:cxlkv-run:1G}
echo "cxlkv: formatting $POOL with the standard carves"
"$B/tools/cxlkvctl" --pool "$POOL" format --force
