#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Every coherence rule and docs/coherence.md section that the code cites
exists in docs/coherence.md, and no comment cites the CONTRACTS.md that
never existed.  usage: check_doc_refs.py [REPO_ROOT]"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
TREES = ["libruntime", "tools", "cuda", "kmod", "uapi", "tests"]
EXTS = (".c", ".h", ".cpp", ".hpp", ".cu", ".py", ".pml", ".sh", ".txt", ".md")

doc = open(os.path.join(ROOT, "docs", "coherence.md"), encoding="utf-8").read()
anchors = set(re.findall(r'<a id="([^"]+)"></a>', doc))
headings = {h.strip() for h in re.findall(r"^##+ (.+)$", doc, re.M)}

rule_re = re.compile(r"\b[Rr]ules? (\d+)")
section_re = re.compile(r'docs/coherence\.md\s*(?:\n\s*(?://|#|\*)\s*)?"([^"]+)"')
problems = []
cited_rules = set()
for tree in TREES:
    for dirpath, _, files in os.walk(os.path.join(ROOT, tree)):
        for name in files:
            if not name.endswith(EXTS):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if rel == os.path.join("tests", "docs", "check_doc_refs.py"):
                continue
            if "CONTRACTS.md" in text:
                problems.append(f"{rel}: cites CONTRACTS.md (use docs/coherence.md and a section)")
            for m in rule_re.finditer(text):
                cited_rules.add(int(m.group(1)))
            for m in section_re.finditer(text):
                title = " ".join(re.sub(r"\n\s*(//|#|\*)?", " ", m.group(1)).split())
                if title not in headings:
                    problems.append(f'{rel}: cites docs/coherence.md "{title}", which has no such section')

for n in sorted(cited_rules):
    if f"rule-{n}" not in anchors:
        problems.append(f"rule {n} is cited in code but docs/coherence.md has no anchor rule-{n}")

for p in problems:
    print(p)
print(f"check_doc_refs: rules cited {sorted(cited_rules)}, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
