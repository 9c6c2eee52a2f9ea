#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The documents and the references to them stay in step.

- Every coherence rule ("rule N") that code and tests cite has its anchor in
  docs/coherence.md, and no comment cites the CONTRACTS.md that never existed.
- Every section that code and tests cite as docs/NAME.md "Title" (or
  README "Title") is a heading of that document.
- Every relative markdown link in README.md and docs/*.md resolves to an
  existing file and, when it names one, an existing anchor (a heading's
  GitHub slug or an explicit <a id="...">).
- README.md stays an entry point: at most README_MAX_LINES lines.
- No source, build or test file cites a tracker number ("issue" followed by
  a number): a comment gives the reason, or the doc section that explains it.

usage: check_doc_refs.py [REPO_ROOT]"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SELF = os.path.join("tests", "docs", "check_doc_refs.py")
TREES = ["libruntime", "tools", "cuda", "kmod", "uapi", "tests"]
EXTS = (".c", ".h", ".cpp", ".hpp", ".cu", ".py", ".pml", ".sh", ".txt", ".md")
README_MAX_LINES = 220

# Files where tracker numbers are checked.
CODE_EXTS = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".pml", ".sh", ".cmake", ".txt")
CODE_NAMES = ("Makefile", "CMakeLists.txt", "Kbuild")
ISSUE_RE = re.compile(r"\b[Ii]ssue #?[0-9]+")
def read(path):
    try:
        return open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return None


def strip_code(md):
    """Markdown without fenced blocks and inline code spans (no links there)."""
    md = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", md, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", md)


def slug(title):
    """GitHub's anchor for a heading."""
    t = re.sub(r"[`*_]|<[^>]+>", "", title).strip().lower()
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


_anchor_cache = {}


def anchors_of(path):
    if path not in _anchor_cache:
        text = read(path) or ""
        found = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
        seen = {}
        body = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
        for h in re.findall(r"^#{1,6} +(.+?)\s*#*$", body, re.M):
            s = slug(h)
            n = seen.get(s, 0)
            found.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
        _anchor_cache[path] = found
    return _anchor_cache[path]


def headings_of(path):
    text = read(path) or ""
    body = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    return {" ".join(h.split()) for h in re.findall(r"^#{1,6} +(.+?)\s*#*$", body, re.M)}


problems = []

# ---- rules and cited sections ------------------------------------------------
coh = read(os.path.join(ROOT, "docs", "coherence.md"))
rule_anchors = set(re.findall(r'<a id="([^"]+)"></a>', coh))
rule_re = re.compile(r"\b[Rr]ules? (\d+)")
CONT = r"(?:[ \t]+|[ \t]*\n\s*(?://|#|\*)?\s*)"  # a space, or a comment's line break
section_re = re.compile(r"(docs/[a-z0-9_-]+\.md|\bREADME)" + CONT + r'"([^"]+)"')
cited_rules = set()
for tree in TREES:
    for dirpath, _, files in os.walk(os.path.join(ROOT, tree)):
        for name in files:
            if not name.endswith(EXTS):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)
            text = read(path)
            if text is None or rel == SELF:
                continue
            if "CONTRACTS.md" in text:
                problems.append(f"{rel}: cites CONTRACTS.md (use docs/coherence.md and a section)")
            for m in rule_re.finditer(text):
                cited_rules.add(int(m.group(1)))
            if name.endswith(".md"):
                continue  # documents link with markdown, checked below
            for m in section_re.finditer(text):
                doc, title = m.group(1), " ".join(re.sub(r"\n\s*(//|#|\*)?", " ", m.group(2)).split())
                target = os.path.join(ROOT, "README.md" if doc == "README" else doc)
                if not os.path.exists(target):
                    problems.append(f'{rel}: cites {doc} "{title}", but {doc} does not exist')
                elif title not in headings_of(target):
                    line = text.count("\n", 0, m.start()) + 1
                    msg = f'{rel}:{line}: cites {doc} "{title}", which has no such section'
                    problems.append(msg)

for n in sorted(cited_rules):
    if f"rule-{n}" not in rule_anchors:
        problems.append(f"rule {n} is cited in code but docs/coherence.md has no anchor rule-{n}")

# ---- links in README.md and docs/*.md ----------------------------------------
link_re = re.compile(r"\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
md_files = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
links = 0
for rel in md_files:
    text = read(os.path.join(ROOT, rel))
    if text is None:
        problems.append(f"{rel}: cannot be read")
        continue
    for m in link_re.finditer(strip_code(text)):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        links += 1
        file_part, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel), file_part)) if file_part \
            else os.path.join(ROOT, rel)
        if not os.path.exists(path):
            problems.append(f"{rel}: link {target}: no file {os.path.relpath(path, ROOT)}")
        elif anchor and path.endswith(".md") and anchor not in anchors_of(path):
            problems.append(f"{rel}: link {target}: {os.path.relpath(path, ROOT)} has no anchor #{anchor}")

readme_lines = (read(os.path.join(ROOT, "README.md")) or "").count("\n")
if readme_lines > README_MAX_LINES:
    problems.append(f"README.md has {readme_lines} lines, more than {README_MAX_LINES}: "
                    "move detail into docs/ and link to it")

# ---- no tracker numbers in code and tests ------------------------------------
for dirpath, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build") and d != "shared"]
    for name in files:
        if not (name.endswith(CODE_EXTS) or name in CODE_NAMES):
            continue
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, ROOT)
        text = read(path)
        if text is None or rel == SELF:
            continue
        for m in ISSUE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f'{rel}:{line}: cites "{m.group(0)}": say the reason, or the docs/ section that explains it')

for p in problems:
    print(p)
print(f"check_doc_refs: rules cited {sorted(cited_rules)}, {links} relative links, README {readme_lines} lines, "
      f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
