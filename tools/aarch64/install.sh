#!/usr/bin/env bash
# Install a cross build's python package(s) into PKG (the dir given to
# build.sh; meson's python.platlibdir/purelibdir point there).
#   usage: install.sh BUILD PKG
set -euo pipefail
(($# == 2)) || { echo "usage: $0 BUILD PKG" >&2; exit 2; }
BUILD=$(realpath "$1"); PKG=$(realpath -m "$2")
export PATH="${HOST_VENV:+$HOST_VENV/bin:}$PATH"
cur=$(meson introspect "$BUILD" --buildoptions | python3 -c 'import json,sys; print({o["name"]: o["value"] for o in json.load(sys.stdin)}["python.platlibdir"])')
if [[ $cur != "$PKG" ]]; then   # another PKG than configured: point the build there
  meson configure "$BUILD" -Dpython.platlibdir="$PKG" -Dpython.purelibdir="$PKG" >/dev/null
fi
# start clean: the packages this build installs (top-level dirs under PKG)
meson introspect "$BUILD" --installed | python3 -c '
import json, os, sys
pkg = sys.argv[1]
tops = {os.path.relpath(d, pkg).split(os.sep)[0] for d in json.load(sys.stdin).values() if d.startswith(pkg + os.sep)}
print("\n".join(sorted(tops)))' "$PKG" | while read -r t; do [[ -n $t ]] && rm -rf "${PKG:?}/$t"; done
meson install -C "$BUILD" --quiet   # (rebuilds/regenerates first if needed)
# a minimal .dist-info (what a wheel install would add), from the source tree's
# pyproject.toml [project] and meson's project version, so that
# importlib.metadata.version(<name>) works for the assembled package
SRC=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' "$BUILD/meson-info/meson-info.json")
VERSION=$(meson introspect "$BUILD" --projectinfo | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
if [[ -f $SRC/pyproject.toml ]]; then
  python3 - "$SRC/pyproject.toml" "$VERSION" "$PKG" <<'PYEOF'
import os, re, shutil, sys, tomllib
pyproject, version, pkg = sys.argv[1:]
proj = tomllib.load(open(pyproject, "rb")).get("project", {})
name = proj.get("name")
if name:
    norm = re.sub(r"[-_.]+", "_", name).lower()
    for d in os.listdir(pkg):   # drop stale dist-infos of this project
        if d.lower().startswith(norm + "-") and d.endswith(".dist-info"):
            shutil.rmtree(os.path.join(pkg, d))
    di = os.path.join(pkg, f"{norm}-{version}.dist-info")
    os.makedirs(di)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if proj.get("description"):
        lines.append(f"Summary: {proj['description']}")
    if proj.get("requires-python"):
        lines.append(f"Requires-Python: {proj['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in proj.get("dependencies", [])]
    for extra, deps in proj.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    open(os.path.join(di, "METADATA"), "w").write("\n".join(lines) + "\n")
    open(os.path.join(di, "INSTALLER"), "w").write("tools/aarch64/install.sh\n")
PYEOF
fi
echo "[install] $PKG: $(cd "$PKG" && ls -d */ | tr '\n' ' ')" >&2
