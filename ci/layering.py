#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The module's layering rules, checked on the sources (exit 1 if broken):
- no file under rust/sys/ names a domain module (crate::X other than sys);
- no import cycle among the modules rust/*.rs (unit tests left out);
- no `unsafe` outside rust/sys/ (kernel-crate extensions and the generated
  bindings), comments included, so a new one gets a home there;
- at most 150 lines of C under rust/ (the shim: static inlines and macros
  only), so logic does not drift back into C.
Prints what it found."""
import glob
import os
import re
import sys

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rust = os.path.join(repo, "rust")
bad = []


def code(path):
    """The file without its KUnit modules (tests may reach across modules;
    they are not the layering); code after a test module is kept."""
    s = open(path).read()
    while True:
        m = re.search(r"#\[(?:kernel::macros::)?kunit_tests[^\]]*\]\s*mod\s+\w+\s*\{", s)
        if not m:
            return s
        depth, i = 1, m.end()
        while depth and i < len(s):
            depth += {"{": 1, "}": -1}.get(s[i], 0)
            i += 1
        s = s[: m.start()] + s[i:]


mods = {}
for f in sorted(glob.glob(os.path.join(rust, "*.rs"))):
    m = os.path.basename(f)[:-3]
    s = code(f)
    deps = set(re.findall(r"crate::(\w+)", s))
    for blk in re.findall(r"use crate::\{(.*?)\};", s, flags=re.S):
        # Top-level names of a grouped import: `a::..`, `a,`, `a}`.
        depth = 0
        tok = ""
        for ch in blk + ",":
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if depth == 0 and ch == ",":
                name = re.match(r"\s*(\w+)", tok)
                if name:
                    deps.add(name.group(1))
                tok = ""
            else:
                tok += ch
    mods[m] = {d for d in deps if d != m and os.path.exists(os.path.join(rust, d + ".rs"))}

root = "p2pdirect"
for m, deps in sorted(mods.items()):
    if m != root:
        print(f"{m} -> {', '.join(sorted(deps)) or '-'}")


def reaches(a, b, seen):
    for d in mods.get(a, ()):
        if d == b:
            return True
        if d not in seen and d != root:
            seen.add(d)
            if reaches(d, b, seen):
                return True
    return False


for m, deps in sorted(mods.items()):
    if m == root:
        continue
    for d in sorted(deps):
        if d != root and reaches(d, m, set()):
            bad.append(f"import cycle: {m} -> {d} -> ... -> {m}")

sys_files = [os.path.join(rust, "sys.rs")] + glob.glob(os.path.join(rust, "sys", "**", "*.rs"), recursive=True)
for f in sorted(sys_files):
    text = open(f).read()
    for d in sorted(set(re.findall(r"crate::(\w+)", text)) - {"sys"}):
        bad.append(f"{os.path.relpath(f, repo)} names the domain module {d}")
    if re.search(r"super::super::", text):
        bad.append(f"{os.path.relpath(f, repo)} reaches out of rust/sys through super::super")

for f in sorted(glob.glob(os.path.join(rust, "*.rs"))):
    if os.path.basename(f) == "sys.rs":
        continue
    n = len(re.findall(r"\bunsafe\b", open(f).read()))
    if n:
        bad.append(f"{os.path.relpath(f, repo)}: {n} unsafe outside rust/sys")

C_LIMIT = 150
c_files = sorted(glob.glob(os.path.join(rust, "**", "*.[ch]"), recursive=True))
c_lines = sum(len(open(f).read().splitlines()) for f in c_files)
print(f"C under rust/: {c_lines} lines ({', '.join(os.path.relpath(f, repo) for f in c_files)})")
if c_lines > C_LIMIT:
    bad.append(f"{c_lines} lines of C under rust/ (at most {C_LIMIT})")

for b in bad:
    print("error: " + b)
sys.exit(1 if bad else 0)
