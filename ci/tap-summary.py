#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Aggregates TAP streams (several suites, each opened by '# suite: NAME')
into one verdict. A suite whose plan ('1..N') does not match the results it
printed, or that printed no plan at all, counts as one failure: a test
program that crashed half-way must not look green. So does a suite that
ran no test ('1..0': a filter that matches nothing). A result marked
'# SKIP' counts as skipped, not passed (the skipped count is printed
before the verdict line).

Usage: tap-summary.py TAP_FILE...   Prints failures, then 'N passed, N failed'.
Exit status 0 only if nothing failed and something passed."""
import re
import sys

RESULT = re.compile(r'^(not ok|ok)\b\s*(\d+)?\s*(?:- )?(.*)$')
PLAN = re.compile(r'^1\.\.(\d+)')
SKIP = re.compile(r'#\s*SKIP\b', re.IGNORECASE)


def summarise(lines):
    passed, failed, skipped, problems = 0, 0, 0, []
    suites = []
    cur = None

    def close(s):
        nonlocal failed
        if s is None:
            return
        if s['plan'] is None:
            failed += 1
            problems.append(f"suite {s['name']}: no TAP plan (did it crash?)")
        elif s['plan'] != s['count']:
            failed += 1
            problems.append(f"suite {s['name']}: planned {s['plan']}, ran {s['count']}")
        elif s['plan'] == 0:
            failed += 1
            problems.append(f"suite {s['name']}: ran no test (plan 1..0)")
        elif s.get('exit', 0) != 0 and not s['failed']:
            failed += 1
            problems.append(f"suite {s['name']}: exited {s['exit']} with every test ok")

    for raw in lines:
        line = raw.rstrip('\r\n')
        m = re.match(r'^# suite: (\S+)', line)
        if m:
            close(cur)
            cur = {'name': m.group(1), 'plan': None, 'count': 0, 'failed': 0}
            suites.append(cur)
            continue
        if cur is None:
            continue
        m = re.match(r'^# suite-exit: \S+ (\d+)', line)
        if m:
            cur['exit'] = int(m.group(1))
            continue
        if PLAN.match(line):
            cur['plan'] = int(PLAN.match(line).group(1))
            continue
        m = RESULT.match(line)
        if m:
            cur['count'] += 1
            if m.group(1) == 'ok' and SKIP.search(m.group(3)):
                skipped += 1
            elif m.group(1) == 'ok':
                passed += 1
            else:
                failed += 1
                cur['failed'] += 1
                problems.append(f"suite {cur['name']}: not ok: {m.group(3)}")
    close(cur)
    return passed, failed, skipped, problems, len(suites)


def main(paths):
    lines = []
    for p in paths:
        try:
            with open(p, errors='replace') as f:
                lines.extend(f.readlines())
        except OSError as e:
            lines.extend([f'# suite: {p}\n', f'not ok 1 - cannot read {p}: {e}\n', '1..1\n'])
    passed, failed, skipped, problems, nsuites = summarise(lines)
    for p in problems:
        print(f'FAIL {p}')
    if skipped:
        print(f'{skipped} skipped (not counted as passed)')
    print(f'{passed} passed, {failed} failed')
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
