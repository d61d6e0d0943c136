"""cynorm from JAX and Dask (bench.py jax / bench.py dask).

    python benchmarks/bench.py jax [--rounds 5] [--json F]
    python benchmarks/bench.py dask [--gib 4] [--rounds 3] [--json F]

jax: LayerNorm forward+backward, one jitted step (y, dx, dweight, dbias), as
cynorm.jax, as jitted pure JAX, and as direct cynorm calls on NumPy arrays; each
under glibc's malloc and under tcmalloc (LD_PRELOAD=libtcmalloc_minimal.so.4:
XLA allocates every output afresh, and with glibc each large one pays its page
faults again). One worker process per allocator; the parent alternates them
round by round, so the columns are taken side by side. Medians of the rounds.

dask: forward+backward of a float32 array larger than one worker's memory
limit, built chunk by chunk on the workers (a template plus an offset), on the
threaded scheduler in one process and on LocalClusters of 1 and 2 worker
processes (2 threads in all); the outputs reduce to sums, dweight and dbias,
whose bits must agree across configurations and with one NumPy cynorm call on
the whole array (timed once, generating the same data: it holds 4x the array).
"""

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

TCMALLOC = "libtcmalloc_minimal.so.4"
JAX_CELLS = [((4096, 4096), "float32"), ((4096, 4096), "bfloat16"), ((8, 64), "float32")]
JAX_VARIANTS = ["cynorm.jax", "pure JAX", "cynorm direct"]


# ------------------------------------------------------------------ JAX --

def _jax_steps(shape, dtype):
    """variant -> a no-argument callable running one fwd+bwd step to completion."""
    import jax
    import jax.numpy as jnp
    from ml_dtypes import bfloat16

    import cynorm
    import cynorm.jax as cnj

    dt = np.dtype(bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, np.float32).astype(dt)
    dy = rng.standard_normal(shape, np.float32).astype(dt)
    w = (1 + 0.1 * rng.standard_normal(shape[-1:])).astype(dt)
    b = (0.1 * rng.standard_normal(shape[-1:])).astype(dt)
    jx, jdy, jw, jb = (jnp.asarray(a) for a in (x, dy, w, b))

    def pure(x, w, b):   # statistics in float32, as cynorm computes them
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mean).mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + 1e-5) * w.astype(jnp.float32) + b.astype(jnp.float32)
        return y.astype(x.dtype)

    def step_of(f):
        def step(x, w, b, dy):
            y, vjp = jax.vjp(f, x, w, b)
            return (y,) + vjp(dy)
        return jax.jit(step)

    cn_step, pure_step = step_of(cnj.layer_norm), step_of(pure)

    def direct():
        y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
        return y, cynorm.layer_norm_backward(dy, x, mean, rstd, w)

    return {"cynorm.jax": lambda: jax.block_until_ready(cn_step(jx, jw, jb, jdy)),
            "pure JAX": lambda: jax.block_until_ready(pure_step(jx, jw, jb, jdy)),
            "cynorm direct": direct}


def _time(fn, budget):
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    batch = max(1, int(2e-3 / one))
    samples = []
    for _ in range(max(3, int(budget / (one * batch)))):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def jax_worker():
    """Serve rounds: a line in, one JSON line of {cell: {variant: seconds}} out."""
    import jax
    steps = {f"{s[0]}x{s[1]} {d}": _jax_steps(s, d) for s, d in JAX_CELLS}
    print(json.dumps({"ready": True, "jax": jax.__version__}), flush=True)
    for _ in sys.stdin:
        print(json.dumps({cell: {v: _time(fn, 0.6) for v, fn in variants.items()}
                          for cell, variants in steps.items()}), flush=True)


def _spawn(preload):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = TCMALLOC
    p = subprocess.Popen([sys.executable, __file__, "_jax_worker"], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hello = json.loads(p.stdout.readline())
    assert hello.get("ready"), hello
    return p


def _tcmalloc_found():
    import ctypes
    try:
        ctypes.CDLL(TCMALLOC)
        return True
    except OSError:
        return False


def cmd_jax(args):
    allocators = {"glibc": _spawn(False)}
    if _tcmalloc_found():
        allocators["tcmalloc"] = _spawn(True)
    else:
        print(f"# {TCMALLOC} not found (apt install libtcmalloc-minimal4): glibc only", file=sys.stderr)
    rounds = {a: [] for a in allocators}
    for r in range(args.rounds):
        for name, p in allocators.items():
            p.stdin.write("go\n")
            p.stdin.flush()
            rounds[name].append(json.loads(p.stdout.readline()))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    for p in allocators.values():
        p.stdin.close()
        p.wait()
    med = {a: {cell: {v: statistics.median(rd[cell][v] for rd in rs) for v in JAX_VARIANTS} for cell in rs[0]}
           for a, rs in rounds.items()}
    print(f"## cynorm from JAX: LayerNorm forward+backward, one jitted step (medians of {args.rounds} rounds)\n")
    print("| cell | allocator | cynorm.jax | cynorm direct | pure JAX (jit) | cynorm.jax / direct | pure JAX / cynorm.jax |")
    print("|---|---|---|---|---|---|---|")
    for cell in med["glibc"]:
        for a in med:
            m = med[a][cell]
            print(f"| {cell} | {a} | {_fmt(m['cynorm.jax'])} | {_fmt(m['cynorm direct'])} | {_fmt(m['pure JAX'])} "
                  f"| {m['cynorm.jax'] / m['cynorm direct']:.2f} | {m['pure JAX'] / m['cynorm.jax']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": med, "rounds": rounds}, f, indent=1)


def _fmt(sec):
    return f"{sec * 1e3:.2f} ms" if sec >= 1e-3 else f"{sec * 1e6:.1f} µs"


# ----------------------------------------------------------------- Dask --

_TEMPLATE = {}


def _make_chunk(block_info=None, *, seed):
    """A chunk from a per-process template plus an offset per chunk: cheap, deterministic."""
    info = block_info[None]
    shape = tuple(info["chunk-shape"])
    key = (shape, seed)
    if key not in _TEMPLATE:
        _TEMPLATE[key] = np.random.default_rng(seed).standard_normal(shape, np.float32)
    return _TEMPLATE[key] + np.float32(0.001 * info["chunk-location"][0])


def _dask_step(M, N, chunk_rows):
    import dask.array as da

    import cynorm.dask as cnd

    def gen(seed):
        return da.map_blocks(_make_chunk, seed=seed, dtype=np.float32, chunks=(tuple(_rows(M, chunk_rows)), (N,)),
                             meta=np.empty((0, 0), np.float32))

    x, dy = gen(1), gen(2)
    w = np.ones(N, np.float32)
    b = np.zeros(N, np.float32)
    y, mean, rstd = cnd.layer_norm_forward(x, w, b)
    dx, dw, db = cnd.layer_norm_backward(dy, x, mean, rstd, w)
    return [y.sum(dtype=np.float64), dx.sum(dtype=np.float64), dw, db]


def _rows(M, c):
    return [c] * (M // c) + ([M % c] if M % c else [])


def _whole_array(M, N, chunk_rows):
    """The same data in NumPy, one cynorm call each way (x, dy, y, dx in memory at once:
    4x the array). Returns ([seconds], dweight/dbias hash)."""
    import cynorm
    t0 = time.perf_counter()
    x, dy = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    for k, r0 in enumerate(range(0, M, chunk_rows)):
        r1 = min(M, r0 + chunk_rows)
        info = {None: {"chunk-shape": (r1 - r0, N), "chunk-location": (k, 0)}}
        x[r0:r1], dy[r0:r1] = _make_chunk(info, seed=1), _make_chunk(info, seed=2)
    w, b = np.ones(N, np.float32), np.zeros(N, np.float32)
    y, mean, rstd = cynorm.layer_norm_forward(x, w, b)
    y.sum(dtype=np.float64)
    del y
    dx, dw, db = cynorm.layer_norm_backward(dy, x, mean, rstd, w)
    dx.sum(dtype=np.float64)
    return [time.perf_counter() - t0], hashlib.sha256(dw.tobytes() + db.tobytes()).hexdigest()[:16]


def cmd_dask(args):
    import dask
    import distributed

    import cynorm.dask as cnd

    N = 1024
    M = int(args.gib * 2**30) // (4 * N)
    B = cnd.block_rows((M, N), -1, np.float32)
    chunk_rows = B   # a multiple of the block: no rechunk in the backward
    limit = "2GiB"
    # worker processes unpickle _make_chunk from this module
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                             os.environ.get("PYTHONPATH")]))
    configs = {"one process (threads)": None}
    clusters = []
    for n in (1, 2):
        c = distributed.LocalCluster(n_workers=n, threads_per_worker=2 // n, processes=True, memory_limit=limit,
                                     dashboard_address=None, silence_logs=40)
        clusters.append(c)
        configs[f"LocalCluster {n} worker{'s' if n > 1 else ''} x {2 // n} thread{'s' if n == 1 else ''}"] = \
            distributed.Client(c, set_as_default=False)
    times = {name: [] for name in configs}
    hashes = {}
    try:
        for r in range(args.rounds):
            for name, client in configs.items():
                t0 = time.perf_counter()
                if client is None:
                    out = dask.compute(*_dask_step(M, N, chunk_rows), scheduler="threads", num_workers=2)
                else:
                    out = client.compute(_dask_step(M, N, chunk_rows), sync=True)
                times[name].append(time.perf_counter() - t0)
                hashes[name] = hashlib.sha256(np.asarray(out[2]).tobytes() + np.asarray(out[3]).tobytes()).hexdigest()[:16]
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    finally:
        for client in configs.values():
            if client is not None:
                client.close()
        for c in clusters:
            c.close()
    whole = "NumPy: one cynorm call on the whole array"
    times[whole], hashes[whole] = _whole_array(M, N, chunk_rows)
    base = statistics.median(times["one process (threads)"])
    gib = M * N * 4 / 2**30
    print(f"## cynorm.dask: LayerNorm forward+backward of a ({M}, {N}) float32 array ({gib:.1f} GiB; x and dy "
          f"{2 * gib:.1f} GiB), chunks of {chunk_rows} rows, worker memory limit {limit} "
          f"(medians of {args.rounds} rounds)\n")
    print("| configuration | time | vs one process | dweight/dbias sha256 |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        if name == whole:   # 12 GiB filled single-threaded first: its time says nothing of cynorm
            print(f"| {name} (bits only) | ({med:.1f} s with the data fill) | | {hashes[name]} |")
        else:
            print(f"| {name} | {med:.2f} s | {base / med:.2f}x | {hashes[name]} |")
    print(f"\nAll dweight/dbias identical: {len(set(hashes.values())) == 1}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"M": M, "N": N, "chunk_rows": chunk_rows, "times": times, "hashes": hashes}, f, indent=1)


if __name__ == "__main__" and sys.argv[1:] == ["_jax_worker"]:
    jax_worker()
