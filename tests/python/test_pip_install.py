# SPDX-License-Identifier: MIT
"""`pip install libruntime/python` works offline (no build isolation, no index)
and the installed package finds libcxlkv and works."""
import os
import shutil
import subprocess
import sys

from conftest import PKG


def test_pip_installs_the_package_offline(tmp_path):
    target = tmp_path / "site"
    src = tmp_path / "src"  # a copy, so pip's build/ and egg-info stay out of the source tree
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
                        "--no-cache-dir", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PIP_NO_INPUT="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "cxlkv" / "integrations" / "vllm.py").exists()
    code = ("import cxlkv, os; assert os.path.dirname(cxlkv.__file__).startswith(os.environ['T']); "
            "print(cxlkv.block_keys(list(range(32)), 16).shape)")
    env = dict(os.environ, PYTHONPATH=str(target), T=str(target))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(2, 2)"
