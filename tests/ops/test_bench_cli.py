# SPDX-License-Identifier: MIT
"""cxlkv-bench refuses bad arguments before it runs anything: a whole
`make bench` takes minutes, so a typo in a group name or an output path that
cannot be written must not cost them, nor leave an empty results file."""
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build"))
TOOLS = os.environ.get("CXLKV_TEST_TOOLS", os.path.join(BUILD, "tools"))
BENCH = os.path.join(TOOLS, "cxlkv-bench")


def bench(*args, cwd=None):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_an_unknown_group_is_refused_naming_it_and_the_groups_and_writes_nothing(tmp_path):
    out = tmp_path / "r.json"
    r = bench("--only", "nosuch", "--out", str(out))
    assert r.returncode == 2
    assert "--only nosuch: no such benchmark group" in r.stderr
    assert "copy" in r.stderr and "replay" in r.stderr  # the groups --list shows
    assert "running" not in r.stderr
    assert not out.exists()


def test_an_output_that_cannot_be_written_is_refused_before_any_run(tmp_path):
    r = bench("--only", "copy", "--out", str(tmp_path))
    assert r.returncode == 2 and "it is a directory" in r.stderr and "running" not in r.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = bench("--only", "copy", "--out", str(blocker / "r.json"))
    assert r.returncode == 2 and "cannot be written" in r.stderr and "running" not in r.stderr


def test_options_without_their_values_say_what_they_need():
    for args, want in ((["--only"], "--only needs a GROUP"), (["--out"], "--out needs a FILE"),
                       (["--report-svg", "x.json"], "--report-svg needs RESULTS.json and OUT.svg")):
        r = bench(*args)
        assert r.returncode == 2, args
        assert want in r.stderr, (args, r.stderr)
        assert "unknown argument" not in r.stderr
