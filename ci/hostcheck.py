#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host-side proof of where the guest's bytes went, from the records the guest
tests print as TAP comments (in the order they happened) and what the VM left
in the run dir: the GPUs' backing files (gpuN.mem), the namespace images
(nsN.img) and QEMU's NVMe trace (nvme-trace.log).

Records (numbers decimal, or hex with 0x):
  # GPUMAP BDF PORT          GPU BDF hangs off switch port PORT (dev 1: gpu0.mem,
                             dev 2: gpu1.mem)
  # GPUBAR BDF START LEN     the GPU's BAR2 window in bus addresses
  # NSDEV NSID /dev/NODE SERIAL
  # HOSTCHECK gpu=BDF off=N len=N SOURCE guard=N
      GPU bytes [off, off+len) hold SOURCE, one of
        seed=S          byte i = (i*7 + S + (i >> 12)) & 0xff (devmem_test)
        fill=S pos=P    byte j = fill(P + j, S) (ci/fill.py)
        ns=NSID nsoff=N the final nsNSID.img bytes from offset N
        zero            zeros
      and the guard bytes on each side what the replay expects there.
  # NVMECHECK ns=NSID off=N len=N fill=S pos=P   (or zero instead of fill/pos)
      nsNSID.img bytes [off, off+len) hold fill(P + j, S) after the run.
  # DMACHECK ns=NSID off=N len=N where=gpu:BDF [op=read|write]  (or where=ram)
      every traced NVMe read/write of namespace NSID overlapping bytes
      [off, off+len) had all its data pointers in that GPU's BAR2 (where=ram:
      outside every GPU BAR and the CMB), and those commands that succeeded
      cover the whole range.
  # DMAADDR gpu=BDF addr=N len=N [off=N]
      a DMA segment a peer got for that GPU's memory (a dma-buf or kernel-API
      mapping): [addr, addr+len) lies in the GPU's BAR2 window (and starts
      off bytes into it, if given).

Replay: HOSTCHECK records of one GPU file (NVMECHECK records of one image) are
applied in order, the last writer wins: each record is checked on the bytes no
later record overwrote; guard bytes must equal the replayed content (zero
where no record wrote).

Usage: hostcheck.py GUEST_TAP RUN_DIR   TAP suites host-devmem, host-nvme, host-dma,
                                        host-dmaaddr
       hostcheck.py --commands RUN_DIR [NSID]   the traced I/O commands, a line each"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fill import fill_bytes  # noqa: E402

GUARD_NOTE_MAX = 3


def num(s):
    return int(s, 16) if s.lower().startswith('0x') else int(s)


def pattern(pos, length, seed):
    """devmem_test's pattern, byte i = (i*7 + seed + (i >> 12)) & 0xff."""
    return bytes(((i * 7 + seed + (i >> 12)) & 0xff) for i in range(pos, pos + length))


def subtract(ranges, lo, hi):
    """Disjoint [a, b) ranges minus [lo, hi)."""
    out = []
    for a, b in ranges:
        if hi <= a or lo >= b:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo))
        if hi < b:
            out.append((hi, b))
    return out


def diffs(got, want):
    """Offsets where got differs from want (got may be short)."""
    if got == want:
        return []
    out = [k for k in range(min(len(got), len(want))) if got[k] != want[k]]
    return out + list(range(len(got), len(want)))


def fmt_ranges(ranges):
    return ' '.join(f'[{a:#x}, {b:#x})' for a, b in ranges)


class Suite:
    def __init__(self, name):
        self.n = 0
        print(f'# suite: {name}')

    def result(self, good, desc, notes=()):
        self.n += 1
        print(f'{"ok" if good else "not ok"} {self.n} - {desc}')
        for line in notes:
            print(f'# {line}')

    def end(self, empty):
        if self.n == 0:
            self.result(False, empty)
        print(f'1..{self.n}')


# --- records -----------------------------------------------------------------

class Record:
    """One HOSTCHECK/NVMECHECK/DMACHECK line: kind, its fields, or an error."""

    def __init__(self, kind, body, lineno):
        self.kind, self.body, self.lineno = kind, body.strip(), lineno
        self.error = None
        self.kv, self.words = {}, []
        for tok in self.body.split():
            if '=' in tok:
                k, v = tok.split('=', 1)
                self.kv[k] = v
            else:
                self.words.append(tok)
        try:
            getattr(self, 'parse_' + kind.lower())()
        except (KeyError, ValueError) as e:
            self.error = f'malformed {kind} record (line {lineno}: {self.body!r}): {e}'

    def need(self, allowed, required):
        extra = (set(self.kv) - set(allowed)) | (set(self.words) - {'zero'})
        if extra:
            raise ValueError(f'unknown field(s) {" ".join(sorted(extra))}')
        for k in required:
            if k not in self.kv:
                raise KeyError(k)

    def parse_source(self, allow_seed, allow_ns):
        forms = [('fill', 'pos')] + ([('seed',)] if allow_seed else []) + \
            ([('ns', 'nsoff')] if allow_ns else [])
        given = [f for f in forms if f[0] in self.kv]
        if len(given) + ('zero' in self.words) != 1:
            raise ValueError('needs exactly one source: ' +
                             ', '.join('/'.join(f) for f in forms) + ' or zero')
        if 'zero' in self.words:
            self.src = ('zero',)
            return
        for k in given[0]:
            if k not in self.kv:
                raise KeyError(k)
        self.src = (given[0][0],) + tuple(num(self.kv[k]) for k in given[0])

    def parse_hostcheck(self):
        self.need(('gpu', 'off', 'len', 'guard', 'seed', 'fill', 'pos', 'ns', 'nsoff'),
                  ('gpu', 'off', 'len', 'guard'))
        self.gpu = self.kv['gpu']
        self.off, self.len, self.guard = (num(self.kv[k]) for k in ('off', 'len', 'guard'))
        self.parse_source(True, True)

    def parse_nvmecheck(self):
        self.need(('ns', 'off', 'len', 'fill', 'pos'), ('ns', 'off', 'len'))
        self.ns, self.off, self.len = (num(self.kv[k]) for k in ('ns', 'off', 'len'))
        self.parse_source(False, False)
        self.guard = 0

    def parse_dmacheck(self):
        self.need(('ns', 'off', 'len', 'where', 'op'), ('ns', 'off', 'len', 'where'))
        if self.words:
            raise ValueError(f'unknown word(s) {" ".join(self.words)}')
        self.ns, self.off, self.len = (num(self.kv[k]) for k in ('ns', 'off', 'len'))
        self.where = self.kv['where']
        if self.where != 'ram' and not re.fullmatch(r'gpu:\S+', self.where):
            raise ValueError(f'where={self.where}: not gpu:BDF or ram')
        self.op = self.kv.get('op')
        if self.op not in (None, 'read', 'write'):
            raise ValueError(f'op={self.op}: not read or write')

    def parse_dmaaddr(self):
        self.need(('gpu', 'addr', 'len', 'off'), ('gpu', 'addr', 'len'))
        if self.words:
            raise ValueError(f'unknown word(s) {" ".join(self.words)}')
        self.gpu = self.kv['gpu']
        self.addr, self.len = num(self.kv['addr']), num(self.kv['len'])
        self.bar_off = num(self.kv['off']) if 'off' in self.kv else None
        if self.len <= 0:
            raise ValueError('len must be positive')

    def src_text(self):
        s = self.src
        return {'zero': lambda: 'zeros', 'seed': lambda: f'seed {s[1]:#x}',
                'fill': lambda: f'fill {s[1]} pos {s[2]:#x}',
                'ns': lambda: f'ns{s[1]}.img at {s[2]:#x}'}[s[0]]()


def parse_tap(text):
    records, gpumap, gpubar, nsdev = [], {}, {}, {}
    for lineno, line in enumerate(text.splitlines(), 1):
        m = re.match(r'^# (HOSTCHECK|NVMECHECK|DMACHECK|DMAADDR)\b(.*)$', line)
        if m:
            records.append(Record(m.group(1), m.group(2), lineno))
            continue
        m = re.match(r'^# GPUMAP (\S+) (\S+)', line)
        if m:
            gpumap[m.group(1)] = m.group(2)
            continue
        m = re.match(r'^# GPUBAR (\S+) (\S+) (\S+)', line)
        if m:
            gpubar[m.group(1)] = (num(m.group(2)), num(m.group(3)))
            continue
        m = re.match(r'^# NSDEV (\d+) (\S+) (\S+)', line)
        if m:
            nsdev[int(m.group(1))] = (m.group(2), m.group(3))
    return records, gpumap, gpubar, nsdev


def gpu_file(run_dir, port):
    """Switch downstream port BDF (device 1, 2, ...) -> gpu0.mem, gpu1.mem, ..."""
    try:
        dev = int(port.split(':')[2].split('.')[0], 16)
    except (IndexError, ValueError):
        return None
    return os.path.join(run_dir, f'gpu{dev - 1}.mem')


# --- replay of HOSTCHECK / NVMECHECK records ------------------------------------

class Replay:
    """Records writing one file, in order; the file's bytes are read lazily."""

    def __init__(self, path, run_dir):
        self.path, self.run_dir, self.recs = path, run_dir, []

    def read(self, path, off, length):
        with open(path, 'rb') as f:
            f.seek(off)
            return f.read(length)

    def source(self, rec, a, b):
        """What rec wrote at file offsets [a, b) (within its range)."""
        s, j = rec.src, a - rec.off
        if s[0] == 'zero':
            return bytes(b - a)
        if s[0] == 'seed':
            return pattern(j, b - a, s[1])
        if s[0] == 'fill':
            return fill_bytes(s[2] + j, b - a, s[1])
        img = os.path.join(self.run_dir, f'ns{s[1]}.img')
        data = self.read(img, s[2] + j, b - a)
        if len(data) != b - a:
            raise OSError(f'{img} ends before {s[2] + j + b - a:#x}')
        return data

    def expected(self, lo, hi, upto=None):
        """The replayed content of [lo, hi): zeros, then every record in order."""
        buf = bytearray(hi - lo)
        for rec in self.recs[:upto]:
            a, b = max(lo, rec.off), min(hi, rec.off + rec.len)
            if a < b:
                buf[a - lo:b - lo] = self.source(rec, a, b)
        return bytes(buf)

    def check(self, i):
        """(good, detail, notes) for record i."""
        rec = self.recs[i]
        vis = [(rec.off, rec.off + rec.len)] if rec.len else []
        for later in self.recs[i + 1:]:
            vis = subtract(vis, later.off, later.off + later.len)
        covered = rec.len - sum(b - a for a, b in vis)
        notes, bad = [], 0
        for a, b in vis:
            got = self.read(self.path, a, b - a)
            want = self.source(rec, a, b)
            diff = diffs(got, want)
            bad += len(diff)
            for k in diff[:GUARD_NOTE_MAX]:
                notes.append(f'  at {a + k:#x}: found '
                             f'{"EOF" if k >= len(got) else f"{got[k]:#04x}"}, want {want[k]:#04x}')
        size = os.path.getsize(self.path)
        dirty = 0
        for lo, hi in ((max(0, rec.off - rec.guard), rec.off),
                       (rec.off + rec.len, min(size, rec.off + rec.len + rec.guard))):
            if lo >= hi:
                continue
            got, want = self.read(self.path, lo, hi - lo), self.expected(lo, hi)
            diff = diffs(got, want)
            dirty += len(diff)
            for k in diff[:GUARD_NOTE_MAX]:
                notes.append(f'  guard at {lo + k:#x}: found {got[k]:#04x}, want {want[k]:#04x}')
        parts = []
        if covered:
            parts.append(f'{covered:#x} of its bytes superseded by later records')
        if rec.guard:
            parts.append(f'{rec.guard:#x} guard bytes each side as replayed')
        return bad, dirty, ', '.join(parts), notes, not vis and rec.len > 0


def check_writes(suite, recs, path_of, what_of, run_dir):
    replays = {}
    for rec in recs:
        if rec.error:
            continue
        path = path_of(rec)
        if path is None:
            continue
        replays.setdefault(path, Replay(path, run_dir)).recs.append(rec)
    for rec in recs:
        if rec.error:
            suite.result(False, rec.error)
            continue
        what = what_of(rec)
        path = path_of(rec)
        if not path or not os.path.exists(path):
            suite.result(False, f'{what}: no file for it ({path})')
            continue
        rp = replays[path]
        try:
            bad, dirty, detail, notes, gone = rp.check(rp.recs.index(rec))
        except OSError as e:
            suite.result(False, f'{what}: {e}')
            continue
        name = os.path.basename(path)
        if gone:
            suite.result(True, f'{what} # SKIP superseded: later records overwrote all of it')
        elif bad == 0 and dirty == 0:
            suite.result(True, f'{what} found in {name}' + (f' ({detail})' if detail else ''))
        else:
            suite.result(False, f'{what} in {name}: {bad} bytes differ, {dirty} guard bytes '
                         'differ from the replay' + (f' ({detail})' if detail else ''), notes)


# --- the NVMe trace ----------------------------------------------------------

class Command:
    def __init__(self, lineno, kind, cid, nsid, opc):
        self.lineno, self.kind, self.cid, self.nsid, self.opc = lineno, kind, cid, nsid, opc
        self.rw = None      # 'read', 'write' or 'write-zeroes' once its read/write line is seen
        self.lba = self.nlb = self.count = 0
        self.ptrs = []      # [addr, len, in_cmb]
        self.failed = None  # status of pci_nvme_err_req_status

    @property
    def lba_size(self):
        return self.count // self.nlb if self.nlb else 0

    @property
    def byte_range(self):
        return self.lba * self.lba_size, (self.lba + self.nlb) * self.lba_size

    def __str__(self):
        a, b = self.byte_range
        st = f' FAILED status {self.failed:#x}' if self.failed is not None else ''
        return (f'trace line {self.lineno}: {self.rw} nsid {self.nsid} lba {self.lba:#x} '
                f'nlb {self.nlb} (bytes [{a:#x}, {b:#x})), {len(self.ptrs)} pointers{st}')


TRACE_LINE = re.compile(r'^(?:\d+@\d+\.\d+:)?pci_nvme_(\w+) (.*)$')


def parse_trace(path):
    """The commands of a QEMU NVMe trace (hw/nvme trace-events, log backend) and
    the problems that make it untrustworthy. Every command opens with an
    admin_cmd or io_cmd line; the map_* lines up to the next command line are
    its data pointers (QEMU maps a command's data synchronously, before it
    takes the next one)."""
    cmds, problems, cur = [], [], None
    with open(path, errors='replace') as f:
        for lineno, line in enumerate(f, 1):
            m = TRACE_LINE.match(line.rstrip('\n'))
            if not m:
                continue
            ev, args = m.groups()
            kv = dict(re.findall(r"(\w+) ('[^']*'|\S+)", args))
            try:
                if ev in ('admin_cmd', 'io_cmd'):
                    cur = Command(lineno, ev[:-4], int(kv['cid']),
                                  int(kv['nsid'], 16) if ev == 'io_cmd' else 0,
                                  int(kv['opc'], 16))
                    cmds.append(cur)
                elif ev in ('read', 'write'):
                    nsid, cid = int(kv['nsid']), int(kv['cid'])
                    if cur is None or cur.kind != 'io' or cur.nsid != nsid or cur.cid != cid:
                        problems.append(f'line {lineno}: {ev} of cid {cid} nsid {nsid} '
                                        'does not follow its io_cmd line')
                        cur = Command(lineno, 'io', cid, nsid, -1)
                        cmds.append(cur)
                    cur.rw = ev
                    if ev == 'write' and 'ZEROES' in kv.get('opname', ''):
                        cur.rw = 'write-zeroes'
                    cur.nlb, cur.count, cur.lba = int(kv['nlb']), int(kv['count']), int(kv['lba'], 16)
                elif ev == 'map_addr':
                    if cur is None:
                        problems.append(f'line {lineno}: map_addr before any command')
                        continue
                    cur.ptrs.append([int(kv['addr'], 16), int(kv['len']), False])
                elif ev == 'map_addr_cmb':
                    addr = int(kv['addr'], 16)
                    if cur is None or not cur.ptrs or cur.ptrs[-1][0] != addr:
                        problems.append(f'line {lineno}: map_addr_cmb without its map_addr')
                        continue
                    cur.ptrs[-1][2] = True
                elif ev == 'err_req_status':
                    # Logged at completion, maybe after later commands: the
                    # latest I/O command before it with its cid, nsid and
                    # opcode. nsid 0: an admin command (or no namespace).
                    cid, nsid, opc = int(kv['cid']), int(kv['nsid']), int(kv['opc'], 16)
                    for c in reversed(cmds) if nsid else ():
                        if c.kind == 'io' and (c.cid, c.nsid, c.opc) == (cid, nsid, opc):
                            if c.failed is None:
                                c.failed = int(kv['status'], 16)
                            break
            except (KeyError, ValueError) as e:
                problems.append(f'line {lineno}: cannot parse ({e}): {line.strip()}')
    for c in cmds:
        if c.rw in ('read', 'write') and c.failed is None:
            got = sum(p[1] for p in c.ptrs)
            if got != c.count:
                problems.append(f'{c}: pointers add up to {got} bytes, not {c.count}')
    return cmds, problems


def check_dma(suite, recs, run_dir, gpubar):
    path = os.path.join(run_dir, 'nvme-trace.log')
    cmds, problems = None, []
    if recs:
        if os.path.exists(path):
            cmds, problems = parse_trace(path)
        else:
            problems = [f'no NVMe trace at {path}']
    for rec in recs:
        if rec.error:
            suite.result(False, rec.error)
            continue
        what = (f'ns{rec.ns} [{rec.off:#x}, +{rec.len:#x}) -> {rec.where}'
                + (f' ({rec.op}s only)' if rec.op else ''))
        if problems:
            suite.result(False, f'{what}: the trace cannot be trusted',
                         problems[:5] + ([f'... and {len(problems) - 5} more'] if len(problems) > 5 else []))
            continue
        lo, hi = rec.off, rec.off + rec.len
        hits = [c for c in cmds if c.rw and c.nsid == rec.ns and
                c.byte_range[0] < hi and c.byte_range[1] > lo and
                (rec.op is None or c.rw == rec.op)]
        data = [c for c in hits if c.rw != 'write-zeroes']
        if rec.where == 'ram':
            windows = list(gpubar.values())

            def wrong(p):
                return p[2] or any(p[0] < s + n and p[0] + p[1] > s for s, n in windows)
            want = 'outside every GPU BAR and the CMB'
        else:
            bdf = rec.where[4:]
            if bdf not in gpubar:
                suite.result(False, f'{what}: no "# GPUBAR {bdf}" record')
                continue
            s, n = gpubar[bdf]

            def wrong(p):
                return p[2] or not (s <= p[0] and p[0] + p[1] <= s + n)
            want = f'in BAR2 [{s:#x}, +{n:#x})'
        bad = [(c, p) for c in data for p in c.ptrs if wrong(p)]
        uncovered = [(lo, hi)]
        for c in data:
            if c.failed is None:
                uncovered = subtract(uncovered, *c.byte_range)
        nptr = sum(len(c.ptrs) for c in data)
        notes = [f'  pointer {p[0]:#x}+{p[1]:#x}{" (CMB)" if p[2] else ""} of {c}' for c, p in bad[:5]]
        failed = [c for c in data if c.failed is not None]
        notes += [f'  failed: {c}' for c in failed[:3]]
        if uncovered:
            notes.append(f'  not covered by a traced, successful read/write: {fmt_ranges(uncovered)}')
        skipped = len(hits) - len(data)
        tail = f'; {skipped} write-zeroes command(s) moved no data' if skipped else ''
        if not data:
            suite.result(False, f'{what}: no traced read/write touches this range', notes)
        elif bad or uncovered:
            suite.result(False, f'{what}: {len(bad)} of {nptr} pointers of {len(data)} commands '
                         f'not {want}' + (', range not fully covered' if uncovered else '') + tail,
                         notes)
        else:
            suite.result(True, f'{what}: {len(data)} commands, {nptr} data pointers, all {want}'
                         + tail)


def check_dmaaddr(suite, recs, gpubar):
    """Each DMAADDR segment inside its GPU's BAR2 window (bus addresses)."""
    for r in recs:
        what = f'{r.gpu} segment [{r.addr:#x}, +{r.len:#x})'
        if r.error:
            suite.result(False, r.error)
            continue
        if r.gpu not in gpubar:
            suite.result(False, f'{what}: no "# GPUBAR {r.gpu}" record')
            continue
        s, n = gpubar[r.gpu]
        inside = s <= r.addr and r.addr + r.len <= s + n
        at = r.bar_off is None or r.addr == s + r.bar_off
        want = f'BAR2 [{s:#x}, +{n:#x})'
        if inside and at:
            suite.result(True, f'{what}: in {want}' +
                         (f' at {r.bar_off:#x}' if r.bar_off is not None else ''))
        elif not inside:
            suite.result(False, f'{what}: outside {want}')
        else:
            suite.result(False, f'{what}: at {r.addr - s:#x} of {want}, not {r.bar_off:#x}')


def main(tap_path, run_dir):
    with open(tap_path, errors='replace') as f:
        records, gpumap, gpubar, nsdev = parse_tap(f.read())

    def gpu_path(rec):
        port = gpumap.get(rec.gpu)
        return gpu_file(run_dir, port) if port else None

    suite = Suite('host-devmem')
    check_writes(suite, [r for r in records if r.kind == 'HOSTCHECK'], gpu_path,
                 lambda r: f'{r.gpu} [{r.off:#x}, +{r.len:#x}) {r.src_text()}', run_dir)
    suite.end('no HOSTCHECK records in the guest output')

    suite = Suite('host-nvme')
    check_writes(suite, [r for r in records if r.kind == 'NVMECHECK'],
                 lambda r: os.path.join(run_dir, f'ns{r.ns}.img'),
                 lambda r: f'ns{r.ns} [{r.off:#x}, +{r.len:#x}) {r.src_text()}', run_dir)
    suite.end('no NVMECHECK records in the guest output')

    suite = Suite('host-dma')
    check_dma(suite, [r for r in records if r.kind == 'DMACHECK'], run_dir, gpubar)
    suite.end('no DMACHECK records in the guest output')

    # Only the test suites record peers' mappings (make demo has none).
    addrs = [r for r in records if r.kind == 'DMAADDR']
    if addrs:
        suite = Suite('host-dmaaddr')
        check_dmaaddr(suite, addrs, gpubar)
        suite.end('')


def list_commands(run_dir, nsid=None):
    cmds, problems = parse_trace(os.path.join(run_dir, 'nvme-trace.log'))
    for c in cmds:
        if c.rw and (nsid is None or c.nsid == nsid):
            cmb = sum(p[2] for p in c.ptrs)
            ptrs = ' '.join(f'{p[0]:#x}+{p[1]:#x}' for p in c.ptrs[:4])
            print(f'{c}{f", {cmb} in CMB" if cmb else ""}: {ptrs}{" ..." if len(c.ptrs) > 4 else ""}')
    for p in problems:
        print(f'problem: {p}')


if __name__ == '__main__':
    if len(sys.argv) in (3, 4) and sys.argv[1] == '--commands':
        list_commands(sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else None)
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
