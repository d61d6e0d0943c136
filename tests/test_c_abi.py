"""The C API's compatibility rule (include/cynorm.h): the function table only
grows, so an extension module built against ABI version k runs with any cynorm
whose table has version >= k, and is refused, with ImportError, by an older one.
Checked with real extension modules, compiled here against copies of cynorm.h
that say another version, and imported in a fresh interpreter."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import cynorm
from cynorm import _core

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None or not os.path.exists(os.path.join(sysconfig.get_paths()["include"],
                                                                              "Python.h")),
                                reason="no C compiler or Python headers here (an install without build tools)")

MODULE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "cynorm.h"

/* (the ABI version the module was built for, the table's version, block_rows(1000, 300, f32)) */
static PyObject *check(PyObject *self, PyObject *args)
{
    const cynorm_api *api = cynorm_import();
    if (api == NULL) return NULL;
    return Py_BuildValue("iiL", CYNORM_ABI_VERSION, api->abi_version,
                         (long long)api->block_rows(1000, 300, CYNORM_F32));
}
static PyMethodDef methods[] = {{"check", check, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "abi_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_abi_probe(void) { return PyModule_Create(&def); }
"""


def _header_at(version):
    """cynorm.h as a header of this ABI version would have it: the version, and the
    table's functions up to that version (the table only grows)."""
    text = open(os.path.join(cynorm.get_include(), "cynorm.h")).read()
    current = int(re.search(r"#define CYNORM_ABI_VERSION (\d+)", text).group(1))
    text = text.replace(f"#define CYNORM_ABI_VERSION {current}", f"#define CYNORM_ABI_VERSION {version}")
    for v in range(version + 1, current + 1):   # functions added after `version`
        text = re.sub(rf"\n[^\n]*/\* ABI {v} \*/", "", text)
    return text


def _build_and_run(tmp_path, version):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "cynorm.h").write_text(_header_at(version))
    src = tmp_path / "abi_probe.c"
    src.write_text(MODULE)
    out = tmp_path / ("abi_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([CC, "-shared", "-fPIC", "-O1", f"-I{inc}", f"-I{sysconfig.get_paths()['include']}",
                    str(src), "-o", str(out)], check=True, capture_output=True, text=True)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import abi_probe; print(abi_probe.check())
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_module_built_for_an_older_abi_runs(tmp_path):
    r = _build_and_run(tmp_path, 1)
    assert r.returncode == 0, r.stderr
    built_for, table, block = eval(r.stdout.strip())
    assert built_for == 1 and table >= 2
    assert block == _core.block_rows(1000, 300, 4)


def test_a_module_built_for_this_abi_runs(tmp_path):
    current = int(re.search(r"#define CYNORM_ABI_VERSION (\d+)",
                            open(os.path.join(cynorm.get_include(), "cynorm.h")).read()).group(1))
    r = _build_and_run(tmp_path, current)
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout.strip())[:2] == (current, current)


def test_a_module_built_for_a_newer_abi_is_refused(tmp_path):
    r = _build_and_run(tmp_path, 99)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "version 99 or later" in r.stderr
