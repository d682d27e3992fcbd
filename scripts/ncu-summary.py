#!/usr/bin/env python3
"""ncu-summary.py - per-kernel times of an Nsight Compute CSV (scripts/gpu-profile.sh ncu).

    scripts/ncu-summary.py NCU.csv [LAST_N | STEPSs]

Groups the last LAST_N kernels (default: all), or those of the last STEPS decode steps
("6s": from the sixth last token-embedding launch, get_rows, on; the launches a step
takes are printed), by kernel name and grid, and prints for each group the launches,
mean and total gpu__time_duration in microseconds, largest total first.  ncu runs every kernel alone with cold caches, so small kernels read longer than
they run inside a graph; the totals still say where a step's time goes.
"""
import csv
import io
import sys
from collections import OrderedDict


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit("%s: no ncu CSV header" % sys.argv[1])
    rows = list(csv.reader(io.StringIO(text[start:])))
    hdr = rows[0]
    ki, ti, gi = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum"), hdr.index("Grid Size")
    unit = rows[1][ti]
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3}.get(unit, 1.0)
    data = [r for r in rows[2:] if len(r) > ti and r[ti]]
    if len(sys.argv) > 2 and sys.argv[2].endswith("s"):
        steps = int(sys.argv[2][:-1])
        starts = [i for i, r in enumerate(data) if r[ki].startswith(("get_rows", "void get_rows"))]
        if len(starts) < steps:
            sys.exit("%s: %d decode steps (get_rows launches), %d asked for"
                     % (sys.argv[1], len(starts), steps))
        data = data[starts[-steps]:]
        print("%d launches in the last %d steps: %.1f a step" % (len(data), steps,
                                                                len(data) / steps))
    elif len(sys.argv) > 2:
        data = data[-int(sys.argv[2]):]
    groups = OrderedDict()
    for r in data:
        name = r[ki].split("(")[0][:48]
        key = (name, r[gi])
        t = float(r[ti].replace(",", "")) * scale
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += t
    total = sum(g[1] for g in groups.values())
    print("| kernel | grid | launches | mean us | total us | share |")
    print("|---|---|---|---|---|---|")
    for (name, grid), (n, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print("| %s | %s | %d | %.1f | %.1f | %.1f%% |" % (name, grid, n, t / n, t, 100 * t / total))
    print("| all | | %d | | %.1f | |" % (sum(g[0] for g in groups.values()), total))


if __name__ == "__main__":
    main()
