#!/usr/bin/env python3
"""Compile cynorm's C for other operating systems with `zig cc` (PyPI: ziglang).

    python tools/compile_check.py [TARGET ...] [--headers DIR] [--setup-only]
    python tools/compile_check.py --fetch-headers DIR     # then --headers DIR

Per target, meson.build is configured with a cross file whose C compiler is
zig's clang for that target (its tables stay the one source of the levels,
their flags and cn_tables.h), then ninja compiles every C object that meson
builds there (fwd.c/bwd.c per level and kernel, level.c per level, _core's
policy.c, reference.c, xla.c) at -O1. Checked too: the levels built are those
of meson.build's table for the target (meson drops a level whose flags the
compiler refuses, with a mere warning); every C command has no FP contraction.

The Cython output (_core, _alloc; host cython) is compiled with the target's
headers from --headers DIR: DIR/<target>/python (CPython's Include/ and that
platform's pyconfig.h), DIR/<target>/numpy (numpy/_core/include of its wheel),
optional DIR/<target>/omp/omp.h (then also with -fopenmp). --fetch-headers gets
NumPy's from PyPI's wheels, Windows' PC/pyconfig.h and Include/ from Debian's
CPython source package; no macOS pyconfig.h comes from either (configure writes
it on a Mac): the macOS targets skip the Cython output, and say so.

x86_64-windows-msvc (not a default) is clang-cl, MSVC syntax: --setup-only checks
its flags; compiling needs the MSVC CRT/SDK headers, which zig does not ship.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[1]
# zig target: meson's host_machine system and cpu_family
TARGETS = {'aarch64-macos': ('darwin', 'aarch64'), 'x86_64-macos': ('darwin', 'x86_64'),
           'x86_64-windows-gnu': ('windows', 'x86_64'), 'x86_64-windows-msvc': ('windows', 'x86_64')}
DEFAULT_TARGETS = ['aarch64-macos', 'x86_64-macos', 'x86_64-windows-gnu']
NUMPY_PLATFORMS = {'aarch64-macos': ['macosx_11_0_arm64', 'macosx_14_0_arm64'], 'x86_64-windows-gnu': ['win_amd64'],
                   'x86_64-macos': ['macosx_10_9_x86_64', 'macosx_14_0_x86_64']}


def tool(name):
    """meson, ninja, cython: next to this Python first (a venv run without activating it)."""
    return shutil.which(name, path=f'{Path(sys.executable).parent}{os.pathsep}{os.environ.get("PATH", "")}')


def table_levels(cpu_family, msvc):
    """The levels of meson.build's isa_levels that a build for cpu_family compiles."""
    text = (ROOT / 'meson.build').read_text()
    lists = {m[1]: re.findall(r"'(\w+)'", m[2]) for m in re.finditer(r"^(\w+) = \[([^\]\n]*)\]$", text, re.M)}
    table = re.search(r"^isa_levels = \[\n(.*?)^\]", text, re.M | re.S)[1]
    names = []
    for m in re.finditer(r"\{'name': '(\w+)', 'arch': (\w+|\[[^\]]*\])(.*?)\}", table, re.S):
        arch = lists[m[2]] if m[2] in lists else re.findall(r"'(\w+)'", m[2])
        if (not arch or cpu_family in arch) and (not msvc or "'msvc':" in m[3]):
            names.append(m[1])
    assert names and names[0] == 'baseline', 'meson.build: no isa_levels table found'
    return names


def cross_file(build, target):
    system, cpu = TARGETS[target]
    zig = [sys.executable, '-m', 'ziglang']
    build.mkdir(parents=True)
    if target.endswith('-msvc'):   # meson knows clang-cl by its name: wrappers called so
        lib = re.search(r'\.lib_dir = "(.*)"', run(zig + ['env']).stdout)[1]
        for name, cmd in (('clang-cl', zig + ['clang', '--driver-mode=cl', '--target=x86_64-pc-windows-msvc',
                                              f'/imsvc{lib}/include']), ('lld-link', zig + ['lld-link'])):
            (build / name).write_text(f'#!/bin/sh\nexec {shlex.join(cmd)} "$@"\n')
            (build / name).chmod(0o755)
        binaries = {'c': str(build / 'clang-cl'), 'c_ld': str(build / 'lld-link'), 'ar': zig + ['lib']}
    else:
        binaries = {'c': zig + ['cc', '-target', target], 'ar': zig + ['ar']}
    # meson's python module reads this (host) Python: fine for cn_tables.h and the C units,
    # not for the Cython output's headers, which check() swaps for the target's
    binaries.update(python=sys.executable, cython=tool('cython'))
    lines = ['[binaries]'] + [f'{k} = {v!r}' for k, v in binaries.items()]
    # the sanity checks build a program and Cython's compiles Python.h (the host's pyconfig.h)
    lines += ['[properties]', 'skip_sanity_check = true', '[host_machine]', f"system = '{system}'",
              f"cpu_family = '{cpu}'", f"cpu = '{cpu}'", "endian = 'little'"]
    write(build / 'cross.ini', '\n'.join(lines + ['']).encode())
    return build / 'cross.ini'


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def tail(text, n=30):
    """The error lines of a compiler's output (the first n), else its last n lines."""
    lines = text.strip().splitlines()
    return '\n'.join([ln for ln in lines if ' error: ' in ln or ln.startswith('FAILED:')][:n] or lines[-n:])


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def check(target, build, headers, setup_only):
    """True if every unit compiled (and the tables and flags are as meson.build says)."""
    r = run([tool('meson'), 'setup', '--cross-file', str(cross_file(build, target)), '-Doptimization=1',
             str(build / 'b'), str(ROOT)])
    if r.returncode:
        print(f'{target}: meson setup failed\n{tail(r.stdout + r.stderr)}')
        return False
    b = build / 'b'
    built = re.search(r'CN_FOR_EACH_BUILT_LEVEL\(X\) (.*)', (b / 'cn_tables.h').read_text())[1]
    built = re.findall(r'X\((\w+)\)', built)
    want = table_levels(TARGETS[target][1], target.endswith('-msvc'))
    ok = built == want
    print(f'{target}: levels built {" ".join(built)}'
          + ('' if ok else f' -- ERROR: meson.build\'s table has {" ".join(want)} for this target'))
    entries = json.loads((b / 'compile_commands.json').read_text())
    c_units = [e for e in entries if e['file'].endswith('.c') and not e['file'].endswith('.pyx.c')]
    no_contract = '/clang:-ffp-contract=off' if target.endswith('-msvc') else '-ffp-contract=off'
    loose = [e['output'] for e in entries if e['file'].endswith('.c') and no_contract not in shlex.split(e['command'])]
    if loose:
        ok = False
        print(f'{target}: ERROR: {len(loose)} C commands lack {no_contract}, e.g. {loose[0]}')
    if setup_only:
        return ok
    t0 = time.time()
    r = run([tool('ninja'), '-k', '0'] + [e['output'] for e in c_units], cwd=b)
    log = r.stdout + r.stderr
    print(f'{target}: {len(c_units)} C units compiled in {time.time() - t0:.0f}s: '
          f'{log.count(" error: ")} errors, {log.count(" warning: ")} warnings')
    if r.returncode:
        print(tail(log))
        return False
    return cython(target, b, entries, headers) and ok


def cython(target, b, entries, headers):
    """Compile the Cython output as meson would, with the target's Python and NumPy headers."""
    hdr = Path(headers or '/nonexistent') / target
    missing = [d for d in ('python/pyconfig.h', 'numpy/numpy/arrayobject.h') if not (hdr / d).exists()]
    if target.endswith('-msvc') or missing:
        why = 'no MSVC CRT headers' if target.endswith('-msvc') else f'no {hdr / missing[0]}'
        print(f'{target}: Cython output (_core, _alloc) not compiled: {why}')
        return True
    r = run([tool('ninja')] + [e['output'] for e in entries if e['file'].endswith('.pyx')], cwd=b)
    if r.returncode:
        print(f'{target}: cython failed\n{tail(r.stdout + r.stderr)}')
        return False
    # -DMS_WIN64: meson's python dependency adds it for a 64-bit Windows Python < 3.12 (harmless after)
    win = ['-DMS_WIN64='] if TARGETS[target][0] == 'windows' else []
    swap = {'-I' + sysconfig.get_paths()['include']: ['-I' + str(hdr / 'python')] + win,
            '-I' + numpy.get_include(): ['-I' + str(hdr / 'numpy')]}
    omp = hdr / 'omp'
    variants = [('serial', [])] + ([('openmp', ['-fopenmp', f'-I{omp}'])] if (omp / 'omp.h').exists() else [])
    ok = True
    for e in (e for e in entries if e['file'].endswith('.pyx.c')):
        argv = [a for arg in shlex.split(e['command']) for a in swap.get(arg, [arg])]
        assert all(a[2:] not in (sysconfig.get_paths()['include'], numpy.get_include()) for a in argv), argv
        for name, extra in variants:
            t0 = time.time()
            r = run(argv + extra + ['-fdiagnostics-color=never'], cwd=b)
            log = r.stdout + r.stderr
            print(f'{target}: {Path(e["file"]).name} ({name}) compiled in {time.time() - t0:.0f}s: '
                  f'{log.count(" error: ")} errors, {log.count(" warning: ")} warnings')
            if r.returncode:
                print(tail(log))
                ok = False
    return ok


def fetch_headers(dest):
    """NumPy's headers from its wheels (PyPI) for each target; Windows' Python headers from Debian."""
    pyver = f'{sys.version_info[0]}.{sys.version_info[1]}'
    for target, platforms in NUMPY_PLATFORMS.items():
        out = dest / target / 'numpy'
        with tempfile.TemporaryDirectory() as tmp:
            r = run([sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--only-binary=:all:', '-d', tmp,
                     '--python-version', pyver, f'numpy=={numpy.__version__}']
                    + [f'--platform={p}' for p in platforms])
            wheels = list(Path(tmp).glob('*.whl'))
            if r.returncode or not wheels:
                print(f'{target}: no NumPy {numpy.__version__} wheel\n{tail(r.stderr, 5)}')
                continue
            with zipfile.ZipFile(wheels[0]) as z:
                for m in filter(None, (re.match(r'numpy/(?:_core|core)/include/(.+[^/])$', n) for n in z.namelist())):
                    write(out / m[1], z.read(m[0]))
            print(f'{target}: {out} from {wheels[0].name}')
    # MinGW-w64's GCC has libgomp's omp.h, as this machine's GCC (the OpenMP variant of the Cython output)
    omp = Path(run(['gcc', '-print-file-name=include/omp.h']).stdout.strip() if shutil.which('gcc') else 'omp.h')
    if omp.is_absolute() and omp.exists():
        write(dest / 'x86_64-windows-gnu' / 'omp' / 'omp.h', omp.read_bytes())
    # CPython's source has Windows' pyconfig.h (PC/pyconfig.h); Debian's source package of it
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / 'lists' / 'partial').mkdir(parents=True)
        release = re.search(r'VERSION_CODENAME=(\w+)', Path('/etc/os-release').read_text())
        (Path(tmp) / 'src.list').write_text('deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] '
                                            f'http://deb.debian.org/debian {release and release[1]} main\n')
        o = [f'-oDir::Etc::SourceList={tmp}/src.list', '-oDir::Etc::SourceParts=/dev/null',
             f'-oDir::State::Lists={tmp}/lists', f'-oDir::Cache={tmp}', '-oAPT::Sandbox::User=root']
        if shutil.which('apt-get') and run(['apt-get', *o, 'update']).returncode == 0:
            run(['apt-get', *o, 'source', '--download-only', f'python{pyver}'], cwd=tmp)
        tars = list(Path(tmp).glob(f'python{pyver}_*.orig.tar.*'))
        if not tars:
            print(f'x86_64-windows-gnu: no Debian source of python{pyver}: no Windows Python headers')
            return
        out = dest / 'x86_64-windows-gnu' / 'python'
        with tarfile.open(tars[0]) as tar:
            for m in tar.getmembers():
                parts = m.name.split('/', 2)
                if m.isfile() and len(parts) == 3 and (parts[1] == 'Include' or parts[1:] == ['PC', 'pyconfig.h']):
                    write(out / (parts[2] if parts[1] == 'Include' else 'pyconfig.h'), tar.extractfile(m).read())
        print(f'x86_64-windows-gnu: {out} from {tars[0].name} (Include/, PC/pyconfig.h)')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('targets', nargs='*', default=DEFAULT_TARGETS, metavar='TARGET', help=', '.join(TARGETS))
    ap.add_argument('--headers', metavar='DIR', default=os.environ.get('CYNORM_TARGET_HEADERS'),
                    help='DIR/<target>/{python,numpy,omp} (default: $CYNORM_TARGET_HEADERS)')
    ap.add_argument('--fetch-headers', metavar='DIR', help='fill DIR for --headers and exit')
    ap.add_argument('--setup-only', action='store_true', help='meson setup and the table and flag checks only')
    ap.add_argument('--keep', metavar='DIR', help='build here (kept) instead of in a temporary folder')
    args = ap.parse_args()
    if set(args.targets) - set(TARGETS):
        ap.error(f'unknown target (the targets: {", ".join(TARGETS)}; default: {" ".join(DEFAULT_TARGETS)})')
    if args.fetch_headers:
        return fetch_headers(Path(args.fetch_headers).resolve())
    missing = [t for t in ('meson', 'ninja', 'cython') if not tool(t)]
    if missing or run([sys.executable, '-m', 'ziglang', 'version']).returncode:
        sys.exit(f'compile_check: needs {", ".join(missing) or "ziglang"} (pip install ziglang meson ninja cython)')
    failed = []
    for target in args.targets:
        with tempfile.TemporaryDirectory(prefix=f'cn-{target}-') as tmp:
            build = Path(args.keep or tmp) / target
            shutil.rmtree(build, ignore_errors=True)
            if not check(target, build, args.headers, args.setup_only):
                failed.append(target)
    print(f'compile_check: {"FAILED: " + " ".join(failed) if failed else "all targets OK"}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
