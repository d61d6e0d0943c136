"""``python -m cynorm.tune``: measure this machine's policy once and keep it (cynorm.tune()).

The module is callable, so ``cynorm.tune()`` is the same function whether or not
this module has been imported by name."""

import sys
import types

from . import _tune


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return _tune.tune(*args, **kwargs)


tune = _tune.tune
main = _tune.main
sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    main()
