"""The portable level's exact fp32 multiply-add (no FMA unit: double sums
rounded to odd, SSE2 on x86-64) against libm's fmaf, bit for bit, on crafted
double-rounding cases, float subnormal results and random operands."""

import os
import re
import shutil
import subprocess
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "src", "cynorm", "include")


@pytest.mark.skipif(not os.path.exists(os.path.join(INCLUDE, "cn_simd.h")),
                    reason="needs the source tree (src/cynorm/include) next to the tests")
@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="the emulation is x86-64's (CPUs without FMA); aarch64's portable level has the FMA")
def test_portable_multiply_add_is_fmaf(tmp_path):
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the check")
    # the generated cn_tables.h's part that cn_simd.h reads without a level: the sections' ids
    with open(os.path.join(ROOT, "meson.build")) as f:
        sections = re.findall(r"'(\w+)'", re.search(r"\nsimd_sections = \[(.*?)\]", f.read()).group(1))
    (tmp_path / "cn_tables.h").write_text('#include "cynorm.h"\n' + "".join(
        f"#define CN_SIMD_{s} {i}\n" for i, s in enumerate(sections)))
    exe = tmp_path / "fma_check"
    for flags in ([], ["-mno-fma", "-mno-avx"]):
        r = subprocess.run([cc, "-O2", "-std=c11", "-ffp-contract=off", "-fno-math-errno", *flags,
                            "-I", str(tmp_path), "-I", INCLUDE, os.path.join(ROOT, "tests", "c", "fma_check.c"),
                            "-o", str(exe), "-lm"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
        assert int(r.stdout.split()[1]) > 19_000_000
