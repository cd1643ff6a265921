"""Tests for fp16utils._args: the argument rules, limits, whole numbers and unknown keys."""

import math

import pytest

from fp16utils._args import keys, limits, numbers, spec


def test_whole_numbers_as_mmcv_takes_them():
    assert [numbers.as_whole(v) for v in (2.0, 3, 7.0, -1)] == [2, 3, 7, -1]
    assert [numbers.as_whole(v) for v in (2.5, True, math.inf, '3')] == [None] * 4
    assert numbers.check_window(1000.0, 'LossScaler', 'scale_window') == 1000
    assert numbers.window_note(3) == ''
    assert numbers.window_note(2.5) == ("; mmcv's LossScaler would grow the scale every 5 "
                                        'clean iterations with it, not every 2.5')
    with pytest.raises(ValueError, match='LossScaler: scale_window must be a whole number '
                                         '>= 1.*every 5 clean iterations'):
        numbers.check_window(2.5, 'LossScaler', 'scale_window')


def test_unknown_keys_are_named_with_the_closest_accepted_one():
    assert keys.unknown_keys_message('fp16', ['loss_scal'], ('loss_scale', 'dtype')) == (
        "fp16 got the unknown key 'loss_scal' (did you mean 'loss_scale'?); it takes "
        'loss_scale, dtype')
    message = keys.unknown_keys_message('f', ['zz'], ('a',))
    assert message == "f got the unknown key 'zz'; it takes a"
    assert issubclass(keys.UnknownKeyError, TypeError)


def test_scale_limits_and_arithmetic():
    assert [limits.usable_scale(v) for v in (512.0, 1e-40, 2.0**-126)] == [True, False, True]
    assert [limits.usable_scale(v) for v in (2.0**127, 2.0**128, True)] == [True, False, False]
    assert limits.MAX_GROWTH_INTERVAL == 2**63 - 1
    assert limits.to_float32(0.1) != 0.1 and limits.to_float32(1e39) == math.inf
    assert limits.grow_scale(2.0**127, 2.0) == limits.MAX_LOSS_SCALE
    assert limits.grow_scale(3.0, 1.1, float32=True) == 3.299999952316284
    assert [limits.shrink_scale(*a) for a in ((8.0, 4.0, 1.0), (1.0, 0.5, 1.0),
                                              (0.5, 0.25, 1.0))] == [4.0, 1.0, 0.5]
    assert [limits.real_number(v) for v in (2, '2', True)] == [2, None, None]
    assert limits.grad_scaler_bounds_error('example', 2000) == ''
    assert 'int64' in limits.grad_scaler_bounds_error('example', 2**64)


def test_argument_rules():
    static = spec.parse_loss_scale(512., 'Fp16OptimizerHook')
    assert (static.static, static.init_scale) == (True, 512.0)
    assert spec.parse_loss_scale(dict(mode='dynamic', scale_window=100), 'hook'
                                 ).growth_interval == 100
    assert spec.MMCV_DYNAMIC.init_scale == spec.MMCV_INIT_SCALE == 2.0**32
    assert spec.MMCV_LOSS_SCALE == 512.0
    assert [spec.is_number(v) for v in (2, 2.5, True, '2')] == [True, True, False, False]
    assert [spec.positive_finite(v) for v in (0.5, 0, math.inf)] == [True, False, False]
    assert [spec.is_positive_int(v) for v in (3, 0, True)] == [True, False, False]
    assert spec.check_scale(512, 'LossScaler', 'init_scale') == 512.0
    assert spec.check_positive_int(4, 'OptimWrapper', 'accumulative_counts') == 4
    state = dict(scale=1024., growth_factor=2., backoff_factor=.5, growth_interval=100,
                 _growth_tracker=3)
    assert spec.check_scaler_state(state, 'example') == 'torch'
    assert spec.check_stats({'skipped_steps': 2, 'scale_history': [(0, 8.0)]}, 'example') == (
        2, [(0, 8.0)])
    assert spec.check_nonfinite_policy('raise', 'AmpOptimWrapper') == 'raise'
    assert spec.check_cache_enabled(False, 'AmpOptimWrapper') is False
