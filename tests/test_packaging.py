"""Version and packaging metadata agree with each other."""

import os
import re
import sys

import pytest

import cynorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")
RECIPE = os.path.join(ROOT, "recipe", "meta.yaml")

needs_sources = pytest.mark.skipif(
    not (os.path.exists(PYPROJECT) and os.path.exists(RECIPE)),
    reason="pyproject.toml and recipe/meta.yaml are not next to the tests (run from a source checkout or "
           "the conda test step, which copies them)")


def test_version_everywhere():
    from cynorm._version import __version__
    assert cynorm.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([a-z]+\d*)?", __version__)
    assert cynorm.show_config.__module__  # imported, callable
    from importlib.metadata import version
    assert version("cynorm") == __version__


def _pyproject():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def _recipe():
    text = open(RECIPE).read()
    sets = dict(re.findall(r'{%\s*set\s+(\w+)\s*=\s*"([^"]*)"\s*%}', text))
    run = re.search(r"\n  run:\n((?:    - .*\n)+)", text).group(1)
    deps = [line.strip()[2:].split("#")[0].strip() for line in run.splitlines()]
    return sets, deps, text


def _norm(req):
    name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


@needs_sources
def test_recipe_agrees_with_pyproject():
    meta = _pyproject()["project"]
    sets, run_deps, text = _recipe()
    assert sets["name"] == meta["name"]
    from cynorm._version import __version__
    assert sets["version"] == __version__, "recipe version differs from src/cynorm/_version.py"
    recipe_deps = {_norm(d) for d in run_deps if _norm(d)[0] != "python"}
    project_deps = {_norm(d) for d in meta["dependencies"]}
    assert recipe_deps == project_deps, f"run deps differ: recipe {recipe_deps} vs pyproject {project_deps}"
    assert "license_file: LICENSE" in text and f"license: {meta['license']}" in text
    build_reqs = _pyproject()["build-system"]["requires"]
    for req in build_reqs:
        name, _ = _norm(req)
        assert re.search(rf"\n    - {name}\b", text), f"host requirement {name} missing from the recipe"


@needs_sources
def test_version_single_source():
    meta = _pyproject()["project"]
    assert "version" in meta.get("dynamic", []), "pyproject must read the version from cynorm._version"


RECIPE_V1 = os.path.join(ROOT, "recipe", "recipe.yaml")


@needs_sources
def test_conda_recipe_follows_conda_forge_rules():
    """meta.yaml: the OpenMP runtime in host as well as build, an unpinned numpy
    in host, pip check and an OpenMP check in the tests, a build that fails
    without OpenMP, and the release source only (no local-file switch)."""
    _, _, text = _recipe()
    host = re.search(r"\n  host:\n((?:    - .*\n)+)", text).group(1)
    build = re.search(r"\n  build:\n((?:    - .*\n)+)", text).group(1)
    for runtime, selector in (("libgomp", "linux"), ("llvm-openmp", "osx")):
        for section in (host, build):
            assert re.search(rf"- {runtime}\s+# \[{selector}\]", section), (runtime, section)
    assert re.search(r"\n    - numpy\n", host), "numpy in host must be unpinned"
    assert "pip check" in text and "show_config()['openmp']" in text
    assert "-Dopenmp=enabled" in text
    assert "file://" not in text and "CYNORM_SDIST" not in text


@needs_sources
def test_v1_recipe_renders_for_native_and_cross_targets():
    """recipe.yaml (rattler-build's v1 format), rendered offline for a native and
    three cross targets (linux-aarch64, osx-arm64, win-64): the same dependencies and tests as meta.yaml and pyproject."""
    rb = pytest.importorskip("rattler_build", reason="py-rattler-build (in the [test] extra) is not installed")
    from rattler_build.render import RenderConfig
    from rattler_build.tool_config import PlatformConfig

    recipe = rb.Stage0Recipe.from_file(RECIPE_V1)
    assert recipe.to_dict()["build"]["skip"] == ['match(python, "<3.10")']
    meta = _pyproject()["project"]
    variants = rb.VariantConfig({"python": ["3.12"], "c_stdlib": ["sysroot"], "c_stdlib_version": ["2.17"]})
    # (win-64: MSVC's OpenMP runtime, vcomp, comes with the compiler's runtime)
    for target, runtime in (("linux-64", "libgomp"), ("linux-aarch64", "libgomp"), ("osx-arm64", "llvm-openmp"),
                            ("win-64", None)):
        (rendered,) = recipe.render(variants, RenderConfig(platform=PlatformConfig(target_platform=target)))
        d = rendered.recipe.to_dict()
        from cynorm._version import __version__
        assert d["package"] == {"name": meta["name"], "version": __version__}
        req = d["requirements"]
        for other in ("libgomp", "llvm-openmp"):
            wanted = other == runtime
            assert (other in req["build"] and other in req["host"]) == wanted, (target, other, req)
        assert "numpy" in req["host"]
        cross = target != "linux-64"
        assert (f"cross-python_{target}" in req["build"]) == cross, (target, req["build"])
        assert {_norm(r) for r in req["run"] if r != "python"} == {_norm(r) for r in meta["dependencies"]}
        assert "-Dopenmp=enabled" in d["build"]["script"]
        assert all(not s["url"].startswith("file:") for s in d["source"])
        scripts = [line for t in d["tests"] for line in t.get("script", [])]
        assert any("show_config()['openmp']" in line for line in scripts)
        assert any(t.get("python", {}).get("pip_check", True) for t in d["tests"] if "python" in t)


@needs_sources
def test_cibuildwheel_builds_every_classified_python_on_three_oses():
    """[tool.cibuildwheel] selects, per OS, a CPython wheel for every Python the
    classifiers list: Linux x86_64 and aarch64, macOS arm64 and x86_64, Windows
    AMD64; and its test command runs the golden hashes."""
    import subprocess
    import shutil

    exe = shutil.which("cibuildwheel") or pytest.skip("cibuildwheel (in the [test] extra) is not installed")
    meta = _pyproject()
    versions = [c.rsplit(" ", 1)[1].replace(".", "") for c in meta["project"]["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert "test_golden.py" in meta["tool"]["cibuildwheel"]["test-command"]
    for platform, archs in (("linux", ["manylinux_x86_64", "manylinux_aarch64"]),
                            ("macos", ["macosx_arm64", "macosx_x86_64"]), ("windows", ["win_amd64"])):
        r = subprocess.run([exe, "--print-build-identifiers", "--platform", platform, ROOT],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = set(r.stdout.split())
        want = {f"cp{v}-{a}" for v in versions for a in archs}
        assert got == want, (platform, sorted(got ^ want))


@needs_sources
def test_cibuildwheel_linux_images_match_the_checked_glibc_floor():
    """The manylinux images cibuildwheel builds in carry the glibc floor that
    tools/wheel_check.sh builds against and checks here (its default
    CYNORM_GLIBC_FLOOR): manylinux2014 is glibc 2.17, manylinux_2_X is 2.X."""
    linux = _pyproject()["tool"]["cibuildwheel"]["linux"]
    with open(os.path.join(ROOT, "tools", "wheel_check.sh")) as f:
        floor = re.search(r"^FLOOR=\$\{CYNORM_GLIBC_FLOOR:-(\d+\.\d+)\}", f.read(), re.M).group(1)
    named = {"manylinux2014": "2.17", "manylinux2010": "2.12", "manylinux1": "2.5"}
    for arch in ("x86_64", "aarch64"):
        image = linux[f"manylinux-{arch}-image"]
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)", image)
        glibc = f"{m.group(1)}.{m.group(2)}" if m else named.get(image)
        assert glibc == floor, (arch, image, floor)
