#!/usr/bin/env bash
# valgrind memcheck on a short run of the installed cynorm (tools/valgrind_run.py),
# then a verdict on cynorm's own code: fails if any memcheck error or definite
# leak has a cynorm frame in its stack. (CPython itself reports a few errors
# and small definite leaks under memcheck; those are listed but not ours.)
# valgrind cannot decode AVX-512, so the run uses the avx2 level (override with
# CYNORM_ISA=baseline). PYTHONMALLOC=malloc makes Python's allocations visible.
set -euo pipefail
cd "$(dirname "$0")"
export CYNORM_ISA=${CYNORM_ISA:-avx2}
LOG=${LOG:-${TMPDIR:-/tmp}/cynorm-valgrind.log}
PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite \
    --num-callers=40 --log-file="$LOG" "${PYTHON:-python3}" valgrind_run.py
"${PYTHON:-python3}" - "$LOG" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
blocks = re.split(r"\n==\d+== \n", log)
kinds = r"(Conditional jump|Invalid read|Invalid write|Invalid free|uninitialised|definitely lost)"
errors = [b for b in blocks if re.search(kinds, b)]
ours = [b for b in errors if re.search(r"cynorm/_core|_alloc|\bcn_[a-z0-9_]+", b)]
summary = re.search(r"ERROR SUMMARY: .*", log)
print(f"valgrind: {len(errors)} error/leak reports in all, {len(ours)} with cynorm frames "
      f"({summary.group(0) if summary else 'no summary'}; log: {sys.argv[1]})")
for b in ours:
    print(b)
sys.exit(1 if ours else 0)
PY
