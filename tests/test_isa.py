"""ISA levels: selection, forcing, and bit-identical conversions on every level."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ml_dtypes import bfloat16

import cynorm
from cynorm import _isa
from conftest import LEVELS, assert_same_bits


def _python(code, **env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=120)


def test_show_config(capsys):
    cfg = cynorm.show_config()
    printed = capsys.readouterr().out
    for key in ("version", "isa", "isa_available", "openmp", "max_threads"):
        assert key in cfg
    assert cfg["version"] == cynorm.__version__
    assert cfg["isa_available"][0] == "baseline"
    assert cfg["isa"] in cfg["isa_available"]
    order = [_isa.LEVELS.index(lvl) for lvl in cfg["isa_available"]]
    assert order == sorted(order)
    assert isinstance(cfg["openmp"], bool) and cfg["max_threads"] >= 1
    assert cfg["isa"] in printed and cynorm.__version__ in printed


def test_long_row_group_budget_follows_the_l3():
    """A sixteenth of the L3, never below the 8 MB measured on 32 MB parts nor
    above 32 MB; unknown (0) gives the floor."""
    mb = 1 << 20
    assert _isa.long_group_bytes(0) == 8 * mb
    assert _isa.long_group_bytes(32 * mb) == 8 * mb
    assert _isa.long_group_bytes(256 * mb) == 16 * mb
    assert _isa.long_group_bytes(480 * mb) == 30 * mb
    assert _isa.long_group_bytes(2048 * mb) == 32 * mb


def test_cache_policies():
    """An AMD-CCD-sized L3 (or none known) keeps the defaults measured there; a mesh
    L3 adds the partials in pairs only while they fit in L2, else by column chunk,
    writes fresh outputs of all but the long rows with plain stores, and takes the
    forward's short 32-bit rows with the next block's prefetch alone."""
    mb = 1 << 20
    row = 64 << 10
    ccd = _isa.cache_policies(1 * mb, 32 * mb, row)
    assert ccd == {"long_group_bytes": 8 * mb, "parts_in_a_bytes": 4 * mb, "bwd_a_by_chunk": 1,
                   "fresh_plain_row_bytes": 0, "short_prefetch_bytes": 8 << 10}
    assert _isa.cache_policies(0, 0, row) == ccd
    mesh = _isa.cache_policies(2 * mb, 480 * mb, row)
    assert mesh == {"long_group_bytes": 30 * mb, "parts_in_a_bytes": 2 * mb, "bwd_a_by_chunk": 2,
                    "fresh_plain_row_bytes": row, "short_prefetch_bytes": 0}
    # the plain-store bound is the kernels' long-row bound, whatever it is
    assert _isa.cache_policies(2 * mb, 480 * mb, 12345)["fresh_plain_row_bytes"] == 12345
    assert _isa.cache_policies(0, 105 * mb, row)["parts_in_a_bytes"] == 1 * mb   # L2 unknown


def test_cache_policies_reach_every_level():
    assert _isa.l2_cache_bytes() >= 0 and _isa.l3_cache_bytes() >= 0
    for level in _isa.available_levels():
        with _isa.using(level):
            want = _isa.cache_policies(_isa.l2_cache_bytes(), _isa.l3_cache_bytes(),
                                       _isa.kernels.long_row_bytes())
            assert {name: _isa.kernels._policy(name) for name in want} == want
            assert cynorm.show_config()["cache_policies"] == want


def test_highest_level_by_default():
    if os.environ.get(_isa.ENV_VAR):
        pytest.skip("CYNORM_ISA is set for this test run")
    assert _isa.level == _isa.available_levels()[-1]


def test_levels_follow_cpu_features():
    feats = _isa.cpu_features()
    for lvl in _isa.available_levels():
        assert _isa.REQUIRED_FEATURES[lvl] <= feats


@pytest.mark.parametrize("level", LEVELS)
def test_forcing_a_level(level):
    r = _python("import cynorm; print(cynorm.show_config()['isa'])", CYNORM_ISA=level)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == level


def test_unknown_level_is_a_clear_error():
    r = _python("import cynorm", CYNORM_ISA="avx9000")
    assert r.returncode != 0
    assert "CYNORM_ISA='avx9000'" in r.stderr and "unknown ISA level" in r.stderr and "baseline" in r.stderr


def test_level_this_cpu_cannot_run_is_a_clear_error():
    r = _python("import cynorm", CYNORM_ISA="avx2", CYNORM_CPU_MASK="avx2,fma")
    assert r.returncode != 0
    assert "cannot be used" in r.stderr and "lacks avx2" in r.stderr


def test_masked_cpu_falls_back():
    every_feature = ",".join(sorted({f for fs in _isa.REQUIRED_FEATURES.values() for f in fs}))
    r = _python("import cynorm; print(cynorm.show_config()['isa'])", CYNORM_CPU_MASK=every_feature)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "baseline"


def test_module_matches_level(isa_level):
    assert _isa.kernels.isa() == isa_level


# --------------------------------------------------------------- conversions --

def _special_f32_bits():
    specials = [0x00000000, 0x80000000, 0x00000001, 0x007fffff, 0x80400000, 0x00800000, 0x7f7fffff,
                0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff,
                0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff, 0x477ff000, 0x477fefff, 0x38800000,
                0x387fffff, 0x33800000, 0x33000000, 0x33000001, 0x7f7f8000]
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    # values around rounding ties: low 16 bits 0x8000 +- 1
    ties = (rng.integers(0, 2**16, size=20_000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    return np.concatenate([np.array(specials, np.uint32), rand, ties, ties + 1, ties - 1])


def _bf16_reference(bits):
    """Scalar contract: RNE, NaN quieted with sign/payload kept, fp32 subnormals -> signed zero."""
    u = bits.astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    sub = (u & 0x7F800000) == 0
    u = np.where(sub, u & 0x80000000, u)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(nan, ((bits.astype(np.uint64) >> 16) | 0x40) & 0xFFFF, r).astype(np.uint16)


def test_bf16_conversion_matches_contract_on_every_level(isa_level):
    bits = _special_f32_bits()
    got = np.empty(bits.size, np.uint16)
    _isa.kernels.f32_to_bf16(bits.view(np.float32), got)
    np.testing.assert_array_equal(got, _bf16_reference(bits))


@pytest.mark.parametrize("special", [0x7FC00001, 0xFF800001, 0x00000001, 0x807FFFFF, 0x007FFFFF, 0x00000000,
                                     0x80000000, 0x7F800000, 0x7F7FFFFF])
def test_bf16_vector_pairs_take_the_exact_path_for_any_lane(isa_level, special):
    """The store loops convert two vectors at a time and round plainly unless a
    lane is NaN or subnormal: one such lane at every position of a 32-lane group
    (two AVX-512 vectors, four AVX2 ones), among values that round up, down and
    to even, must give the contract's bits in every lane."""
    normal = np.array([0x3F808000, 0x3F818000, 0xBF80FFFF, 0x40490FDB], np.uint32)
    base = np.resize(normal, 32)
    groups = np.tile(base, (33, 1))
    for pos in range(32):
        groups[pos, pos] = special
    bits = groups.reshape(-1)
    got = np.empty(bits.size, np.uint16)
    _isa.kernels.f32_to_bf16(bits.view(np.float32), got)
    np.testing.assert_array_equal(got, _bf16_reference(bits))


def test_bf16_hardware_and_software_paths_agree():
    """VCVTNEPS2BF16 (avx512_bf16) and the integer RNE path give the same bits."""
    if "avx512_bf16" not in LEVELS:
        pytest.skip("this CPU has no AVX512_BF16")
    bits = _special_f32_bits()
    outs = {}
    for lvl in LEVELS:
        with _isa.using(lvl):
            out = np.empty(bits.size, np.uint16)
            _isa.kernels.f32_to_bf16(bits.view(np.float32), out)
            outs[lvl] = out
    for lvl, out in outs.items():
        np.testing.assert_array_equal(out, outs["avx512_bf16"], err_msg=lvl)


def test_bf16_conversion_matches_ml_dtypes_for_normal_values(isa_level):
    x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 1e3
    got = np.empty(x.size, np.uint16)
    _isa.kernels.f32_to_bf16(x, got)
    np.testing.assert_array_equal(got, x.astype(bfloat16).view(np.uint16))


def test_f16_conversions_match_numpy(isa_level):
    bits = _special_f32_bits()
    x = bits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    _isa.kernels.f32_to_f16(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    # NaN: quiet, sign and top payload bits kept (what VCVTPS2PH does)
    expect_nan = ((bits[nan] >> 16) & 0x8000) | 0x7E00 | ((bits[nan] >> 13) & 0x3FF)
    np.testing.assert_array_equal(got[nan], expect_nan.astype(np.uint16))
    all_h = np.arange(65536, dtype=np.uint16)
    back = np.empty(65536, np.float32)
    _isa.kernels.f16_to_f32(all_h, back)
    ref = all_h.view(np.float16).astype(np.float32)
    finite = ~np.isnan(ref)
    np.testing.assert_array_equal(back[finite].view(np.uint32), ref[finite].view(np.uint32))
    assert np.isnan(back[~finite]).all()
    assert ((back[~finite].view(np.uint32) & 0x400000) != 0).all()   # quiet NaNs


def test_every_level_gives_the_same_bits(rng):
    """Every level adds in one order (cn_order.h, cn_simd.h): forward and backward
    outputs are bit-identical across the levels this CPU runs (tests/test_golden.py
    pins them to hashes written on other machines)."""
    x = (rng.standard_normal((16, 777)) * 3 + 1).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.standard_normal(777).astype(np.float32)
    outs = {}
    for lvl in LEVELS:
        with _isa.using(lvl):
            y, mean, rstd = cynorm.layer_norm_forward(x, w, w)
            outs[lvl] = (y, mean, rstd) + cynorm.layer_norm_backward(dy, x, mean, rstd, w)
    for lvl, got in outs.items():
        for name, g, e in zip(("y", "mean", "rstd", "dx", "dweight", "dbias"), got, outs[LEVELS[0]]):
            assert_same_bits(g, e, f"{name} at {lvl} against {LEVELS[0]}")
