"""Check the ELF imports of a repaired cynorm wheel (tools/wheel_check.sh runs it).

    python tools/wheel_abi.py WHEEL

For each extension module (cynorm/*.so) and each vendored library
(cynorm.libs/*): prints the newest GLIBC_ version it needs and the symbols that
need it, and the GOMP_/OMP_ symbols it imports. Fails (exit 1) when
  - an extension module imports a symbol with no version that is not Python's
    (Py*, _Py*) and not weak: linked against an older glibc's stubs (or an older
    libgomp), a function that they lack stays unversioned -- the wheel's tag
    would not say so, and the import would fail there (e.g. getrandom, glibc
    2.25; GOMP_loop_maybe_nonmonotonic_runtime_start, GCC 9's libgomp);
  - an extension module imports a GOMP_/OMP_/GOACC_ symbol at a version that the
    vendored libgomp does not define (the libgomp comes from elsewhere than the
    compiler: every entry point the compiler emitted must be there, at that version).
Reads `objdump -T` (binutils).
"""
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# objdump -T: "ADDR FLAGS SECTION<TAB>SIZE VERSION NAME"; VERSION is "Base" when the
# symbol has none, "(V)" for a reference or a hidden version, "V" for a default one
LINE = re.compile(r"^[0-9a-f]+ (?P<flags>.{7}) (?P<sec>\S+)\t[0-9a-f]+\s+(?P<ver>\S+)\s+(?P<name>\S+)$")
OPENMP = ("GOMP_", "OMP_", "GOACC_")


def dynsyms(path):
    """[(defined, weak, version or None, name)] of one ELF file's dynamic symbol table."""
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    syms = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        ver = m["ver"].strip("()")
        syms.append((m["sec"] != "*UND*", "w" in m["flags"], None if ver == "Base" else ver, m["name"]))
    return syms


def glibc_key(ver):
    return tuple(int(p) for p in ver.split("_", 1)[1].split("."))


def report(path, syms):
    """Print the newest GLIBC_ version one file imports (with its symbols) and its OpenMP imports."""
    imports = [(v, n) for d, _, v, n in syms if not d and v]
    glibc = [(v, n) for v, n in imports if v.startswith("GLIBC_")]
    if glibc:
        top = max((v for v, _ in glibc), key=glibc_key)
        names = sorted(n for v, n in glibc if v == top)
        print(f"  {path.name}: newest glibc {top}: {' '.join(names)}")
    else:
        print(f"  {path.name}: no versioned glibc imports")
    omp = sorted(f"{n}@{v}" for v, n in imports if v.startswith(OPENMP))
    if omp:
        print(f"    OpenMP imports: {' '.join(omp)}")


def main(wheel):
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        root = Path(tmp)
        modules = sorted(root.glob("cynorm/*.so"))
        vendored = sorted(p for p in root.glob("cynorm.libs/*") if p.is_file())
        gomp = [p for p in vendored if p.name.startswith("libgomp")]
        if not modules:
            errors.append("no extension modules in cynorm/")
        if len(gomp) != 1:
            errors.append(f"expected one vendored libgomp, found {[p.name for p in gomp]}")
        omp_defined = {(v, n) for d, _, v, n in dynsyms(gomp[0]) if d and v} if len(gomp) == 1 else set()
        print(f"ELF imports of {Path(wheel).name}:")
        for path in modules + vendored:
            syms = dynsyms(path)
            if not syms:   # an objdump whose format LINE does not read: fail, not pass unchecked
                errors.append(f"{path.name}: no dynamic symbols read from objdump -T")
                continue
            report(path, syms)
            if path not in modules:
                continue
            for defined, weak, ver, name in syms:
                if defined:
                    continue
                if ver is None and not weak and not name.startswith(("Py", "_Py")):
                    errors.append(f"{path.name}: {name} has no symbol version (not in the glibc or the libgomp it was linked against?)")
                if ver is not None and ver.startswith(OPENMP) and (ver, name) not in omp_defined:
                    errors.append(f"{path.name}: {name}@{ver} is not defined by the vendored {gomp[0].name if gomp else 'libgomp'}")
    for e in errors:
        print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
