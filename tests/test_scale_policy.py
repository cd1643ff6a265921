"""The scale policy: hysteresis (both kinds), floor and ceiling, the action at the floor,
DeepSpeed's names, and the states that carry them, on LossScaler and both backends."""

from __future__ import annotations

import copy
import logging
import math
import random

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, LossScaler
from fp16utils._args.policy import DEFAULT_POLICY, POLICY_STATE_KEYS, ScalePolicy
from fp16utils._args.spec import (
    GRAD_SCALER_STATE_KEYS,
    MMCV_STATE_KEYS,
    TORCH_DYNAMIC,
    parse_loss_scale,
)

INF = float('inf')


class DeepSpeedDefinition:
    """DeepSpeed's dynamic loss scaler as its documentation defines it (``fp16`` config:
    ``initial_scale_power``, ``loss_scale_window``, ``hysteresis``,
    ``consecutive_hysteresis``, ``min_loss_scale``), written out for this comparison.

    An overflow uses up one unit of hysteresis; when none is left above one it divides
    the scale by the factor (not below the minimum, or raises there when asked). The
    window restarts at every overflow; every ``window`` iterations since the last one
    multiply the scale and restore the hysteresis (consecutive: every clean step restores it).
    ``later=True``: DeepSpeed 0.17.5 and newer, which grow one clean iteration later
    (after ``window + 1``), so that ``growth_interval = window + 1`` gives their curve.
    """

    def __init__(self, power, window, hysteresis, consecutive, min_scale, raise_at_min=False,
                 later=False):
        self.later = later
        self.scale = 2.0**power
        self.window = window
        self.delayed_shift = hysteresis
        self.left = hysteresis
        self.consecutive = consecutive
        self.min_scale = min_scale
        self.raise_at_min = raise_at_min
        self.it = 0
        self.last_overflow = -1

    def update(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.left == 1:
                if self.scale == self.min_scale and self.raise_at_min:
                    raise FloatingPointError('at the minimum')
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.left -= 1
            self.last_overflow = self.it
        else:
            if self.consecutive:
                self.left = self.delayed_shift
            since = self.it - self.last_overflow - (1 if self.later else 0)
            if since > 0 and since % self.window == 0:
                if not self.consecutive:
                    self.left = self.delayed_shift
                self.scale *= 2.0
        self.it += 1


def _deepspeed_keys(power, window, hysteresis, consecutive, min_scale):
    return dict(initial_scale_power=power, loss_scale_window=window, hysteresis=hysteresis,
                consecutive_hysteresis=consecutive, min_loss_scale=min_scale)


SEQUENCES = {
    'bursts': [True, True, False, True, False, False, False, True, True, True, False, False,
               False, False, False, True, False, True, True, False] * 2,
    'alternating': [True, False] * 12,
    'in_a_row': [True] * 7 + [False] * 9 + [True] * 3,
}
SETTINGS = [
    (8, 3, 2, False, 1.0),
    (8, 3, 2, True, 1.0),
    (6, 2, 3, False, 4.0),
    (6, 4, 3, True, 2.0),
    (5, 2, 1, False, 1.0),
]


def _random_sequences(count=6, length=40, seed=7):
    rng = random.Random(seed)
    return [[rng.random() < p for _ in range(length)] for p in (0.2, 0.4, 0.6)
            for _ in range(count // 3)]


# ----------------------------------------------------------- parsing every form of a scale


def test_deepspeed_names_read_as_ours():
    spec = parse_loss_scale(dict(initial_scale_power=12, loss_scale_window=500, hysteresis=2,
                                 consecutive_hysteresis=True, min_loss_scale=4,
                                 raise_error_at_min_scale=True), 'T')
    assert (spec.init_scale, spec.growth_interval, spec.static) == (4096.0, 500, False)
    assert spec.policy == ScalePolicy(min_scale=4.0, hysteresis=2, consecutive_hysteresis=True,
                                      at_min_scale='raise')
    assert parse_loss_scale(dict(raise_error_at_min_scale=False), 'T').policy == DEFAULT_POLICY


def test_defaults_are_unchanged():
    assert parse_loss_scale('dynamic', 'T') == TORCH_DYNAMIC
    assert parse_loss_scale(dict(init_scale=8.0), 'T').policy.is_default
    assert LossScaler().state_dict().keys() == set(MMCV_STATE_KEYS)
    _caps.require(torch.float16, 'native')
    assert AmpOptimWrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.),
                           dtype=torch.float16).state_dict()['loss_scaler'].keys() == set(
        GRAD_SCALER_STATE_KEYS)


@pytest.mark.parametrize('loss_scale, match', [
    (dict(init_scale=8., initial_scale_power=3), "'init_scale' and 'initial_scale_power'"),
    (dict(scale_window=8, loss_scale_window=3), "'scale_window' and 'loss_scale_window'"),
    (dict(min_scale=1., min_loss_scale=1.), "'min_scale' and 'min_loss_scale'"),
    (dict(at_min_scale='warn', raise_error_at_min_scale=True), "'at_min_scale' and"),
    (dict(initial_scale_power=2.5), 'initial_scale_power .* whole number in \\[-127, 127\\]'),
    (dict(initial_scale_power=200), 'initial_scale_power'),
    (dict(hysteresis=0), 'hysteresis .* whole number >= 1, got 0'),
    (dict(hysteresis=1.5), 'hysteresis'),
    (dict(hysteresis=True), 'hysteresis'),
    (dict(consecutive_hysteresis=1), 'consecutive_hysteresis must be True or False'),
    (dict(at_min_scale='stop'), "at_min_scale must be one of \\['continue', 'warn', 'raise'\\]"),
    (dict(min_scale=0.), 'min_scale must be'),
    (dict(max_scale=INF), 'max_scale must be'),
    (dict(init_scale=2., min_scale=4.), 'init_scale=2.0 is below min_scale=4.0'),
    (dict(init_scale=64., max_scale=32.), 'init_scale=64.0 is above max_scale=32.0'),
    (dict(init_scale=8., min_scale=8., max_scale=4.), 'above max_scale|init_scale=8.0 is above'),
    (dict(mode='static', init_scale=8., hysteresis=2), 'only apply to a dynamic scale'),
    (dict(raise_error_at_min_scale='yes'), 'raise_error_at_min_scale must be True or False'),
    (dict(hysteresys=2), "unknown key\\(s\\) \\['hysteresys'\\]"),
])
def test_bad_policies_are_refused_by_name(loss_scale, match):
    with pytest.raises(ValueError, match=match):
        parse_loss_scale(loss_scale, 'T')
    with pytest.raises(ValueError, match=match):
        Fp16OptimizerHook(loss_scale=loss_scale)


def test_a_static_scale_takes_policy_keys_that_change_nothing():
    for keys in (dict(raise_error_at_min_scale=False), dict(hysteresis=1),
                 dict(at_min_scale='continue', consecutive_hysteresis=False)):
        spec = parse_loss_scale(dict(mode='static', init_scale=8., **keys), 'T')
        assert spec.static and spec.policy.is_default
    assert LossScaler(init_scale=8., mode='static', hysteresis=1).policy.is_default


def test_loss_scaler_arguments():
    scaler = LossScaler(init_scale=16., min_scale=2., max_scale=64., hysteresis=2,
                        consecutive_hysteresis=True, at_min_scale='warn')
    assert scaler.policy == ScalePolicy(2.0, 64.0, 2, True, 'warn')
    assert 'hysteresis=2' in repr(scaler) and 'min_scale=2.0' in repr(scaler)
    with pytest.raises(ValueError, match='only apply to a dynamic scale'):
        LossScaler(init_scale=16., mode='static', hysteresis=2)
    with pytest.raises(ValueError, match='LossScaler; init_scale=16.0 is below min_scale=32.0'):
        LossScaler(init_scale=16., min_scale=32.)


# ------------------------------------------------------- the same sequence, both definitions


def _ours_loss_scaler(power, window, hysteresis, consecutive, min_scale):
    return LossScaler(init_scale=2.0**power, scale_window=window, hysteresis=hysteresis,
                      consecutive_hysteresis=consecutive, min_scale=min_scale)


@pytest.mark.parametrize('settings', SETTINGS)
@pytest.mark.parametrize('name', sorted(SEQUENCES))
def test_loss_scaler_moves_as_deepspeed_defines(settings, name):
    reference = DeepSpeedDefinition(*settings)
    ours = _ours_loss_scaler(*settings)
    for i, overflow in enumerate(SEQUENCES[name] + _random_sequences()[0]):
        reference.update(overflow)
        ours.update_scale(overflow)
        assert (ours.cur_scale, ours.cur_hysteresis) == (reference.scale, reference.left), i


def _wrapped(loss_scale, backend, size=1, optimizer=torch.optim.SGD, **kwargs):
    """A one-parameter model and its AmpOptimWrapper; returns (model, wrapper)."""
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.ones(size))
    wrapper = AmpOptimWrapper(optimizer([model.w], **kwargs), loss_scale=loss_scale,
                              dtype=torch.float16, backend=backend, model=model)
    return model, wrapper


@pytest.mark.parametrize('settings', SETTINGS)
def test_newer_deepspeed_differs_only_in_when_it_grows(settings):
    """DeepSpeed >= 0.17.5 grows one iteration after GradScaler, mmcv and earlier DeepSpeed
    (after window + 1 clean iterations, then every window): with no growth in reach the
    two move alike; with growth, each of its growths comes exactly one iteration later."""
    power, window, hysteresis, consecutive, min_scale = settings
    sequence = SEQUENCES['bursts'] + SEQUENCES['in_a_row']
    no_growth = DeepSpeedDefinition(power, 10**6, hysteresis, consecutive, min_scale, later=True)
    ours = _ours_loss_scaler(power, 10**6, hysteresis, consecutive, min_scale)
    for overflow in sequence:
        no_growth.update(overflow)
        ours.update_scale(overflow)
        assert (ours.cur_scale, ours.cur_hysteresis) == (no_growth.scale, no_growth.left)
    clean = [False] * (3 * window + 1)
    newer = DeepSpeedDefinition(*settings, later=True)
    ours = _ours_loss_scaler(*settings)
    grown_newer, grown_ours = [], []
    for i, overflow in enumerate([True] + clean):
        before = (newer.scale, ours.cur_scale)
        newer.update(overflow)
        ours.update_scale(overflow)
        if newer.scale > before[0]:
            grown_newer.append(i)
        if ours.cur_scale > before[1]:
            grown_ours.append(i)
    assert grown_ours == [window * m for m in (1, 2, 3)]
    assert grown_newer == [g + 1 for g in grown_ours]


def _drive_wrapper(loss_scale, overflows, backend='native'):
    """Train one parameter with AmpOptimWrapper; True in ``overflows`` forces an inf gradient.
    Yields (scale after the step, skipped, parameter value)."""
    model, wrapper = _wrapped(loss_scale, backend, lr=0.125)
    for overflow in overflows:
        result = wrapper.update_params((model.w.float() * (INF if overflow else 1.0)).sum())
        yield wrapper.loss_scale, not result.stepped, model.w.detach().float().clone()


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('settings', SETTINGS)
def test_both_backends_move_as_deepspeed_defines(settings, backend):
    _caps.native_or_legacy(backend)
    sequence = SEQUENCES['bursts']
    reference = DeepSpeedDefinition(*settings)
    power, window, hysteresis, consecutive, min_scale = settings
    loss_scale = dict(init_scale=2.0**power, growth_interval=window, hysteresis=hysteresis,
                      consecutive_hysteresis=consecutive, min_scale=min_scale)
    value = 1.0
    for i, (overflow, (scale, skipped, param)) in enumerate(
            zip(sequence, _drive_wrapper(loss_scale, sequence, backend))):
        reference.update(overflow)
        value -= 0.0 if overflow else 0.125
        assert (scale, skipped) == (reference.scale, overflow), i
        assert param.item() == value, i


def test_deepspeed_names_drive_the_same_scale():
    settings = (7, 3, 2, False, 2.0)
    sequence = SEQUENCES['in_a_row'] + SEQUENCES['alternating']
    reference = DeepSpeedDefinition(*settings)
    ours = Fp16OptimizerHook(loss_scale=_deepspeed_keys(*settings))
    spec = parse_loss_scale(_deepspeed_keys(*settings), 'T')
    assert spec == parse_loss_scale(dict(init_scale=128., growth_interval=3, hysteresis=2,
                                         min_scale=2.), 'T')
    scaler = LossScaler(init_scale=spec.init_scale, scale_window=spec.growth_interval,
                        **spec.policy.given())
    for overflow in sequence:
        reference.update(overflow)
        scaler.update_scale(overflow)
        assert scaler.cur_scale == reference.scale
    assert ours.loss_scale == 128.0  # the hook reads the same arguments


# -------------------------------------------------------------------- floor and ceiling


def test_the_ceiling_stops_growth():
    scaler = LossScaler(init_scale=8., scale_window=1, max_scale=32.)
    for _ in range(5):
        scaler.update_scale(False)
    assert scaler.cur_scale == 32.0
    if _caps.cpu_lacks(torch.float16, 'native') is None:
        scales = [s for s, _, _ in _drive_wrapper(dict(init_scale=8., growth_interval=1,
                                                       max_scale=32.), [False] * 5)]
        assert scales == [16.0, 32.0, 32.0, 32.0, 32.0]


def test_a_loaded_scale_above_the_ceiling_is_not_lowered_by_growth():
    scaler = LossScaler(init_scale=8., scale_window=1, max_scale=32.)
    state = scaler.state_dict()
    state['cur_scale'] = 128.0
    scaler.load_state_dict(state)
    scaler.update_scale(False)
    assert scaler.cur_scale == 128.0
    scaler.update_scale(True)
    assert scaler.cur_scale == 64.0


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_at_min_scale_raise_changes_nothing(backend):
    _caps.native_or_legacy(backend)
    model, wrapper = _wrapped(dict(init_scale=4., min_scale=2., growth_interval=100,
                                   at_min_scale='raise'), backend, 3, torch.optim.Adam, lr=0.1)
    optimizer = wrapper.optimizer

    def p():
        return model.w.float()

    wrapper.update_params(p().sum())  # a clean step: Adam has state now
    wrapper.update_params((p() * INF).sum())
    assert wrapper.loss_scale == 2.0
    before = (p().detach().clone(), copy.deepcopy(optimizer.state_dict()),
              wrapper.state_dict()['loss_scaler'], wrapper.skipped_steps)
    with pytest.raises(FloatingPointError, match=r'loss scale 2\.0 already at its floor '
                       r'\(min_scale=2\.0\).*not applied'):
        wrapper.update_params((p() * INF).sum())
    assert torch.equal(p().detach(), before[0])
    assert optimizer.state_dict()['state'][0]['step'] == before[1]['state'][0]['step']
    assert torch.equal(optimizer.state_dict()['state'][0]['exp_avg'],
                       before[1]['state'][0]['exp_avg'])
    assert wrapper.state_dict()['loss_scaler'] == before[2]
    assert wrapper.skipped_steps == before[3]
    wrapper.zero_grad()
    assert not wrapper.update_params(p().sum()).skipped  # training goes on afterwards
    assert not torch.equal(p().detach(), before[0])


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_at_min_scale_warn_and_continue(backend, caplog):
    _caps.native_or_legacy(backend)
    for action, warned in (('warn', True), ('continue', False)):
        caplog.clear()
        overflows = [True, True, True]
        with caplog.at_level(logging.WARNING, logger='fp16utils'):
            results = list(_drive_wrapper(dict(init_scale=4., min_scale=2., at_min_scale=action),
                                          overflows, backend))
        assert [s for s, _, _ in results] == [2.0, 2.0, 2.0]
        assert all(skipped for _, skipped, _ in results)
        floor_lines = [r for r in caplog.records if 'already at its floor' in r.getMessage()]
        assert len(floor_lines) == (2 if warned else 0)


def test_loss_scaler_raise_at_the_floor_leaves_it_unchanged():
    scaler = LossScaler(init_scale=2., min_scale=2., hysteresis=2, at_min_scale='raise')
    scaler.update_scale(True)  # tolerated: hysteresis 2 -> 1
    assert (scaler.cur_scale, scaler.cur_hysteresis) == (2.0, 1)
    before = scaler.state_dict()
    with pytest.raises(FloatingPointError, match='LossScaler \\(iteration 1\\)'):
        scaler.update_scale(True)
    assert scaler.state_dict() == before


def test_default_floor_is_mmcvs():
    scaler = LossScaler(init_scale=2.)
    for _ in range(3):
        scaler.update_scale(True)
    assert scaler.cur_scale == 1.0
    low = LossScaler(init_scale=0.5)
    low.update_scale(True)
    assert low.cur_scale == 0.5  # never raised to the floor


# --------------------------------------------------------------------------- the states


def test_loss_scaler_state_round_trip_with_policy():
    scaler = LossScaler(init_scale=64., scale_window=3, hysteresis=3, min_scale=2.,
                        at_min_scale='warn')
    for overflow in (True, False, True):
        scaler.update_scale(overflow)
    state = scaler.state_dict()
    assert set(state) == set(MMCV_STATE_KEYS) | set(POLICY_STATE_KEYS)
    assert state['cur_hysteresis'] == 1
    fresh = LossScaler()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.policy == scaler.policy
    reference = copy.deepcopy(scaler)
    for overflow in (True, False, False, False, True):
        reference.update_scale(overflow)
        fresh.update_scale(overflow)
        assert fresh.state_dict() == reference.state_dict()


def test_a_state_without_policy_keeps_the_configured_policy():
    scaler = LossScaler(init_scale=64., hysteresis=3)
    scaler.update_scale(True)
    scaler.load_state_dict(LossScaler(init_scale=32.).state_dict())  # written by mmcv
    assert scaler.policy.hysteresis == 3 and scaler.cur_hysteresis == 3
    assert scaler.cur_scale == 32.0


@pytest.mark.parametrize('change, match', [
    (dict(cur_hysteresis=0), 'cur_hysteresis=0'),
    (dict(cur_hysteresis=4), 'cur_hysteresis=4'),
    (dict(hysteresis=0), 'hysteresis'),
    (dict(at_min_scale='nope'), 'at_min_scale'),
])
def test_bad_policy_states_are_refused_and_nothing_changes(change, match):
    scaler = LossScaler(init_scale=64., hysteresis=3)
    state = {**scaler.state_dict(), **change}
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=match):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == before
    partial = scaler.state_dict()
    del partial['cur_hysteresis']
    with pytest.raises(KeyError, match="not \\['cur_hysteresis'\\]"):
        scaler.load_state_dict(partial)


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_wrapper_state_round_trip_with_policy(backend):
    _caps.native_or_legacy(backend)
    loss_scale = dict(init_scale=64., growth_interval=3, hysteresis=3)

    model, wrapper = _wrapped(loss_scale, backend, lr=0.125)
    for overflow in (True, True, False):
        wrapper.update_params((model.w.float() * (INF if overflow else 1.0)).sum())
    state = wrapper.state_dict()
    assert state['loss_scaler']['cur_hysteresis'] == 1
    other, resumed = _wrapped(loss_scale, backend, lr=0.125)
    resumed.load_state_dict(state)
    assert resumed.state_dict()['loss_scaler'] == state['loss_scaler']
    wrapper.update_params((model.w.float() * INF).sum())  # tolerance used up: backs off now
    resumed.update_params((other.w.float() * INF).sum())
    assert resumed.loss_scale == wrapper.loss_scale == 32.0


def test_grad_scaler_and_mmcv_load_states_with_policy_keys():
    _caps.require(torch.float16, 'native')
    p = torch.nn.Parameter(torch.ones(1))
    wrapper = AmpOptimWrapper(torch.optim.SGD([p], lr=0.1), dtype=torch.float16,
                              loss_scale=dict(init_scale=256., hysteresis=2))
    state = wrapper.state_dict()['loss_scaler']
    scaler = torch.amp.GradScaler('cpu')
    scaler.load_state_dict(state)  # torch reads its own keys and ignores the policy's
    assert scaler.state_dict()['scale'] == 256.0
    mmcv_state = LossScaler(init_scale=8., hysteresis=2).state_dict()
    other = LossScaler()
    other.load_state_dict({k: mmcv_state[k] for k in MMCV_STATE_KEYS})
    assert other.cur_scale == 8.0 and other.policy.is_default
    assert math.isclose(wrapper.loss_scale, 256.0)
