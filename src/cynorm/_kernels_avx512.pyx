# cython: language_level=3
# The "avx512" build of the kernels: setup.py compiles this file with that ISA
# level's flags. All the code is in _kernels.pxi, shared by every level.
include "_kernels.pxi"
