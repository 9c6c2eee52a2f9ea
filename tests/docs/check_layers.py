#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Includes only go down: the include rule of docs/architecture.md.

Reads the layer order (the fenced ```layers block of docs/architecture.md,
top to bottom; folders named on one line share a layer) and the header set
the tools may use besides the public API (the fenced ```tools-internal block,
one header a line, as the tools include it: pool/format.hpp for
libruntime/src/pool/format.hpp, cuda/copy_core.h for cuda/copy_core.h).  Then reads every #include "..." of
libruntime/src/, cuda/ and tools/ (and every #include <...> that names
one of our files) and fails, naming file:line, on

- a file of one layer that includes a header of a higher layer, or of
  another folder on the same line (folders of one line are peers that do
  not know each other, so no two folders can include each other);
- a library or cuda/ file that includes anything under tools/;
- a tool that includes a header under libruntime/src/ or cuda/ outside
  the documented set, or an entry of the set that no tool includes (the
  set only shrinks: a stale entry would let a tool take the header again
  unnoticed);
- an include that resolves to no file (so a misspelt path cannot hide an
  upward include), except the generated public headers.

The public headers (libruntime/include/cxlkv/) and uapi/ are below every
layer.  Includes of a file's own folder are always allowed.  Below the
layers, a public header includes only public headers and uapi/, and a uapi/
header only uapi/ (the kernel module builds with uapi/ alone), so the
installed headers stand on their own.  No two headers of the repository
share a file name (docs/architecture.md "libruntime/include/cxlkv/").

usage: check_layers.py [REPO_ROOT]
       check_layers.py --self-test   (plants bad includes in a temporary tree
                                      and checks that each one is reported)"""
import os
import re
import shutil
import sys
import tempfile

DOC = os.path.join("docs", "architecture.md")
SRC = os.path.join("libruntime", "src")
PUBLIC = os.path.join("libruntime", "include")
SUPPORT = os.path.join("tests", "support")
# Public headers that exist only in the build tree (configure_file).
GENERATED = {"cxlkv/version.h"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+([<"])([^">]+)[">]')
EXTS = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh")


def fenced_block(doc_text, info):
    m = re.search(r"^```" + re.escape(info) + r"[ \t]*\n(.*?)^```", doc_text, re.M | re.S)
    if not m:
        return None
    lines = []
    for raw in m.group(1).splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def read_doc(root):
    """(rank of each layer, bottom = 0; the tools' internal header set)."""
    text = open(os.path.join(root, DOC), encoding="utf-8").read()
    order = fenced_block(text, "layers")
    if not order:
        raise SystemExit(f"{DOC}: no ```layers block with the layer order")
    rank = {}
    for i, line in enumerate(reversed(order)):
        for name in line.replace(",", " ").split():
            if name in rank:
                raise SystemExit(f"{DOC}: layer {name} listed twice")
            rank[name] = i
    internal = set(fenced_block(text, "tools-internal") or [])
    return rank, internal


def sources(root):
    for top in (SRC, "cuda", "tools"):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(EXTS):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def layer_of(rel):
    """Layer of a repository path: a src folder, 'cuda', 'tools', 'public',
    'uapi', or None."""
    parts = rel.split(os.sep)
    if rel.startswith(SRC + os.sep) and len(parts) > 3:
        return parts[2]
    if parts[0] in ("cuda", "tools", "uapi"):
        return parts[0]
    if rel.startswith(PUBLIC + os.sep):
        return "public"
    return None


def resolve(root, src_rel, inc):
    """Repository path of the file an include names, or None.  The search
    follows the build: the including file's folder, then for tools their own
    folder and tools/common, then the public include folder, the repository
    root (uapi/, cuda/) and libruntime/src."""
    dirs = [os.path.dirname(src_rel)]
    if src_rel.startswith("tools" + os.sep):
        dirs.append(os.path.join("tools", "common"))
    if src_rel.startswith(os.path.join("tools", "bench") + os.sep):
        dirs.append("tests")  # "support/...": the test-support folder the benchmarks share
    dirs += [PUBLIC, "", SRC]
    for d in dirs:
        cand = os.path.normpath(os.path.join(d, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


HEADER_TREES = ("libruntime", "cuda", "tools", "uapi", "kmod", "tests")
HEADER_EXTS = (".h", ".hpp", ".cuh")


def check_headers(root):
    """The public headers and uapi/ stand on their own; header names are unique."""
    errors = []
    seen = {}
    for top in HEADER_TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(HEADER_EXTS):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if name in seen:
                    errors.append(f"{rel}: header name {name} also used by {seen[name]} "
                                  f"(docs/architecture.md \"libruntime/include/cxlkv/\")")
                else:
                    seen[name] = rel
    for top, allowed in ((PUBLIC, ("public", "uapi")), ("uapi", ("uapi",))):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(HEADER_EXTS):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                lines = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read().splitlines()
                for n, line in enumerate(lines, 1):
                    m = INCLUDE_RE.match(line)
                    if not m or m.group(1) == "<":
                        continue
                    inc = m.group(2)
                    target = resolve(root, rel, inc)
                    if target is None:
                        if inc not in GENERATED:
                            errors.append(f"{rel}:{n}: #include \"{inc}\": resolves to no file")
                    elif layer_of(target) not in allowed:
                        errors.append(f"{rel}:{n}: #include \"{inc}\": a {layer_of(rel)} header may include "
                                      f"only {' and '.join(allowed)} headers")
    return errors


def check(root):
    rank, internal = read_doc(root)
    errors = check_headers(root)
    for folder in sorted(os.listdir(os.path.join(root, SRC))):
        if os.path.isdir(os.path.join(root, SRC, folder)) and folder not in rank:
            errors.append(f"{SRC}/{folder}: folder missing from the ```layers block of {DOC}")
    for entry in sorted(internal):
        if not (os.path.isfile(os.path.join(root, SRC, entry)) or
                (entry.startswith("cuda/") and os.path.isfile(os.path.join(root, entry)))):
            errors.append(f"{DOC}: tools-internal header {entry} names no file under {SRC} or cuda/")
    used = set()  # entries of the tools' set that some tool includes
    for rel in sources(root):
        src_layer = layer_of(rel)
        try:
            lines = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read().splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            angle, inc = m.group(1) == "<", m.group(2)
            where = f"{rel}:{n}: #include \"{inc}\""
            target = resolve(root, rel, inc)
            if target is None:
                # <...> that is no file of ours is a system header.
                if inc in GENERATED or angle:
                    continue
                errors.append(f"{where}: resolves to no file")
                continue
            tgt_layer = layer_of(target)
            if tgt_layer in ("public", "uapi"):
                continue
            if target.startswith(SUPPORT + os.sep) and src_layer == "tools":
                # The benchmarks share the tests' stand-ins (docs/testing.md
                # "Unit tests and NonCoherentSim").
                continue
            if os.path.dirname(target) == os.path.dirname(rel):
                continue
            if src_layer == "tools":
                if tgt_layer == "tools":
                    continue
                # The set names headers as the tools include them: under
                # libruntime/src/ (pool/format.hpp) or the root (cuda/...).
                sub = os.path.relpath(target, SRC) if tgt_layer != "cuda" else target
                if sub.replace(os.sep, "/") not in internal:
                    errors.append(f"{where}: tools may include only public headers and the "
                                  f"tools-internal set of {DOC}")
                used.add(sub.replace(os.sep, "/"))
                continue
            if tgt_layer == "tools":
                errors.append(f"{where}: the library includes a tool's header")
                continue
            if tgt_layer not in rank or src_layer not in rank:
                errors.append(f"{where}: layer of {target} or {rel} not in the ```layers block")
                continue
            if rank[tgt_layer] > rank[src_layer]:
                errors.append(f"{where}: {src_layer} includes the higher layer {tgt_layer} "
                              f"(order in {DOC} \"The include rule\")")
            elif rank[tgt_layer] == rank[src_layer] and tgt_layer != src_layer:
                errors.append(f"{where}: {src_layer} and {tgt_layer} share a line of the ```layers block "
                              f"and must not include each other (order in {DOC} \"The include rule\")")
    for entry in sorted(internal - used):
        errors.append(f"{DOC}: tools-internal header {entry} is included by no tool: drop it from the set")
    return errors


def self_test():
    """Copy the parts the checker reads into a temporary tree, plant one
    include of each forbidden kind and check that each is reported."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    base = check(root)
    if base:
        print("self-test: the repository itself fails; fix that first", file=sys.stderr)
        for e in base:
            print(e, file=sys.stderr)
        return 1
    rank, internal = read_doc(root)
    by_rank = sorted(rank, key=lambda k: rank[k])
    low = next(k for k in by_rank if k != "cuda")
    high = by_rank[-1]
    low_hdr = next(f for f in sorted(os.listdir(os.path.join(root, SRC, low))) if f.endswith(".hpp"))
    high_hdr = next(f for f in sorted(os.listdir(os.path.join(root, SRC, high))) if f.endswith(".hpp"))
    private = next(os.path.join(low, f) for f in sorted(os.listdir(os.path.join(root, SRC, low)))
                   if f.endswith(".hpp") and os.path.join(low, f) not in internal)
    tool_hdr = next(f for f in sorted(os.listdir(os.path.join(root, "tools", "common"))) if f.endswith(".hpp"))
    plants = [
        (os.path.join(SRC, low, "planted_up.cpp"), f"{high}/{high_hdr}", "higher layer"),
        (os.path.join("cuda", "planted_up.h"), f"{low}/{low_hdr}", "higher layer"),
        (os.path.join(SRC, low, "planted_tool.cpp"), f"tools/common/{tool_hdr}", "a tool's header"),
        (os.path.join("tools", "bench", "planted_private.cpp"), private, "tools may include only"),
        (os.path.join(SRC, low, "planted_missing.cpp"), f"{low}/no_such_header.hpp", "resolves to no file"),
    ]
    # Two folders on one line of the block (peers) may not include each other.
    peers = [r for r in sorted(set(rank.values())) if sum(1 for k in rank if rank[k] == r) > 1]
    for r in peers[:1]:
        line = sorted(k for k in rank if rank[k] == r)
        pair = next(((a, b, h) for a in line for b in line if a != b and os.path.isdir(os.path.join(root, SRC, a))
                     for h in sorted(os.listdir(os.path.join(root, SRC, b))) if h.endswith(".hpp")), None)
        if pair:
            a, b, h = pair
            plants.append((os.path.join(SRC, a, "planted_peer.cpp"), f"{b}/{h}", "share a line"))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("docs", SRC, PUBLIC, "cuda", "tools", "uapi", SUPPORT):
            shutil.copytree(os.path.join(root, part), os.path.join(tmp, part),
                            ignore=shutil.ignore_patterns("*.py", "*.json", "*.svg", "grafana", "scripts"))
        if check(tmp):
            print("self-test: the copied tree already fails", file=sys.stderr)
            return 1
        # A downward include and a same-folder include stay allowed.
        ok = os.path.join(tmp, SRC, high, "planted_down.cpp")
        with open(ok, "w") as f:
            f.write(f'#include "{low}/{low_hdr}"\n#include "{high_hdr}"\n')
        if check(tmp):
            print("self-test: a downward include was reported", file=sys.stderr)
            failed += 1
        os.unlink(ok)
        for path, inc, expect in plants:
            full = os.path.join(tmp, path)
            with open(full, "w") as f:
                f.write(f'// planted\n#include "{inc}"\n')
            errs = check(tmp)
            hit = [e for e in errs if e.startswith(f"{path}:2:") and expect in e]
            if len(errs) != 1 or not hit:
                print(f"self-test: planting #include \"{inc}\" in {path} gave {errs}", file=sys.stderr)
                failed += 1
            else:
                print(f"self-test: caught {errs[0]}")
            os.unlink(full)
        # Below the layers: a public header that includes a library header,
        # and a header whose name another header has.
        below = [
            (os.path.join(PUBLIC, "cxlkv", "planted_public.hpp"), f'#include "{low}/{low_hdr}"\n',
             "may include only"),
            (os.path.join(SRC, low, "cxlkv_pool.h"), "// planted\n", "also used by"),
        ]
        for path, text, expect in below:
            full = os.path.join(tmp, path)
            with open(full, "w") as f:
                f.write(text)
            errs = check(tmp)
            if len(errs) != 1 or expect not in errs[0]:
                print(f"self-test: planting {path} gave {errs}", file=sys.stderr)
                failed += 1
            else:
                print(f"self-test: caught {errs[0]}")
            os.unlink(full)
        # An entry of the tools' set that no tool includes.
        doc = os.path.join(tmp, DOC)
        text = open(doc, encoding="utf-8").read()
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text.replace("```tools-internal\n", f"```tools-internal\n{private}  # planted\n", 1))
        errs = check(tmp)
        if len(errs) != 1 or "included by no tool" not in errs[0] or private not in errs[0]:
            print(f"self-test: planting {private} in the tools-internal set gave {errs}", file=sys.stderr)
            failed += 1
        else:
            print(f"self-test: caught {errs[0]}")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if failed else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} include(s) break the include rule of {DOC}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
