"""The README's Python examples run as written (doctest blocks are checked)."""

import doctest
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
needs_readme = pytest.mark.skipif(not os.path.exists(README),
                                  reason="README.md is not next to the tests (a copy of tests/ alone)")


def _blocks():
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@needs_readme
def test_readme_python_examples_run():
    blocks = _blocks()
    assert len(blocks) >= 2
    for code in blocks:
        if ">>>" in code:
            test = doctest.DocTestParser().get_doctest(code, {"np": __import__("numpy"),
                                                              "cynorm": __import__("cynorm")}, "README", README, 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test)
            assert runner.failures == 0, code
        else:
            exec(compile(code, README, "exec"), {})
