"""Non-temporal (streamed) against plain stores for out= outputs, in one process,
alternating (stream_min_bytes 8 MB, the default, against never). Issue 36 asked
whether the Xeon's large L3 makes plain stores pay for 16- to 64-MB outputs;
they did not (results/intel_spr/onednn/probes.md).

    python benchmarks/experiments/stream_vs_plain.py THREADS
"""
import sys, time, numpy as np, cynorm
from ml_dtypes import bfloat16
T = int(sys.argv[1])
def med(f, n=21):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]*1e3
for shape, dt, pd in [((16384,1024),bfloat16,bfloat16), ((16384,1024),bfloat16,np.float32), ((4096,4096),bfloat16,np.float32), ((16384,1024),np.float32,np.float32)]:
    rng=np.random.default_rng(0)
    x=rng.standard_normal(shape,np.float32).astype(dt); dy=rng.standard_normal(shape,np.float32).astype(dt)
    w=np.ones(shape[1:],pd); b=np.zeros(shape[1:],pd)
    y,m,r=cynorm.layer_norm_forward(x,w,b,num_threads=T)
    fo=(np.empty_like(y),np.empty_like(m),np.empty_like(r))
    dx,dw,db=cynorm.layer_norm_backward(dy,x,m,r,w,num_threads=T)
    bo=(np.empty_like(dx),np.empty_like(dw),np.empty_like(db))
    res={}
    for rnd in range(3):
        for smb in (8<<20, 1<<40):
            cynorm._core._policy("stream_min_bytes", smb)
            res.setdefault(('f',smb),[]).append(med(lambda: cynorm.layer_norm_forward(x,w,b,num_threads=T,out=fo)))
            res.setdefault(('b',smb),[]).append(med(lambda: cynorm.layer_norm_backward(dy,x,m,r,w,num_threads=T,out=bo)))
    cynorm._core.reset_policy()
    g=lambda k: sorted(res[k])[1]
    print(shape, np.dtype(dt).name, np.dtype(pd).name, f"T={T} fwd stream {g(('f',8<<20)):.2f} plain {g(('f',1<<40)):.2f} | bwd stream {g(('b',8<<20)):.2f} plain {g(('b',1<<40)):.2f}", flush=True)
