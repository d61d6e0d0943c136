"""The README's Python examples run as written (doctest blocks are checked)."""

import doctest
import importlib.util
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
needs_readme = pytest.mark.skipif(not os.path.exists(README),
                                  reason="README.md is not next to the tests (a copy of tests/ alone)")
#: the optional extras a README example may import, by module
EXTRAS = {"jax": "jax", "dask": "dask", "onnx": "onnx"}


def _blocks():
    if not os.path.exists(README):
        return []
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@needs_readme
def test_the_readme_has_its_examples():
    blocks = _blocks()
    assert len(blocks) >= 5
    for module in EXTRAS:   # one example per framework module
        assert any(f"cynorm.{module}" in code for code in blocks), module


@needs_readme
@pytest.mark.parametrize("code", _blocks(), ids=lambda code: code.splitlines()[0][:40])
def test_readme_python_example_runs(code):
    for module, extra in EXTRAS.items():
        if f"cynorm.{module}" in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"the {extra} extra is not installed (pip install 'cynorm[{extra}]')")
    if ">>>" in code:
        test = doctest.DocTestParser().get_doctest(code, {"np": __import__("numpy"),
                                                          "cynorm": __import__("cynorm")}, "README", README, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test)
        assert runner.failures == 0, code
    else:
        exec(compile(code, README, "exec"), {})
