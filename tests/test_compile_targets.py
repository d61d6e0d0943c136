"""The C sources compile for macOS (arm64, x86_64) and Windows with zig's clang
(tools/compile_check.py): meson.build configures for each target, builds the
levels of its table there with their flags and no FP contraction, and every C
unit compiles. The Cython output too where the target's Python and NumPy
headers are at $CYNORM_TARGET_HEADERS (tools/compile_check.py --fetch-headers).

The configure checks take seconds; the full compiles about a minute per target
on two cores, so they are opt-in (pytest -m slow tests/test_compile_targets.py).
x86_64-windows-msvc (clang-cl) is configured only: zig ships no MSVC headers."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "compile_check.py")
COMPILED = ["aarch64-macos", "x86_64-macos", "x86_64-windows-gnu"]


def _missing():
    """What the check needs and this environment lacks (meson, ninja and cython are build requirements)."""
    missing = [] if importlib.util.find_spec("ziglang") else ["ziglang (pip install ziglang)"]
    bindir = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return missing + [name for name in ("meson", "ninja", "cython") if not shutil.which(name, path=bindir)]


pytestmark = [
    pytest.mark.skipif(not os.path.exists(SCRIPT), reason="tools/ is not next to the tests (an installed copy)"),
    pytest.mark.skipif(bool(_missing()), reason="the cross-compile check needs " + ", ".join(_missing())),
]


def _check(*args, timeout):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compile_check: all targets OK" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.parametrize("target", COMPILED + ["x86_64-windows-msvc"])
def test_meson_configures_the_target_with_its_levels_and_no_contraction(target):
    out = _check("--setup-only", target, timeout=300)
    assert f"{target}: levels built baseline" in out


@pytest.mark.slow
@pytest.mark.parametrize("target", COMPILED)
def test_every_c_unit_compiles_for_the_target(target):
    out = _check(target, timeout=1200)
    assert " 0 errors" in out and " C units compiled" in out, out
