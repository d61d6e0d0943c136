"""meson.build's tables (ISA levels, dtype kernels, dtype pairs), as the build
compiled them and as Python sees them: one source, consistent everywhere."""

import os
import re

import numpy as np
import pytest

import cynorm
from cynorm import _core, _dtypes, _isa

TABLES = _core.tables()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESON = os.path.join(ROOT, "meson.build")


def test_every_level_needs_features_the_cpu_check_knows():
    known = set(TABLES["cpu_features"])
    for row in TABLES["levels"]:
        assert set(row["features"]) <= known, row
        assert set(row["caps"]) <= {"multirow_stream", "hw_bf16"}, row


def test_levels_in_python_are_the_tables():
    names = [row["name"] for row in TABLES["levels"]]
    assert list(_isa.LEVELS) == names
    assert names[0] == "baseline" and TABLES["levels"][0]["features"] == []
    assert _isa.compiled_levels() == [row["name"] for row in TABLES["levels"] if row["built"]]
    assert "baseline" in _isa.compiled_levels()
    # a later level needs at least what an earlier one of its family needs (the preference order)
    for lvl in _isa.available_levels():
        assert _isa.REQUIRED_FEATURES[lvl] <= _isa.cpu_features()
    assert _isa.level == (os.environ.get(_isa.ENV_VAR) or _isa.available_levels()[-1])


def test_pairs_and_kernels_agree_with_the_dtypes_module():
    kernels = {k["dtype"]: k for k in TABLES["kernels"]}
    assert [k["code"] for k in TABLES["kernels"]] == [_dtypes.CODES[np.dtype(k["dtype"])] for k in TABLES["kernels"]]
    assert len(_dtypes.PAIRS) == len(TABLES["pairs"])
    for code, (x, p) in enumerate(TABLES["pairs"]):
        pair = _dtypes.PAIRS[(np.dtype(x), np.dtype(p))]
        assert pair.code == code and pair.grad == np.dtype(p)
        assert pair.stat == np.dtype(kernels[x]["acc"])
    # the first pair of each x is the no-params default
    for x, p in _dtypes.DEFAULT_PARAM.items():
        assert next(q for xx, q in TABLES["pairs"] if np.dtype(xx) == x) == str(p)


def test_the_c_entry_point_numbers_dtypes_as_cynorm_h():
    header = open(os.path.join(cynorm.get_include(), "cynorm.h")).read()
    enum = dict((name, int(v)) for name, v in re.findall(r"CYNORM_(F32|F64|BF16|F16) = (\d+)", header))
    for k in TABLES["kernels"]:
        assert enum[k["name"].upper()] == k["code"], k


@pytest.mark.skipif(not os.path.exists(MESON), reason="meson.build is not next to the tests (an installed copy)")
def test_the_tables_come_from_meson_build():
    """The names in meson.build's tables are the compiled ones, in the same order:
    no other list of levels, kernels or pairs exists to drift from them."""
    text = open(MESON).read()
    levels = re.search(r"\nisa_levels = \[(.*?)\n\]", text, re.S).group(1)
    assert re.findall(r"\{'name': '(\w+)'", levels) == list(_isa.LEVELS)
    kernels = re.search(r"\ndtype_kernels = \[(.*?)\n\]", text, re.S).group(1)
    assert re.findall(r"'dtype': '(\w+)'", kernels) == [k["dtype"] for k in TABLES["kernels"]]
    pairs = re.search(r"\ndtype_pairs = (\[.*?\])\n", text).group(1)
    by_name = {k["name"]: k["dtype"] for k in TABLES["kernels"]}
    assert [tuple(by_name[n] for n in p) for p in eval(pairs)] == TABLES["pairs"]
