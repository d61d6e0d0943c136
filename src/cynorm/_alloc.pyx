# cython: language_level=3
"""Output arrays for large results, on 2 MiB-aligned transparent huge pages.

Why: a fresh array's 4 KiB pages cost ~1.5 us each to fault in and zero on
the machines we measure on -- more, for some shapes, than the kernel itself
(include/cn_alloc.h has the numbers). The arrays made here own their memory
through a NumPy allocator (NEP 49), so they behave like any other array.
Built with baseline flags: safe to import on any CPU.
"""

import os

cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef extern from "cn_alloc.h":
    int cn_huge_available()

cdef extern from *:
    """
    #include "cn_alloc.h"
    static PyDataMem_Handler cn_huge_handler = {
        "cynorm_hugepages", 1,
        {NULL, cn_np_malloc, cn_np_calloc, cn_np_realloc, cn_np_free}
    };
    static PyObject *cn_huge_handler_capsule(void)
    {
        return PyCapsule_New(&cn_huge_handler, "mem_handler", NULL);
    }
    """
    object cn_huge_handler_capsule()
    object PyDataMem_SetHandler(object handler)

#: Outputs of at least this many bytes go on huge pages. Below ~1 MiB the
#: faults cost little, and a huge page (2 MiB, zeroed whole) would waste more
#: memory than the array holds.
MIN_BYTES = 1 << 20


def _wanted():
    flag = os.environ.get("CYNORM_HUGEPAGES", "1").strip().lower()
    return bool(cn_huge_available()) and flag not in {"0", "false", "no", "off"}


#: False where the OS has no mmap/madvise (not Linux) or CYNORM_HUGEPAGES=0
enabled = _wanted()

_handler = cn_huge_handler_capsule()
_np_empty = np.empty


def empty(shape, dtype):
    """np.empty(shape, dtype), its data on 2 MiB-aligned huge pages (when enabled)."""
    if not enabled:
        return _np_empty(shape, dtype)
    previous = PyDataMem_SetHandler(_handler)
    try:
        return _np_empty(shape, dtype)
    finally:
        PyDataMem_SetHandler(previous)

