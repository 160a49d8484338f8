#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Filter: Rust v0 symbols (`_R...`) in the text become readable paths.

Enough of the v0 grammar for a profile: the identifiers of the path, in
order, joined by `::`; crate hashes, disambiguators, back-references and
const generics are dropped (generic arguments appear inline, so a symbol
reads like `p2pdirect::sys::bio::AsyncBatch::storage::UringIo::launch`).
A symbol it cannot read is left as it is.
"""
import re
import sys


def demangle(sym: str) -> str:
    s, i, out = sym[2:], 0, []
    while i < len(s):
        c = s[i]
        if c.isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            n = int(s[i:j])
            if j < len(s) and s[j] == "_":
                j += 1
            if j + n > len(s):
                return sym
            if n:
                out.append(s[j : j + n])
            i = j + n
        elif c in "BK" or (c == "s" and i > 0 and s[i - 1] in "CMXYNvt"):
            # back-reference, const value, disambiguator: up to their `_`
            k = s.find("_", i)
            if k < 0:
                return sym
            i = k + 1
        else:
            i += 1
    return "::".join(out) if out else sym


for line in sys.stdin:
    sys.stdout.write(
        re.sub(r"(?<![0-9A-Za-z_])_R[0-9A-Za-z_]+", lambda m: demangle(m.group(0)), line)
    )
