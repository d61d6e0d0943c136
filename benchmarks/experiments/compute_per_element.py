"""The kernels' cost per element with the data in L2 (out= preallocated, one
thread): the difference of two sizes (64K and 128K elements) cancels the
per-call overhead. Compare with a copy's time per element from L3 or DRAM to
see whether a cell is bound by memory or by the arithmetic
(results/intel_spr/onednn/probes.md).

    python benchmarks/experiments/compute_per_element.py [N,N,...]
"""
import time, numpy as np, cynorm, sys
from ml_dtypes import bfloat16
def med(f, n=1500):
    for _ in range(50): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]
Ns = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else (8, 24, 56, 64, 128, 256, 1024, 4096)
for N in Ns:
  for dt, pd in ((np.float32, np.float32), (bfloat16, bfloat16), (bfloat16, np.float32)):
    res = []
    for E in (65536, 131072):
        M = E // N
        rng=np.random.default_rng(0)
        x=rng.standard_normal((M,N),np.float32).astype(dt); dy=rng.standard_normal((M,N),np.float32).astype(dt)
        w=np.ones(N,pd); b=np.zeros(N,pd)
        y,m,r=cynorm.layer_norm_forward(x,w,b,num_threads=1)
        fo=(np.empty_like(y),np.empty_like(m),np.empty_like(r))
        dx,dw,db=cynorm.layer_norm_backward(dy,x,m,r,w,num_threads=1)
        bo=(np.empty_like(dx),np.empty_like(dw),np.empty_like(db))
        tf=med(lambda: cynorm.layer_norm_forward(x,w,b,num_threads=1,out=fo))
        tb=med(lambda: cynorm.layer_norm_backward(dy,x,m,r,w,num_threads=1,out=bo))
        tc=med(lambda: np.copyto(fo[0], x))
        res.append((M*N, tf, tb, tc))
    (e0,f0,b0,c0),(e1,f1,b1,c1) = res
    d = e1-e0
    print(f"N={N:5d} {np.dtype(dt).name:8s}/{np.dtype(pd).name:8s} fwd {(f1-f0)/d*1e9:.3f} ns/el  bwd {(b1-b0)/d*1e9:.3f} ns/el  copy {(c1-c0)/d*1e9:.3f}  (fwd call overhead {(2*f0-f1)*1e6:.1f} us)", flush=True)
