"""Thread counts.

cynorm's kernels are OpenMP parallel regions. The default thread count is the
OpenMP runtime's ``omp_get_max_threads()``, so the usual controls steer it:
``OMP_NUM_THREADS`` and ``threadpoolctl.threadpool_limits(n, user_api="openmp")``.
``num_threads=k`` on a call caps that call only. Small inputs run on the
calling thread whatever is asked (min_elems_per_thread in the policy, cynorm.explain()).
"""

import operator

from . import _isa

#: Refuse absurd requests instead of asking the OS for a million threads.
MAX_THREADS = 1024


def get_num_threads():
    """Threads a call with ``num_threads=None`` may use (``omp_get_max_threads()``)."""
    return _isa.kernels.max_threads()


def resolve_num_threads(num_threads):
    """Validate a ``num_threads`` argument; None means get_num_threads()."""
    if num_threads is None:
        return _isa.kernels.max_threads()
    if isinstance(num_threads, bool):
        raise TypeError("num_threads must be an int >= 1 or None, got a bool")
    try:
        n = operator.index(num_threads)
    except TypeError:
        raise TypeError(f"num_threads must be an int >= 1 or None, got {type(num_threads).__name__}") from None
    if n < 1:
        raise ValueError(f"num_threads must be >= 1 (or None for the default), got {n}")
    if n > MAX_THREADS:
        raise ValueError(f"num_threads={n} is above cynorm's limit of {MAX_THREADS}")
    return n
