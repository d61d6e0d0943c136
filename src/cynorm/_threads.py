"""Thread counts.

cynorm's kernels are OpenMP parallel regions. The default thread count is the
OpenMP runtime's ``omp_get_max_threads()``, so the usual controls steer it:
``OMP_NUM_THREADS`` and ``threadpoolctl.threadpool_limits(n, user_api="openmp")``.
``num_threads=k`` on a call caps that call only. Small inputs run on the
calling thread whatever is asked (min_elems_per_thread in the policy, cynorm.explain()).
"""

from . import _checks, _isa

#: Refuse absurd requests instead of asking the OS for a million threads.
MAX_THREADS = _checks.MAX_THREADS


def get_num_threads():
    """Threads a call with ``num_threads=None`` may use (``omp_get_max_threads()``)."""
    return _isa.kernels.max_threads()


def resolve_num_threads(num_threads):
    """Validate a ``num_threads`` argument; None means get_num_threads()."""
    n = _checks.num_threads(num_threads)
    return _isa.kernels.max_threads() if n is None else n
