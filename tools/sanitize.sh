#!/usr/bin/env bash
# Build cynorm with AddressSanitizer + UndefinedBehaviorSanitizer (every ISA
# level) into a scratch virtualenv and run the test suite against it.
#
#   tools/sanitize.sh                 # the whole suite
#   tools/sanitize.sh -k determinism  # extra arguments go to pytest
#
# Python itself is not instrumented, so libasan is preloaded. Leak detection
# is off here (CPython keeps memory until exit); leaks are covered by the RSS
# test and by tools/valgrind.sh. Any ASan or UBSan report aborts the run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-${TMPDIR:-/tmp}/cynorm-sanitize}
PY=${PYTHON:-python3}

"$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "cython>=3.0.10" "numpy>=2" meson-python meson ninja ml_dtypes threadpoolctl pytest hypothesis
# a debug build (no forced inlining: minutes, not hours) with the sanitizers; Python's
# symbols resolve at load time, hence b_lundef=false
python -m pip install -q --no-build-isolation --force-reinstall --no-deps \
    -Csetup-args=-Dbuildtype=debug -Csetup-args=-Db_sanitize=address,undefined -Csetup-args=-Db_lundef=false "$ROOT"

export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
# A bounded quarantine (default 256 MB) keeps use-after-free detection for recent
# frees while letting RSS settle, so the RSS-growth test still means something.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=1:quarantine_size_mb=16
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd "${TMPDIR:-/tmp}"   # away from the source tree: test the installed build
python -m pytest "$ROOT/tests" -q -p no:cacheprovider "$@"
echo "sanitize: clean"
