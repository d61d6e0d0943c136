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
