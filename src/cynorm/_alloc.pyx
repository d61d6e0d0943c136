# cython: language_level=3
"""Output arrays for large results, on 2 MiB-aligned transparent huge pages.

Why: a fresh array's 4 KiB pages cost ~1.5 us each to fault in and zero on
the machines we measure on -- more, for some shapes, than the kernel itself
(include/cn_alloc.h has the numbers). The arrays made here own their memory
through a NumPy allocator (NEP 49), so they behave like any other array.
Freed ones are kept, up to a limit, for the next output of the same size
(recycling: its pages are faulted in already). Built with baseline flags:
safe to import on any CPU.
"""

import os

cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef extern from "cn_alloc.h":
    int cn_huge_available()
    size_t cn_recycle_keep(char *head, size_t cap) nogil
    size_t cn_recycle_set_limit(size_t limit) nogil
    size_t cn_recycle_limit_now() nogil
    size_t cn_recycled_now() nogil
    int cn_last_recycled
    int cn_set_fake_page(size_t page)
    size_t cn_huge_header_of(const void *ptr)

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

#: Freed outputs kept for reuse, in MiB, unless CYNORM_RECYCLE_MB says otherwise
DEFAULT_RECYCLE_MB = 256


def _recycle_bytes_from_env():
    text = os.environ.get("CYNORM_RECYCLE_MB", "").strip()
    if not text:
        return DEFAULT_RECYCLE_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0 or mb > 1 << 40:
        raise ValueError(f"cynorm: CYNORM_RECYCLE_MB must be a number of MiB >= 0 (0: keep nothing), got {text!r}")
    return int(mb * (1 << 20))


def set_recycle_limit(nbytes):
    """Keep at most `nbytes` of freed outputs for reuse (0: none); gives back
    what is kept beyond that now. Returns the bytes given back."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"cynorm: the recycle limit must be >= 0 bytes, got {nbytes}")
    return cn_recycle_set_limit(nbytes)


def recycle_limit():
    """The bytes of freed outputs that may be kept for reuse."""
    return cn_recycle_limit_now()


def recycled_bytes():
    """The bytes of freed outputs kept for reuse right now."""
    return cn_recycled_now()


def release_recycled():
    """Give every kept output back to the OS (the limit stays); returns the bytes."""
    return cn_recycle_keep(NULL, 0)


def last_recycled():
    """Did this thread's last huge-page output reuse a kept one (pages already in)?"""
    return bool(cn_last_recycled)


_from_env = _recycle_bytes_from_env()   # (checked even where unused: a typo never hides)
set_recycle_limit(_from_env if enabled else 0)

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



def _fake_page_size(nbytes):
    """Tests only: make new outputs' headers `nbytes` long, as on a kernel with
    pages that large (0: the OS's page again). Mappings made before keep theirs."""
    if not cn_set_fake_page(int(nbytes)):
        raise ValueError(f"cynorm: a fake page size must be 0 or a power of two from the OS's page to 2 MiB, got {nbytes}")


def _header_bytes(cnp.ndarray a):
    """Tests only: the header before an array made by empty() (the page it was made with)."""
    return cn_huge_header_of(cnp.PyArray_DATA(a))
