#!/usr/bin/env python
"""G=<groups> DT=bf16|fp32 python benchmarks/experiments/groupnorm_stream_onoff.py

(64,128,56,56) channels-first GroupNorm backward, 1 thread, fresh dx, in one
process: streamed dx (the policy's default) against plain stores (stream_min_bytes
raised past the output), 8 rounds alternating, medians of 5 calls each."""
from cynorm import _isa
G=int(os.environ.get("G","128")); dt=ml_dtypes.bfloat16 if os.environ.get("DT","bf16")=="bf16" else np.float32
x=np.random.default_rng(0).standard_normal((64,128,56,56),np.float32).astype(dt); dy=x.copy(); w=np.ones(128,np.float32)
y,m,r=cynorm.group_norm_forward(x,G,w,w,num_threads=1)
f=lambda: cynorm.group_norm_backward(dy,x,m,r,w,num_groups=G,num_threads=1)
default=_isa.kernels._policy("stream_min_bytes")
res={"stream":[], "plain":[]}
for rnd in range(8):
    for k,v in (("stream",default),("plain",1<<50)):
        _isa.kernels._policy("stream_min_bytes", v)
        f(); t=time.perf_counter()
        for _ in range(5): f()
        res[k].append((time.perf_counter()-t)/5*1e3)
_isa.kernels._policy("stream_min_bytes", default)
a,b=statistics.median(res["plain"]),statistics.median(res["stream"])
print(f"G={G} {os.environ.get('DT','bf16')} nchw bwd: plain {a:.3f} ms, streamed {b:.3f} ms, speed {a/b:.3f}; streamed range {min(res['stream']):.2f}-{max(res['stream']):.2f}, plain {min(res['plain']):.2f}-{max(res['plain']):.2f}")
