"""A short run for valgrind memcheck: every dtype pair, norm and code path once."""

import numpy as np
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa

_isa.kernels._policy("min_elems_per_thread", 1)   # take the multi-threaded paths too
rng = np.random.default_rng(0)
pairs = [(np.float32, np.float32), (np.float64, np.float64), (bfloat16, bfloat16), (bfloat16, np.float32),
         (np.float16, np.float16), (np.float16, np.float32)]
for xd, pd in pairs:
    for shape in [(5, 3), (9, 56), (4, 300), (3, 4100), (2, 9000), (70, 24)]:
        x = rng.standard_normal(shape).astype(xd)
        w = np.ones(shape[1], pd)
        b = np.zeros(shape[1], pd)
        for T in (1, 2):
            y, mean, rstd = cynorm.layer_norm_forward(x, w, b, num_threads=T)
            cynorm.layer_norm_backward(x, x, mean, rstd, w, num_threads=T)
            yr, r = cynorm.rms_norm_forward(x, w, num_threads=T)
            cynorm.rms_norm_backward(x, x, r, w, num_threads=T)
x = rng.standard_normal((4, 64)).astype(np.float32)
x[1, 3] = np.nan
x[2] = 3e38
cynorm.layer_norm(x)
print("valgrind run: done")
