#!/usr/bin/env bash
# The aarch64 CI job, on an x86_64 Debian host: set up the cross compiler, qemu
# and an aarch64 Python (setup.sh), cross-build this tree, then run under
# qemu-aarch64 with a real aarch64 Python:
#   1. the golden hashes at every level built for aarch64 (baseline, neon), and
#      the core contract tests (levels, special values, short rows, tables, GroupNorm);
#   2. the output-memory tests on a 64 KiB-page kernel (qemu -p 65536).
# The whole suite passes there too (tools/aarch64/README.md says how to run it;
# about 15 minutes under qemu on 2 cores).
#   AARCH64_DIR  where setup.sh keeps its files (default: a fresh temporary dir)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
export AARCH64_DIR=${AARCH64_DIR:-$(mktemp -d)/aarch64}
t0=$SECONDS
python -m pip install -q meson ninja cython    # the host's build tools (the target's python is emulated)
"$HERE/setup.sh"
"$HERE/build.sh" "$AARCH64_DIR/build" "$AARCH64_DIR/pkg" > "$AARCH64_DIR/build.log" 2>&1 \
  || { tail -50 "$AARCH64_DIR/build.log"; exit 1; }
echo "[aarch64] set up and built in $((SECONDS - t0)) s"
export AARCH64_PYTHONPATH=$AARCH64_DIR/pkg
cd "$SRC"
"$AARCH64_DIR/py" -c "import cynorm, platform; assert platform.machine() == 'aarch64'; cfg = cynorm.show_config(); \
assert cfg['isa'] == 'neon', 'the neon level is not built or not available'"
t1=$SECONDS
"$AARCH64_DIR/py" -m pytest -p no:cacheprovider -q tests/test_golden.py tests/test_isa.py tests/test_special.py \
  tests/test_short_rows.py tests/test_tables.py tests/test_group_norm.py
echo "[aarch64] golden and core tests in $((SECONDS - t1)) s"
t2=$SECONDS
QEMU_EXTRA_ARGS="-p 65536" "$AARCH64_DIR/py" -c "import os; assert os.sysconf('SC_PAGE_SIZE') == 65536"
QEMU_EXTRA_ARGS="-p 65536" "$AARCH64_DIR/py" -m pytest -p no:cacheprovider -q tests/test_memory.py
echo "[aarch64] 64 KiB pages: memory tests in $((SECONDS - t2)) s; job $((SECONDS - t0)) s"
