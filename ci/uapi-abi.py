#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Checks that the UAPI header means the same ABI to 32-bit and 64-bit x86
processes: every struct's size and every member's offset, and every command
number (which encodes the argument's size), compiled with gcc -m32 and -m64.

A 32-bit process's ioctls reach the module through compat_ptr_ioctl, which
passes the argument on unchanged; that is only right while the layouts are
the same. Usage: uapi-abi.py KSRC KBUILD [HEADER] (the kernel source and build trees,
for <linux/types.h> and <asm/ioctl.h>; HEADER, include/uapi/linux/p2pdirect.h
by default); prints what differs and exits 1.
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

repo = Path(__file__).resolve().parent.parent
header = repo / "include/uapi/linux/p2pdirect.h"


def probes(text):
    """C definitions, one per struct size, member offset and command."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\};", text, flags=re.S):
        out.append((f"{name}.sizeof", f"sizeof(struct {name})"))
        for decl in body.split(";"):
            m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl.strip())
            if m:
                member = m.group(1)
                out.append((f"{name}.{member}", f"__builtin_offsetof(struct {name}, {member})"))
    for cmd in re.findall(r"#define\s+(P2PDIRECT_\w+)\s*\\?\s*_IO", text):
        out.append((cmd, cmd))
    return out


def values(flag, src, ksrc, kbuild, incdir):
    """Compiles src for one ABI; returns the probes' values by label."""
    cmd = ["gcc", flag, "-D__EXPORTED_HEADERS__", "-nostdinc", f"-I{incdir}",
           f"-I{ksrc}/include/uapi", f"-I{ksrc}/arch/x86/include/uapi",
           f"-I{kbuild}/arch/x86/include/generated/uapi", "-S", "-o", "-", "-x", "c", "-"]
    r = subprocess.run(cmd, input=src, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"gcc {flag} failed:\n{r.stderr}")
    vals, label = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"^(p\d+):", line)
        if m:
            label = m.group(1)
        m = re.match(r"\s+\.long\s+(\S+)", line)
        if m and label:
            vals[label] = (int(m.group(1), 0) - 1) & 0xFFFFFFFF
            label = None
    return vals


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    ksrc, kbuild = sys.argv[1:3]
    path = Path(sys.argv[3]) if len(sys.argv) == 4 else header
    # The header is included as <linux/p2pdirect.h> from a copy's directory.
    with tempfile.TemporaryDirectory() as inc:
        (Path(inc) / "linux").mkdir()
        (Path(inc) / "linux/p2pdirect.h").write_text(path.read_text())
        return compare(path, ksrc, kbuild, inc)


def compare(path, ksrc, kbuild, inc):
    """Prints the values that differ between -m32 and -m64; 1 if any."""
    items = probes(path.read_text())
    # Each value + 1, so none is zero and all land in .data as one .long.
    src = "#include <linux/p2pdirect.h>\n" + "".join(
        f"unsigned int p{i} = (unsigned int)({expr}) + 1;\n" for i, (_, expr) in enumerate(items))
    v32 = values("-m32", src, ksrc, kbuild, inc)
    v64 = values("-m64", src, ksrc, kbuild, inc)
    bad = 0
    for i, (what, _) in enumerate(items):
        a, b = v32.get(f"p{i}"), v64.get(f"p{i}")
        if a is None or b is None or a != b:
            fmt = (lambda v: "none" if v is None else hex(v)) if "." not in what else str
            print(f"{what}: {fmt(a)} for 32-bit processes, {fmt(b)} for 64-bit ones")
            bad += 1
    structs = sum(1 for w, _ in items if w.endswith(".sizeof"))
    commands = sum(1 for w, _ in items if "." not in w)
    print(f"{len(items)} values: {structs} structs, {len(items) - structs - commands} members, "
          f"{commands} commands; {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
