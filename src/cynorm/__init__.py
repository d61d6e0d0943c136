"""cynorm: fast, exact LayerNorm and RMSNorm kernels for NumPy arrays on the CPU.

    >>> import numpy as np, cynorm
    >>> x = np.random.rand(8, 512).astype(np.float32)
    >>> y, mean, rstd = cynorm.layer_norm_forward(x, np.ones(512, np.float32))
    >>> dx, dw, db = cynorm.layer_norm_backward(np.ones_like(x), x, mean, rstd, np.ones(512, np.float32))

See show_config() for the ISA level and threads in use, explain() for how a call runs,
and tune() to measure this machine's policy once.
"""

from ._version import __version__
from ._api import (
    explain,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)
from ._fused import add_layer_norm_backward, add_layer_norm_forward, add_rms_norm_backward, add_rms_norm_forward
from ._group import (
    group_norm,
    group_norm_backward,
    group_norm_forward,
    instance_norm,
    instance_norm_backward,
    instance_norm_forward,
)
from ._alloc import release_recycled
from ._config import show_config
from ._threads import get_num_threads
from . import _tune
from ._tune import tune

_tune.load_at_import()   # this machine's measured policy, where one is cached (CYNORM_POLICY)


def get_include():
    """The directory of cynorm.h, cynorm's C entry point, for building extension modules against it."""
    import os
    return os.path.join(os.path.dirname(__file__), "include")

__all__ = [
    "__version__",
    "layer_norm",
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_forward",
    "rms_norm_backward",
    "add_layer_norm_forward",
    "add_layer_norm_backward",
    "add_rms_norm_forward",
    "add_rms_norm_backward",
    "group_norm",
    "group_norm_forward",
    "group_norm_backward",
    "instance_norm",
    "instance_norm_forward",
    "instance_norm_backward",
    "show_config",
    "release_recycled",
    "get_num_threads",
    "explain",
    "tune",
    "get_include",
]
