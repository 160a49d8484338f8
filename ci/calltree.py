#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The call tree of each workload in a `make profile` output.

Reads profile.txt (stdin or a path): each `# PROFILE path workload` section
has a `## folded` part, one `count caller;...;callee` line per call chain
that entered the kernel through a syscall or task work. Prints per workload
the samples of each node of the tree with its callees, biggest first, down
to nodes of at least MIN samples (default 5). Comparing two workloads'
trees in the same run shows what one path spends that the other does not.
"""
import re
import sys


def sections(text):
    """(title, folded lines) of each workload."""
    for part in text.split('# PROFILE ')[1:]:
        title = part.splitlines()[0].strip()
        if '## folded\n' not in part:
            yield title, []
            continue
        folded = part.split('## folded\n', 1)[1]
        folded = re.split(r'^## ', folded, maxsplit=1, flags=re.M)[0]
        yield title, folded.splitlines()


def tree(lines):
    root, total = {}, 0
    for line in lines:
        m = re.match(r'\s*(\d+) (.+)$', line)
        if not m:
            continue
        count = int(m.group(1))
        total += count
        node = root
        for frame in m.group(2).split(';'):
            entry = node.setdefault(frame, [0, {}])
            entry[0] += count
            node = entry[1]
    return root, total


def show(node, depth, least, out):
    for name, (count, children) in sorted(node.items(), key=lambda kv: -kv[1][0]):
        if count < least:
            continue
        out.append(f"{count:7d} {'  ' * depth}{name.replace('p2pdirect::', '')[:120]}")
        show(children, depth + 1, least, out)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--min=')]
    least = next((int(a[6:]) for a in sys.argv[1:] if a.startswith('--min=')), 5)
    text = open(args[0]).read() if args else sys.stdin.read()
    for title, lines in sections(text):
        root, total = tree(lines)
        print(f'# {title}: {total} samples in syscalls and task work')
        out = []
        show(root, 0, least, out)
        print('\n'.join(out) if out else '  (no call chains)')
        print()


if __name__ == '__main__':
    main()
