"""Build cynorm's extension modules.

The kernels in src/cynorm/_kernels.pxi are compiled once per ISA level, each
with its own flags; cynorm._isa picks one at import time from the CPU's
features. No build file tunes for the build machine's own CPU (no "native"
-march), so a wheel runs on any CPU of its architecture.

Environment knobs (all optional):
  CYNORM_NO_OPENMP=1          build without OpenMP (serial kernels)
  CYNORM_SANITIZE=address,undefined
                              build with those -fsanitize= checks (tools/sanitize.sh)
  CYNORM_DEBUG=1              -O1 -g instead of -O3
  CYNORM_BUILD_LEVELS=baseline,avx512_bf16
                              build only these ISA levels (development; the
                              baseline is always built)
"""

import os
import platform
import sys
import tempfile
import textwrap

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join("src", "cynorm")
INCLUDE = os.path.join(SRC, "include")

IS_X86 = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}

# ISA level -> compiler flags (gcc/clang, MSVC). The baseline has none: on
# x86-64 that is SSE2, elsewhere the compiler's default for the target.
ISA_FLAGS = {
    "baseline": ([], []),
    "avx2": (["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "avx512": (
        ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
        ["/arch:AVX512"],
    ),
    "avx512_bf16": (
        ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
        None,  # MSVC has no switch for AVX512_BF16
    ),
}
LEVELS = ["baseline", "avx2", "avx512", "avx512_bf16"] if IS_X86 else ["baseline"]
if os.environ.get("CYNORM_BUILD_LEVELS", "").strip():
    _wanted = {"baseline"} | {lvl.strip() for lvl in os.environ["CYNORM_BUILD_LEVELS"].split(",")}
    LEVELS = [lvl for lvl in LEVELS if lvl in _wanted]


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in {"", "0", "false", "no"}


class BuildExt(build_ext):
    """Chooses flags per compiler, probes OpenMP and ISA support, builds in parallel."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def _compiles(self, code, extra_compile, extra_link=()):
        """Try to compile and link a small C program with the given flags."""
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write(code)
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=list(extra_compile))
                self.compiler.link_executable(objs, os.path.join(tmp, "probe"), extra_postargs=list(extra_link))
                return True
            except Exception:
                return False

    def _openmp_flags(self):
        """(compile, link) flags for OpenMP, or None for a serial build."""
        if _env_flag("CYNORM_NO_OPENMP"):
            return None
        ctype = self.compiler.compiler_type
        if ctype == "msvc":
            candidates = [(["/openmp"], [])]
        elif sys.platform == "darwin":
            # Apple clang needs the runtime from elsewhere (llvm-openmp / libomp)
            candidates = [(["-Xpreprocessor", "-fopenmp"], ["-lomp"]), (["-fopenmp"], ["-fopenmp"])]
        else:
            candidates = [(["-fopenmp"], ["-fopenmp"])]
        code = textwrap.dedent(
            """
            #include <omp.h>
            int main(void) { int n = 0;
            #pragma omp parallel reduction(+:n)
              n += 1;
              return n > 0 ? 0 : 1; }
            """
        )
        for cflags, lflags in candidates:
            if self._compiles(code, cflags, lflags):
                return cflags, lflags
        return None

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        msvc = ctype == "msvc"
        if msvc:
            base = ["/O2", "/fp:precise"]
        else:
            debug = _env_flag("CYNORM_DEBUG")
            # -ffp-contract=off: FMAs only where the code asks for them, so every
            # copy of an inlined formula rounds the same way (determinism).
            # -fno-wrapv: Python's CFLAGS carry -fwrapv, which blocks loop optimizations the
            # kernels rely on (measured: medium-row forward 5-10% slower with it); our C has
            # no signed overflow (UBSan runs over the suite: tools/sanitize.sh).
            base = ["-O1" if debug else "-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-wrapv", "-std=c11",
                    "-Wno-unused-function", "-Wno-unreachable-code"]
            base.append("-g" if debug else "-g0")  # Python's CFLAGS carry -g
            if debug:
                base.append("-DCN_NO_FORCE_INLINE")
        san_compile, san_link = [], []
        sanitize = os.environ.get("CYNORM_SANITIZE", "").strip()
        if sanitize and not msvc:
            san_compile = [f"-fsanitize={sanitize}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g",
                           "-DCN_NO_FORCE_INLINE"]
            san_link = [f"-fsanitize={sanitize}"]

        omp = self._openmp_flags()
        if omp is None:
            print("cynorm: OpenMP not available (or CYNORM_NO_OPENMP set): building serial kernels",
                  file=sys.stderr)
            omp = ([], [])

        kept = []
        for ext in self.extensions:
            prefix = "cynorm._kernels_"
            level = ext.name[len(prefix):] if ext.name.startswith(prefix) else None
            ext.extra_compile_args = list(base) + san_compile
            ext.extra_link_args = list(san_link)
            if level is not None:
                gcc_flags, msvc_flags = ISA_FLAGS[level]
                isa = msvc_flags if msvc else gcc_flags
                if isa is None or (isa and not self._compiles("int main(void){return 0;}\n", isa)):
                    print(f"cynorm: compiler cannot target {level}; skipping that level", file=sys.stderr)
                    continue
                ext.extra_compile_args += isa + omp[0]
                ext.extra_link_args += omp[1]
            kept.append(ext)
        self.extensions = kept
        super().build_extensions()


def _extensions():
    common = dict(
        include_dirs=[numpy.get_include(), INCLUDE],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    )
    exts = [Extension(f"cynorm.{name}", [os.path.join(SRC, f"{name}.pyx")], **common) for name in ("_cpuinfo", "_alloc")]
    for level in LEVELS:
        exts.append(Extension(f"cynorm._kernels_{level}", [os.path.join(SRC, f"_kernels_{level}.pyx")], **common))
    return cythonize(
        exts,
        include_path=["src"],
        # (directives here, not in _kernels.pxi: Cython ignores them in included files)
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        nthreads=os.cpu_count() or 1,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
