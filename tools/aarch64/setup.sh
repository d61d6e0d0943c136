#!/usr/bin/env bash
# Set up an aarch64 cross-build + qemu-user emulation environment on an x86_64
# Debian bookworm host, without multiarch-installing anything arm64 on the host
# (python3:arm64 through multiarch would remove the amd64 python).
#
#   AARCH64_DIR  where everything goes (default: ~/.cache/cynorm-aarch64):
#                sysroot/, site/, py (the aarch64 python under qemu), cross.ini
#   SYSROOT   aarch64 root filesystem (Debian arm64 .debs unpacked with dpkg -x)
#             default: $AARCH64_DIR/sysroot
#   SITE      target dir for aarch64 wheels (numpy, ml_dtypes, pytest, ...)
#             default: $SYSROOT/../site
#   HOST_VENV host venv whose numpy/ml_dtypes/pytest versions are mirrored
#             (default: the python running meson; none: the newest)
#   REFRESH=1 re-run the private `apt-get update` and re-download wheels
#
# Idempotent: re-running only redoes what is missing. Nothing arm64 is installed
# into the host's dpkg database: the arm64 package lists live in a private apt
# state dir ($TOP/apt), used only for `apt-get download`.
set -euo pipefail

TOP=${AARCH64_DIR:-$HOME/.cache/cynorm-aarch64}
mkdir -p "$TOP"
TOP=$(cd "$TOP" && pwd)
SYSROOT=${SYSROOT:-$TOP/sysroot}
mkdir -p "$SYSROOT"
SYSROOT=$(cd "$SYSROOT" && pwd)
SITE=${SITE:-$(cd "$SYSROOT/.." && pwd)/site}
HOST_VENV=${HOST_VENV:-${VIRTUAL_ENV:-}}
REFRESH=${REFRESH:-0}
PYVER=3.11

log() { printf '[setup] %s\n' "$*" >&2; }

# ---------------------------------------------------------------- 1. host tools
need=()
for p in gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" || { apt-get update && apt-get install -y --no-install-recommends "${need[@]}"; }
fi

# ------------------------------------------------- 2. private arm64 apt + sysroot
APTDIR=$TOP/apt
mkdir -p "$APTDIR"/state/lists/partial "$APTDIR"/cache/archives/partial \
         "$APTDIR"/sources.list.d "$APTDIR"/preferences.d "$TOP"/debs
touch "$APTDIR/state/status"
# the host's Debian sources (deb822), without any Architectures: restriction
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  grep -v '^Architectures:' /etc/apt/sources.list.d/debian.sources > "$APTDIR/sources.list.d/debian.sources"
else
  printf 'deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
    > "$APTDIR/sources.list.d/debian.list"
fi
cat > "$APTDIR/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
Dir::State "$APTDIR/state";
Dir::State::status "$APTDIR/state/status";
Dir::Cache "$APTDIR/cache";
Dir::Etc::SourceList "/dev/null";
Dir::Etc::SourceParts "$APTDIR/sources.list.d";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$APTDIR/preferences.d";
APT::Sandbox::User "root";
EOF
aptx() { APT_CONFIG="$APTDIR/apt.conf" "$@"; }
if [[ $REFRESH = 1 ]] || ! compgen -G "$APTDIR/state/lists/*Packages*" >/dev/null; then
  log "private arm64 apt-get update"
  aptx apt-get update -q >/dev/null
fi

# python3.11 + its stdlib's shared-library deps (the Depends closure of
# python3.11 / python3.11-dev minus perl, dpkg, tar, libc6-dev, *-dev), the
# headers for cross-compiling extensions, and the OpenMP / C++ runtimes.
PKGS=(
  libc6 libgcc-s1 gcc-12-base libstdc++6 libgomp1
  python3.11 python3.11-minimal libpython3.11 libpython3.11-minimal libpython3.11-stdlib
  python3.11-dev libpython3.11-dev
  zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libzstd1 libsqlite3-0 libuuid1
  libncursesw6 libtinfo6 libreadline8 readline-common libdb5.3 libgdbm6 libgdbm-compat4
  libcrypt1 libnsl2 libtirpc3 libtirpc-common libgssapi-krb5-2 libkrb5-3 libk5crypto3
  libkrb5support0 libcom-err2 libkeyutils1 libselinux1 libpcre2-8-0 libacl1 libmd0
  media-types tzdata
)
stamp=$SYSROOT/.pkgs
want=$(printf '%s\n' "${PKGS[@]}" | sort)
if [[ ! -f $stamp ]] || [[ "$(cat "$stamp")" != "$want" ]] || [[ $REFRESH = 1 ]]; then
  ( cd "$TOP/debs"
    missing=()
    for p in "${PKGS[@]}"; do compgen -G "${p}_*_arm64.deb" >/dev/null || compgen -G "${p}_*_all.deb" >/dev/null || missing+=("$p"); done
    if ((${#missing[@]})); then log "apt-get download ${#missing[@]} arm64 packages"; aptx apt-get download -q "${missing[@]}" >/dev/null; fi
    for p in "${PKGS[@]}"; do
      for f in "${p}"_*_arm64.deb "${p}"_*_all.deb; do [[ -f $f ]] && dpkg -x "$f" "$SYSROOT"; done
    done )
  # absolute symlinks would resolve on the host (qemu -L only redirects the
  # paths the guest opens): make them relative to their place in the sysroot
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    [[ $t = /* ]] || continue
    ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$SYSROOT$t")" "$l"
  done < <(find "$SYSROOT" -type l -print0)
  echo "$want" > "$stamp"
  log "sysroot ready: $SYSROOT"
fi

# Build-time paths in the target's sysconfig data (INCLUDEPY=/usr/include/python3.11,
# LIBDIR, ...) name TARGET paths; meson adds INCLUDEPY as -I, and on this host
# /usr/include/python3.11 holds the x86_64 headers. Point them into the sysroot
# (idempotent: only values still starting with /usr/ are rewritten).
for f in "$SYSROOT"/usr/lib/python$PYVER/_sysconfigdata_*.py; do
  python3 - "$f" "$SYSROOT" <<'PYEOF'
import re, sys
path, root = sys.argv[1], sys.argv[2]
keys = "INCLUDEPY CONFINCLUDEPY INCLUDEDIR CONFINCLUDEDIR LIBDIR LIBPL LIBPC".split()
src = open(path).read()
new = re.sub(r"('(?:%s)': ')(/usr/)" % "|".join(keys), lambda m: m.group(1) + root + m.group(2), src)
if new != src:
    open(path, "w").write(new)
PYEOF
done

# ------------------------------------------------------------ 3. python wrappers
# $SYSROOT/usr/bin/python3: a HOST-executable script that runs the aarch64
# python3.11 under qemu with argv[0] set to itself (-0), so the guest's
# sys.executable is this script and subprocess([sys.executable, ...]) works
# without binfmt_misc. Prefix detection still finds $SYSROOT/usr/lib/python3.11.
cat > "$SYSROOT/usr/bin/python3" <<EOF
#!/bin/sh
# generated by $TOP/setup.sh: aarch64 python$PYVER under qemu-user
exec qemu-aarch64 \${QEMU_EXTRA_ARGS:-} -L "$SYSROOT" -0 "\$0" "$SYSROOT/usr/bin/python$PYVER" "\$@"
EOF
chmod +x "$SYSROOT/usr/bin/python3"

# the guest's "native" C compiler: code run under qemu that compiles extension
# modules (tests using $CC + sysconfig include dir) must get the cross compiler,
# which runs directly (qemu-user passes exec of host binaries to the host kernel).
mkdir -p "$TOP/bin"
for pair in "aarch64-cc:gcc" "aarch64-c++:g++"; do
  cat > "$TOP/bin/${pair%%:*}" <<EOF
#!/bin/sh
# generated by $TOP/setup.sh: cross ${pair#*:} that finds the sysroot's python headers
exec aarch64-linux-gnu-${pair#*:} -isystem "$SYSROOT/usr/include" "\$@"
EOF
  chmod +x "$TOP/bin/${pair%%:*}"
done

# $TOP/py: the user-facing wrapper; puts $SITE (then any AARCH64_PYTHONPATH,
# then the caller's PYTHONPATH) on the path. Used as meson's `python` too.
cat > "$TOP/py" <<EOF
#!/bin/sh
# generated by $TOP/setup.sh: run the aarch64 python (qemu-user) with the aarch64 site dir
# AARCH64_PYTHONPATH=dir[:dir]  goes in FRONT of the site dir (e.g. a built package)
pp="$SITE"
[ -n "\${AARCH64_PYTHONPATH:-}" ] && pp="\$AARCH64_PYTHONPATH:\$pp"
[ -n "\${PYTHONPATH:-}" ] && pp="\$pp:\$PYTHONPATH"
unset PYTHONHOME VIRTUAL_ENV
# a host CC (x86_64) would be exec'd natively from the guest: give it the cross one
export CC="\${AARCH64_CC:-$TOP/bin/aarch64-cc}" CXX="\${AARCH64_CXX:-$TOP/bin/aarch64-c++}"
PYTHONPATH="\$pp" PYTHONNOUSERSITE=1 exec "$SYSROOT/usr/bin/python3" "\$@"
EOF
chmod +x "$TOP/py"

# ---------------------------------------------------------- 4. aarch64 wheels
hostver() { [[ -x $HOST_VENV/bin/python ]] && "$HOST_VENV/bin/python" - "$1" <<'EOF' 2>/dev/null || true
import sys
from importlib.metadata import version
try: print(version(sys.argv[1]))
except Exception: pass
EOF
}
spec() {  # name==<host venv version>, or name if the host venv lacks it
  local v; v=$(hostver "$1"); [[ -n $v ]] && echo "$1==$v" || echo "$1"; }
REQS=(numpy ml_dtypes pytest threadpoolctl hypothesis iniconfig pluggy packaging)
WHEELS=$TOP/wheels
mkdir -p "$WHEELS"
PLAT=()
for t in manylinux2014_aarch64 manylinux_2_17_aarch64 manylinux_2_24_aarch64 manylinux_2_27_aarch64 \
         manylinux_2_28_aarch64 manylinux_2_31_aarch64 manylinux_2_34_aarch64 manylinux_2_35_aarch64 linux_aarch64; do
  PLAT+=(--platform "$t"); done
PYH=$HOST_VENV/bin/python
[[ -x $PYH ]] || PYH=$(command -v python3)
TGT=(--only-binary=:all: "${PLAT[@]}" --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none)
specs=(); for r in "${REQS[@]}"; do specs+=("$(spec "$r")"); done
if [[ $REFRESH = 1 ]] || [[ ! -f $SITE/.reqs ]] || [[ "$(cat "$SITE/.reqs")" != "${specs[*]}" ]]; then
  log "pip download (aarch64 cp311): ${specs[*]}"
  if ! "$PYH" -m pip download -q --disable-pip-version-check "${TGT[@]}" -d "$WHEELS" "${specs[@]}"; then
    # a host-venv version with no aarch64 wheel: fall back to the same major.minor
    log "exact host versions unavailable for aarch64; retrying with ~= major.minor"
    specs=(); for r in "${REQS[@]}"; do v=$(hostver "$r"); [[ -n $v ]] && specs+=("$r~=${v%.*}.0") || specs+=("$r"); done
    "$PYH" -m pip download -q --disable-pip-version-check "${TGT[@]}" -d "$WHEELS" "${specs[@]}"
  fi
  # resolve + install from the downloaded wheels only (pip install --target
  # with --platform/--python-version installs wheels for the aarch64 python)
  rm -rf "$SITE"; mkdir -p "$SITE"
  "$PYH" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" "${TGT[@]}" \
    --no-compile --target "$SITE" "${specs[@]}"
  echo "${specs[*]}" > "$SITE/.reqs"
  log "site ready: $SITE"
fi

# ------------------------------------------------------------ 5. meson cross file
CROSS=${CROSS:-$TOP/cross.ini}
cat > "$CROSS" <<EOF
# generated by $TOP/setup.sh -- aarch64-linux-gnu cross build, target python under qemu
[constants]
sysroot = '$SYSROOT'

[binaries]
c = 'aarch64-linux-gnu-gcc'
cpp = 'aarch64-linux-gnu-g++'
ar = 'aarch64-linux-gnu-ar'
strip = 'aarch64-linux-gnu-strip'
pkg-config = 'false'
# the TARGET interpreter (meson's python module introspects it: ext suffix,
# include dir = $SYSROOT/usr/include/python$PYVER, numpy from $SITE)
python = '$TOP/py'
python3 = '$TOP/py'
exe_wrapper = ['qemu-aarch64', '-L', sysroot]

[built-in options]
# Debian's <python3.11/pyconfig.h> is a stub that includes <aarch64-linux-gnu/python3.11/pyconfig.h>
c_args = ['-isystem', sysroot / 'usr/include']
cpp_args = ['-isystem', sysroot / 'usr/include']

[properties]
needs_exe_wrapper = true

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'aarch64'
endian = 'little'
EOF

