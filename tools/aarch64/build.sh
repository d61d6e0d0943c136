#!/usr/bin/env bash
# Cross-build this source tree for aarch64 (meson, Debian's aarch64-linux-gnu-gcc,
# the target python introspected under qemu) and install the package into PKG.
#   usage: tools/aarch64/build.sh BUILD PKG [extra `meson setup` args...]
# Then: AARCH64_PYTHONPATH=PKG $AARCH64_DIR/py -c "import cynorm; cynorm.show_config()"
# Needs tools/aarch64/setup.sh first, and meson, ninja and cython on PATH.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
TOP=${AARCH64_DIR:-$HOME/.cache/cynorm-aarch64}
(($# >= 2)) || { echo "usage: $0 BUILD PKG [meson setup args...]" >&2; exit 2; }
BUILD=$(realpath -m "$1"); PKG=$(realpath -m "$2"); shift 2
[[ -f $TOP/cross.ini && -x $TOP/py ]] || { echo "run tools/aarch64/setup.sh first" >&2; exit 1; }
opts=(-Dbuildtype=release -Dpython.platlibdir="$PKG" -Dpython.purelibdir="$PKG" "$@")
if [[ -f $BUILD/meson-private/coredata.dat ]]; then
  meson setup --reconfigure "$BUILD" "$SRC" "${opts[@]}"
else
  meson setup "$BUILD" "$SRC" --cross-file "$TOP/cross.ini" "${opts[@]}"
fi
ninja -C "$BUILD"
"$HERE/install.sh" "$BUILD" "$PKG"
