"""The in-process A/B loop the experiments here share: settings alternate round
by round, and every setting's outputs must be bit-identical."""
import time


def alternate(settings, use, call, outs, rounds, reps):
    """Time call() under each of `settings` ({name: value}, applied by use(value)),
    `rounds` rounds of `reps` calls each, after one call to warm up. Returns
    {name: [ms per call, one per round]}; raises AssertionError where any
    setting's outputs (the arrays in `outs`) differ from the first's."""
    ts, ref = {k: [] for k in settings}, None
    for _ in range(rounds):
        for k, v in settings.items():
            use(v)
            call()
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            ts[k].append((time.perf_counter() - t0) / reps * 1e3)
            bits = tuple(o.tobytes() for o in outs)
            ref = ref or bits
            if bits != ref:
                raise AssertionError(f"the outputs differ between settings (at {k!r})")
    return ts
