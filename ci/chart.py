#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Chart of a `p2pd bench` JSON: one panel per workload (MiB/s, or IOPS for
random reads) plus one for guest CPU seconds per GiB, a bar per path.
Writes SVG; the caller converts it to PNG (rsvg-convert).

Usage: chart.py BENCH_JSON OUT_SVG"""
import json
import sys

COLORS = {
    'p2pdirect': '#1b9e77',
    'upstream-p2pmem': '#7570b3',
    'bounce': '#d95f02',
    'buffered': '#e7298a',
    'odirect-devmem': '#66a61e',
    'odirect-ram': '#999999',
    'p2pdirect-uring': '#006d4f',
    'upstream-uring-p2pmem': '#4a4590',
    'upstream-uring-devmem': '#3d6b10',
    'uring-ram': '#666666',
}
PW, PH = 300, 210          # panel size
COLS = 5


def esc(s):
    return str(s).replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')


def panel(x0, y0, title, unit, bars):
    """bars: [(path, value)]"""
    out = [f'<g transform="translate({x0},{y0})">',
           f'<text x="{PW / 2}" y="16" text-anchor="middle" font-size="13" '
           f'font-weight="bold">{esc(title)}</text>',
           f'<text x="{PW / 2}" y="30" text-anchor="middle" font-size="10" fill="#555">'
           f'{esc(unit)}</text>']
    top = max([v for _, v in bars if v is not None] + [1e-9])
    n = max(len(bars), 1)
    bw = (PW - 40) / n
    base = PH - 20
    h = base - 45
    out.append(f'<line x1="20" y1="{base}" x2="{PW - 20}" y2="{base}" stroke="#333"/>')
    for i, (path, v) in enumerate(bars):
        x = 20 + i * bw + 4
        if v is None:
            out.append(f'<text x="{x + (bw - 8) / 2}" y="{base - 4}" text-anchor="middle" '
                       f'font-size="9">n/a</text>')
            continue
        bh = h * v / top
        out.append(f'<rect x="{x:.1f}" y="{base - bh:.1f}" width="{bw - 8:.1f}" '
                   f'height="{bh:.1f}" fill="{COLORS.get(path, "#444")}"/>')
        label = f'{v:.3g}' if v < 1000 else f'{v:.0f}'
        out.append(f'<text x="{x + (bw - 8) / 2:.1f}" y="{base - bh - 3:.1f}" '
                   f'text-anchor="middle" font-size="9">{label}</text>')
    out.append('</g>')
    return out


def main(src, dst):
    data = json.load(open(src))
    runs = data['runs']
    paths = list(dict.fromkeys(r['path'] for r in runs))
    workloads = list(dict.fromkeys(r['workload'] for r in runs))
    by = {(r['workload'], r['path']): r for r in runs}
    panels = []
    for w in workloads:
        rand = w.startswith('rand')
        key, unit = ('iops', 'IOPS (higher is better)') if rand else \
            ('mib_s', 'MiB/s (higher is better)')
        bars = []
        # Only the paths that ran the workload (the io_uring ones run the
        # queue-depth sweep, the others the synchronous workloads).
        for p in paths:
            r = by.get((w, p))
            if r:
                bars.append((p, None if r.get('error') else r[key]))
        panels.append((w, unit, bars))
    cpu = [(p, (lambda r: None if not r or r.get('error') else r['cpu_s_per_gib'])(
        by.get(('seq-read-1M', p)))) for p in paths if ('seq-read-1M', p) in by]
    panels.append(('seq-read-1M CPU', 'guest CPU s per GiB (lower is better)', cpu))
    qd32 = [(p, None if r.get('error') else r['cpu_s_per_gib'])
            for p in paths for r in [by.get(('seq-read-1M-qd32', p))] if r]
    if qd32:
        panels.append(('seq-read-1M-qd32 CPU', 'guest CPU s per GiB (lower is better)', qd32))
    rows = (len(panels) + COLS - 1) // COLS
    width, height = COLS * PW, rows * PH + 80
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">p2pd bench: '
           f'{esc(data.get("namespace", ""))} &lt;-&gt; GPU {esc(data.get("gpu", ""))}, '
           f'{esc(data.get("machine", {}).get("cpu", ""))}</text>']
    x = 10
    for p in paths:
        svg.append(f'<rect x="{x}" y="34" width="12" height="12" fill="{COLORS.get(p, "#444")}"/>')
        svg.append(f'<text x="{x + 16}" y="45" font-size="12">{esc(p)}</text>')
        x += 30 + 8 * len(p)
    for i, (title, unit, bars) in enumerate(panels):
        svg += panel((i % COLS) * PW, 60 + (i // COLS) * PH, title, unit, bars)
    svg.append('</svg>')
    open(dst, 'w').write('\n'.join(svg) + '\n')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
