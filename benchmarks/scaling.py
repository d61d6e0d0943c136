"""bench.py scaling: how a call's time changes with its thread count.

    python benchmarks/bench.py scaling --threads 1,2,4,8 [--quick] [--rounds R] [--json F] [--plot P.png]

The thread counts alternate round by round, as `seed` alternates libraries:
each round times every count once, in a rotating order, so a burst of noise
on a shared machine hits every count alike instead of one whole count. Each
point is the median of the rounds' medians, with their spread (fastest and
slowest round) in the table and as error bars in the plot. A point whose
spread is wider than its difference from a neighbouring count is marked:
the measurement cannot tell those two counts apart.
"""

import json
import math
import os


def _rounds_for(args):
    return args.rounds or (5 if args.quick else 7)


def _time_counts(bench, worker, req, threads, rounds, budget):
    """{threads: [median of each round]} for one cell and direction set, counts alternating."""
    per_round = {t: {} for t in threads}
    for rnd in range(rounds):
        order = threads[rnd % len(threads):] + threads[: rnd % len(threads)]
        for t in order:
            res = worker.ask(dict(req, threads=t, budget=budget, warmup=0.3 if rnd == 0 else 0.05))
            for d, samples in res.items():
                if isinstance(samples, list) and samples:
                    per_round[t].setdefault(d, []).append(bench._median(samples))
    return per_round


def _rows_for(case, shape, mode, itemsize, per_round, threads, cores):
    rows = []
    nbytes = math.prod(shape) * itemsize
    for d, moved in (("fwd", 2), ("bwd", 3)):
        obs = {t: sorted(per_round[t].get(d, [])) for t in threads}
        if not all(obs.values()):
            continue
        med = {t: obs[t][len(obs[t]) // 2] if len(obs[t]) % 2 else 0.5 * sum(obs[t][len(obs[t]) // 2 - 1:
                                                                                  len(obs[t]) // 2 + 1])
               for t in threads}
        base = med[threads[0]] * threads[0]
        for i, t in enumerate(threads):
            lo, hi = obs[t][0], obs[t][-1]
            neighbours = [threads[j] for j in (i - 1, i + 1) if 0 <= j < len(threads)]
            unclear = any(hi - lo > abs(med[t] - med[n]) for n in neighbours)
            rows.append({"case": f"{case} {d}", "direction": d, "shape": list(shape), "mode": mode,
                         "threads": t, "median_ms": med[t] * 1e3, "fastest_ms": lo * 1e3, "slowest_ms": hi * 1e3,
                         "rounds": len(obs[t]), "speedup": base / med[t], "speedup_lo": base / hi,
                         "speedup_hi": base / lo, "efficiency": base / med[t] / t,
                         "GBps": moved * nbytes / med[t] / 1e9, "oversubscribed": t > cores,
                         "spread_wider_than_step": unclear})
    return rows


def cmd_scaling(args, bench):
    threads = [int(t) for t in args.threads.split(",")]
    cores = os.cpu_count() or 1
    if args.shapes:
        cases = [(tuple(s), (1 if len(s) == 4 else len(s) - 1)) for s in args.shapes]
    elif args.quick:
        cases = [((64, 128, 56, 56), 1), ((4096, 1024), 1)]
    else:
        cases = [((64, 128, 56, 56), 1), ((64, 128, 56, 56), 3), ((4096, 4096), 1), ((16384, 1024), 1)]
    modes = args.modes if args.modes else ["fp32", "bf16"]
    rounds = _rounds_for(args)
    budget = (0.08 if args.quick else 0.3) / rounds * len(threads)
    w = bench.Worker("cynorm")
    isa = w.info.get("config", {}).get("isa")
    cpu = bench._machine()["cpu_model"]
    results = []
    try:
        for shape, axis in cases:
            for mode in modes:
                case = f"{tuple(shape)} {bench._axes_name(shape, axis)} {mode}"
                bench._progress(f"scaling {case}: threads {threads}, {rounds} rounds alternating")
                req = {"shape": shape, "axis": axis, "mode": mode, "norm": args.norm,
                       "directions": ["fwd", "bwd"], "aligned": args.aligned}
                per_round = _time_counts(bench, w, req, threads, rounds, budget)
                itemsize = 2 if bench.MODES[mode][0] in ("bfloat16", "float16") else 4
                for r in _rows_for(case, shape, mode, itemsize, per_round, threads, cores):
                    results.append(dict(r, axes=bench._axes_name(shape, axis), isa=isa, cpu_model=cpu, cores=cores))
    finally:
        w.close()
    _print(results, threads, cores, cpu, isa, rounds, args.aligned)
    meta = {"command": "scaling", "threads": threads, "rounds": rounds, "isa": isa, "cpu_model": cpu,
            "cores": cores, "machine": bench._machine()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": results}, f, indent=1)
        bench._progress(f"wrote {args.json}")
    if args.plot:
        plot(results, threads, cores, cpu, isa, args.plot)
        bench._progress(f"wrote {args.plot}")
    return results


def _print(results, threads, cores, cpu, isa, rounds, aligned):
    print(f"\n### Thread scaling: cynorm ({isa}) on {cpu}, {cores} cores, {rounds} rounds alternating the "
          f"thread counts{', 64-byte aligned inputs' if aligned else ''}\n")
    print("median of the rounds' medians; spread = fastest .. slowest round; speedup = time(first count) x "
          "first count / time(n); efficiency = speedup / n; GB/s counts x (+dy) read and y/dx written. "
          "`*`: more threads than cores (cynorm caps them at the core count unless CYNORM_OVERSUBSCRIBE=1). "
          "`~`: the spread is wider than the step to a neighbouring count: those counts are not told apart.\n")
    print("| case | threads | median ms | spread ms | speedup | efficiency | GB/s |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in results:
        mark = ("*" if r["oversubscribed"] else "") + ("~" if r["spread_wider_than_step"] else "")
        print(f"| {r['case']} | {r['threads']}{mark} | {r['median_ms']:.3f} | {r['fastest_ms']:.3f} .. "
              f"{r['slowest_ms']:.3f} | {r['speedup']:.2f} | {r['efficiency']:.2f} | {r['GBps']:.1f} |")


def plot(results, threads, cores, cpu, isa, path):
    """Speedup against threads, one line per case, error bars from the rounds' spread;
    hollow markers: points not told apart from a neighbour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for case in sorted({r["case"] for r in results}):
        pts = sorted((r["threads"], r) for r in results if r["case"] == case)
        xs = [t for t, _ in pts]
        ys = [r["speedup"] for _, r in pts]
        err = [[r["speedup"] - r["speedup_lo"] for _, r in pts], [r["speedup_hi"] - r["speedup"] for _, r in pts]]
        line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=case)[0]
        unclear = [(t, r["speedup"]) for t, r in pts if r["spread_wider_than_step"]]
        if unclear:
            ax.plot([u[0] for u in unclear], [u[1] for u in unclear], "o", mfc="white", mec=line.get_color())
    ax.plot(threads, threads, "k--", label="ideal (speedup = threads)")
    if max(threads) > cores:
        ax.axvline(cores, color="grey", linestyle=":", label=f"{cores} cores (beyond: oversubscribed)")
    ax.set_xlabel("threads")
    ax.set_ylabel("speedup over the first count")
    ax.set_title(f"cynorm thread scaling ({isa}) - {cpu}\nerror bars: fastest..slowest round; hollow: "
                 f"not told apart from a neighbour", fontsize=9)
    ax.set_xticks(threads)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
