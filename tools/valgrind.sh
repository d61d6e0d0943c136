#!/usr/bin/env bash
# valgrind memcheck on a short run of the installed cynorm (tools/valgrind_run.py).
# valgrind cannot decode AVX-512, so the run uses the avx2 level (override with
# CYNORM_ISA=baseline). PYTHONMALLOC=malloc makes CPython's allocations visible.
set -euo pipefail
cd "$(dirname "$0")"
export CYNORM_ISA=${CYNORM_ISA:-avx2}
PYTHONMALLOC=malloc valgrind --tool=memcheck --error-exitcode=3 --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    --suppressions=valgrind-python.supp \
    "${PYTHON:-python3}" valgrind_run.py
