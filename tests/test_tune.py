"""cynorm.tune(): the decision rule, the cache file and its key, CYNORM_POLICY,
and what explain() and show_config() say. (Timing belongs to the benchmarks:
here the clock is a fake one wherever a decision is made; benchmarks/README.md
has what tune() chose on each machine.)"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cynorm
from cynorm import _core, _tune


@pytest.fixture
def clean_policy():
    yield
    _core.set_class_tunables({})
    _tune.loaded = None


def _fake_clock(times):
    """A `measure` for _tune.decide: the time of whatever setting is installed now."""
    def measure(fn, budget, cls):
        return times[_core.tunables(cls)["prefetch_max"]]
    return measure


CLS = _core.class_of(False, 0, 4096, 4096, 1)


@pytest.mark.parametrize("alt_time, kept", [(0.90, 0), (0.99, 8192), (1.10, 8192)])
def test_an_alternative_is_kept_only_where_it_wins_beyond_noise(clean_policy, alt_time, kept):
    times = {8192: 1.0, 0: alt_time}

    def install(cls, values):
        _core.set_class_tunables({cls: values} if values else {})
    value, ratios = _tune.decide(lambda: None, CLS, "prefetch_max", {}, install, 3, 0.0, _fake_clock(times))
    assert value == kept
    assert ratios[0] == pytest.approx(alt_time)
    assert _core.tunables(CLS)["prefetch_max"] == kept


def test_a_win_that_does_not_repeat_is_not_kept(clean_policy):
    calls = []

    def measure(fn, budget, cls):   # the alternative wins the first comparison only
        calls.append(_core.tunables(cls)["prefetch_max"])
        fast = _core.tunables(cls)["prefetch_max"] == 0 and len(calls) <= 6
        return 0.8 if fast else 1.0

    def install(cls, values):
        _core.set_class_tunables({cls: values} if values else {})
    value, ratios = _tune.decide(lambda: None, CLS, "prefetch_max", {}, install, 3, 0.0, measure)
    assert value == 8192 and ratios[0] == pytest.approx(1.0)
    assert len(calls) == 12   # two comparisons of 3 rounds x 2 settings


@pytest.mark.parametrize("guard_time, kept", [(1.10, 8192), (1.02, 0), (0.95, 0)])
def test_an_alternative_that_slows_a_guard_cell_is_not_kept(clean_policy, guard_time, kept):
    """prefetch_max=0 wins 10% on the deciding cell; a guard cell (a small array of the
    same class) vetoes it when it loses more than the margin there."""
    def main():
        pass

    def guard():
        pass

    def measure(fn, budget, cls):
        off = _core.tunables(cls)["prefetch_max"] == 0
        return (0.9 if off else 1.0) if fn is main else (guard_time if off else 1.0)

    def install(cls, values):
        _core.set_class_tunables({cls: values} if values else {})
    value, ratios = _tune.decide(main, CLS, "prefetch_max", {}, install, 3, 0.0, measure, guards=[guard])
    assert value == kept
    assert ratios[0] == pytest.approx(guard_time if kept else 0.9)


def test_an_alternative_that_leaves_the_policy_as_it_is_is_not_timed(clean_policy):
    """A decision the call cannot feel (its whole cn_policy the same under both values)
    is not timed, so noise cannot pick it: rows of 1024 take the row path whatever
    part_cache_bytes is (their partials are small); rows of 200704 feel it."""
    from cynorm import _api
    timed = []

    def measure(fn, budget, cls):
        timed.append(_core.tunables(cls)["part_cache_bytes"])
        return 0.5 if _core.tunables(cls)["part_cache_bytes"] == _tune.NEVER else 1.0

    def install(cls, values):
        _core.set_class_tunables({cls: values} if values else {})
    default = _core.tunables(-1)["part_cache_bytes"]
    for shape, felt in (((16384, 1024), False), ((64, 200704), True)):
        x, w = np.empty(shape, np.float32), np.ones(shape[1], np.float32)
        cls = _core.class_of(True, 0, shape[0], shape[1], 1)
        policy_of = lambda: _api._policy_of(x, w, -1, 1, "layer_norm", True, None, every_field=True)[0]  # noqa: E731
        timed.clear()
        value, ratios = _tune.decide(lambda: None, cls, "part_cache_bytes", {}, install, 3, 0.0, measure,
                                     policy_of=policy_of)
        assert (value, bool(timed), bool(ratios)) == ((_tune.NEVER, True, True) if felt else (default, False, False))
        assert _core.tunables(cls)["part_cache_bytes"] == value


def test_guard_cells_are_in_their_representatives_class():
    for rows, shapes in _tune.CELLS.items():
        for bwd in (False, True):
            for pair in (0, 2):
                for threads in (1, 2):
                    classes = {_core.class_of(bwd, pair, s[0], s[1], threads) for s in shapes}
                    assert len(classes) == 1, (rows, shapes)


def test_tune_writes_applies_and_keys_its_policy(clean_policy, tmp_path, monkeypatch):
    """The whole of tune() with small cells and a fake clock under which prefetching
    costs 10% everywhere: every class that measures prefetch_max keeps 0."""
    monkeypatch.setattr(_tune, "CELLS", SMALL_CELLS)

    def prefetch_costs(fn, budget, cls):
        fn()
        return 1.1 if _core.tunables(cls)["prefetch_max"] else 1.0
    path = tmp_path / "policy.json"
    policy = _tune.tune(1, threads=2, path=str(path), progress=False, _measure=prefetch_costs)
    on_disk = json.loads(path.read_text())
    assert on_disk["key"] == _tune.machine_key() == policy["key"]
    assert on_disk["measured"] == policy["measured"]
    prefetching = [c for (d, r), names in _tune.PLAN.items() if "prefetch_max" in names
                   for c in _core.class_names() if c.startswith(d) and _ROWS[r] in c]
    assert sorted(policy["measured"]) == sorted(prefetching)
    assert all(v == {"prefetch_max": 0} for v in policy["measured"].values())
    for name, values in policy["measured"].items():
        assert _core.tunables(_core.class_names().index(name))["prefetch_max"] == 0
    assert cynorm.show_config()["policy"]["tuned"]


_ROWS = {"short": "rows of <= 64,", "medium": "<= 8 KB", "rows": "<= 64 KB", "long": "longer rows"}
SMALL_CELLS = {"short": [(4096, 56), (8, 56)], "medium": [(64, 1024), (8, 128)], "rows": [(16, 4096)],
               "long": [(8, 40000)]}   # (8 rows: at 2 threads the long-row path, which prefetch_max steers)


def test_tune_measures_the_short_row_lead_on_32_bit_rows_alone(clean_policy, tmp_path, monkeypatch):
    """The kinds disagree on the forward's short-row prefetch lead (POLICY.md): tune()
    measures it in the short 32-bit forward classes, at 1 thread and at all threads,
    and nowhere else (16-bit short rows do not read it). Here the alternative to the
    value this machine resolves wins 10%."""
    monkeypatch.setattr(_tune, "CELLS", SMALL_CELLS)
    default = _core.tunables(-1)["short_prefetch_bytes"]
    alternative = _tune._OFF_OR_ON["short_prefetch_bytes"](default)[0]
    assert {default, alternative} == {0, 8 << 10}
    short_rows = np.empty((4096, 56), np.float32)
    ahead_before = cynorm.explain(short_rows, num_threads=1)["prefetch_rows_ahead"]
    seen = set()

    def alternative_wins(fn, budget, cls):
        fn()
        seen.add(_core.class_names()[cls])
        return 0.9 if _core.tunables(cls)["short_prefetch_bytes"] == alternative else 1.0
    policy = _tune.tune(1, threads=2, path=str(tmp_path / "p.json"), progress=False, _measure=alternative_wins)
    short = sorted(c for c in _core.class_names() if c.startswith("fwd 32/64-bit, rows of <= 64,"))
    assert len(short) == 2
    assert sorted(c for c, v in policy["measured"].items() if "short_prefetch_bytes" in v) == short
    assert all(policy["measured"][c] == {"short_prefetch_bytes": alternative} for c in short)
    assert not any("16-bit, rows of <= 64," in c for c in seen)
    for c in short:   # the forward's short 32-bit rows now take that lead
        assert _core.tunables(_core.class_names().index(c))["short_prefetch_bytes"] == alternative
    e = cynorm.explain(short_rows, num_threads=1)
    assert e["policy"]["measured"] == {"short_prefetch_bytes": alternative}
    assert e["prefetch_rows_ahead"] != ahead_before   # 16 rows (the next block) against 48 (8 KB of rows of 224 B)


def _python(code, **env):
    full = dict(os.environ)
    full.pop("CYNORM_POLICY", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=120)


SHOW = """
import json, numpy as np, cynorm
e = cynorm.explain(np.empty((4096, 4096), np.float32), num_threads=1)
print(json.dumps({"config": cynorm.show_config()["policy"], "explain": e["policy"],
                  "prefetch_max": e["tunables"]["prefetch_max"]}))
"""


def _write_policy(directory, key, measured):
    from cynorm._tune import cache_path
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / os.path.basename(cache_path(key))
    path.write_text(json.dumps({"key": key, "measured": measured}))
    return path


def test_import_loads_this_machines_cache_file_and_explain_says_so(tmp_path):
    cls = _core.class_names()[CLS]
    _write_policy(tmp_path / "cynorm", _tune.machine_key(), {cls: {"prefetch_max": 0}})
    r = _python(SHOW, XDG_CACHE_HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["config"]["tuned"] and got["config"]["source"] == "cache" and got["config"]["decisions"] == 1
    assert got["explain"]["class"] == cls and got["explain"]["measured"] == {"prefetch_max": 0}
    assert "prefetch_max" not in got["explain"]["defaults"] and "stream_min_bytes" in got["explain"]["defaults"]
    assert got["prefetch_max"] == 0
    # CYNORM_POLICY=off: the defaults
    r = _python(SHOW, XDG_CACHE_HOME=str(tmp_path), CYNORM_POLICY="off")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert not got["config"]["tuned"] and got["prefetch_max"] == 8192 and got["explain"]["measured"] == {}


def test_a_cache_file_for_another_machine_or_version_is_not_used(tmp_path):
    cls = _core.class_names()[CLS]
    for change in ({"version": "0.0.1"}, {"l3_bytes": 12345}, {"cpu_model": "another CPU"}):
        key = dict(_tune.machine_key(), **change)
        path = _write_policy(tmp_path / "cynorm", key, {cls: {"prefetch_max": 0}})
        os.replace(path, tmp_path / "cynorm" / os.path.basename(_tune.cache_path()))   # even under this name
        r = _python(SHOW, XDG_CACHE_HOME=str(tmp_path))
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert not got["config"]["tuned"] and got["prefetch_max"] == 8192, change


def test_cynorm_policy_names_a_file(tmp_path):
    cls = _core.class_names()[CLS]
    other = dict(_tune.machine_key(), cpu_model="another CPU")
    path = _write_policy(tmp_path, other, {cls: {"prefetch_max": 0}})
    r = _python(SHOW, CYNORM_POLICY=str(path), XDG_CACHE_HOME=str(tmp_path / "empty"))
    assert r.returncode == 0, r.stderr
    assert "measured on another machine" in r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["config"]["source"] == "CYNORM_POLICY" and got["prefetch_max"] == 0


@pytest.mark.parametrize("content", ["not json", json.dumps({"measured": {"no such class": {"prefetch_max": 0}}}),
                                     json.dumps({"measured": {"fwd 16-bit, rows of <= 8 KB, 1 thread": {"bwd_far_bytes": 0}}}),
                                     json.dumps([1, 2])])
def test_a_broken_policy_file_warns_and_leaves_the_defaults(tmp_path, content):
    path = tmp_path / "p.json"
    path.write_text(content)
    r = _python(SHOW, CYNORM_POLICY=str(path))
    assert r.returncode == 0, r.stderr
    assert "tuned policy not loaded" in r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert not got["config"]["tuned"] and got["prefetch_max"] == 8192


def test_the_module_and_the_function_are_one(tmp_path):
    import cynorm.tune as module
    assert callable(module) and callable(cynorm.tune)
    r = _python("import cynorm.tune, sys; sys.exit(0 if callable(cynorm.tune) else 1)")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "cynorm.tune", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--seconds" in r.stdout


def test_apply_names_unknown_tunables_and_changes_nothing():
    before = _core.tunables(0)
    with pytest.raises(ValueError, match=r"unknown tunables \['bwd_far_bytes'\]"):
        _tune.apply({"measured": {_core.class_names()[0]: {"bwd_far_bytes": 0, "prefetch_max": 0}}})
    assert _core.tunables(0) == before
