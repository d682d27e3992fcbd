#!/usr/bin/env python3
"""timeline.py - per-kernel times inside the decode step's graph, from a timeline build.

    scripts/timeline.py timeline.csv [--steps N] [--gap US]

A timeline build (`make B=dir gpu-tests STRATA_TIMELINE=1`, kernels/gpu.h) writes one
record per kernel that waits for the kernel before it: %globaltimer just before the wait
(t_pre: the kernel is resident, its work before the wait done) and just after it (t_wait:
the kernel before has finished and its writes are visible).  A kernel's cost in the
chain is the time from its wait's end to the next kernel's: its own work after the wait
plus the hand-over to the next.  Steps are split where the next kernel is scheduled more
than --gap microseconds (default 20) after the previous wait ended (the host's turn
between steps); the last N steps (default 64) of the most common length are averaged
position by position, then summed by kernel.  The file's M lines are the host's times
inside a one-token forward call (kernels/common.cu), printed by the engine as it closes.
"""
import sys
from collections import Counter, defaultdict


def main():
    args = sys.argv[1:]
    path = args[0]
    nsteps, gap = 64, 20.0
    if "--steps" in args:
        nsteps = int(args[args.index("--steps") + 1])
    if "--gap" in args:
        gap = float(args[args.index("--gap") + 1])
    names = defaultdict(set)
    recs = []
    for line in open(path):
        f = line.rstrip("\n").split(",")
        if f[0] == "H":
            names[(int(f[2]), int(f[3]), int(f[4]), int(f[5]))].add(f[6])
        elif f[0] == "D":
            recs.append(((int(f[2]), int(f[3]), int(f[4]), int(f[5])), int(f[6]), int(f[7])))
    steps, cur = [], []
    for i, r in enumerate(recs):
        if cur and (r[1] - cur[-1][2]) / 1e3 > gap:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    lens = Counter(len(s) for s in steps)
    print("steps by length (kernels, count):", lens.most_common(8))
    k = lens.most_common(1)[0][0]
    sel = [s for s in steps if len(s) == k][-nsteps - 1:-1]  # the last one has no successor
    if not sel:
        sys.exit("timeline.py: fewer than two steps of %d kernels in %s" % (k, path))
    n = len(sel)
    dw = [0.0] * k   # wait end to the next kernel's wait end
    pre = [0.0] * k  # wait itself (t_wait - t_pre)
    span = 0.0
    for s in sel:
        for j in range(k - 1):
            dw[j] += (s[j + 1][2] - s[j][2]) / 1e3
        for j in range(k):
            pre[j] += (s[j][2] - s[j][1]) / 1e3
        span += (s[-1][2] - s[0][2]) / 1e3
    print(f"{n} steps of {k} kernels; first wait end to last wait end {span / n:.1f} us a step")
    print(f"{'#':>3} {'grid':>14} {'blk':>4} {'chain us':>8} {'waited':>7}  kernel")
    by = defaultdict(lambda: [0.0, 0])
    for j in range(k):
        g = sel[0][j][0]
        nm = "/".join(sorted(n_.split("(")[0] for n_ in names.get(g, {"?"})))[:60]
        c = dw[j] / n if j < k - 1 else float("nan")
        print(f"{j:>3} {str(g[:3]):>14} {g[3]:>4} {c:8.2f} {pre[j] / n:7.2f}  {nm}")
        if j < k - 1:
            by[(nm, g)][0] += dw[j] / n
            by[(nm, g)][1] += 1
    print("\nby kernel and grid (chain us a step, launches a step):")
    tot = sum(v[0] for v in by.values())
    for (nm, g), (t, c) in sorted(by.items(), key=lambda x: -x[1][0]):
        print(f"{t:8.1f} {c:4d} {t / c:6.2f}/launch {100 * t / tot:5.1f}%  {str(g[:3])} {g[3]}  {nm}")
    print(f"{tot:8.1f} total (without the last kernel)")


if __name__ == "__main__":
    main()
