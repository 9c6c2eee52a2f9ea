# SPDX-License-Identifier: MIT
"""Fixtures of the engine tests, which run in the engine environment
(tools/scripts/engines.sh) against the real engines' own code: the cxlkv
package and libcxlkv.so of this checkout, a fresh shm pool with its lock
manager (tests/python/pool_env.py), and no test that quietly skips: an engine
that does not import is a failure here."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from pool_env import PoolEnv, env, make_uri, remove_pool_files, run_in_process  # noqa: E402,F401
