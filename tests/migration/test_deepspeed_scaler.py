"""Differential: the scale policy against DeepSpeed's own ``DynamicLossScaler``.

``.ci/migration`` downloads DeepSpeed 0.16.0 and 0.19.8 (sdists, never installed) with the
other releases. Their ``deepspeed/runtime/fp16/loss_scaler.py`` is loaded on its own, with
the few names it imports from the rest of DeepSpeed given here (a rank of 0, a logger,
a base class), and driven with the same overflow sequences as fp16utils' LossScaler,
configured from the same DeepSpeed ``fp16`` keys: the scale and the hysteresis left agree
after every iteration, and so does raising at the floor. DeepSpeed 0.17.5 and newer grow
one iteration later than GradScaler, mmcv and DeepSpeed up to 0.17.4 (after
``loss_scale_window + 1`` clean iterations); with growth out of reach they agree too,
and each of their growths comes exactly one iteration after ours.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import sys
import types

import pytest
import torch
from _wheels import wheels_dir

from fp16utils import LossScaler
from fp16utils._args.spec import parse_loss_scale

RELEASES = ('deepspeed-0.16.0', 'deepspeed-0.19.8')
#: The releases that grow one iteration later (stable_interval = clean iterations - 1).
LATER = {'deepspeed-0.19.8'}


def _stub_modules() -> dict:
    """The DeepSpeed names loss_scaler.py imports, as small stand-ins."""
    log = logging.getLogger('deepspeed-reference')
    comm = types.SimpleNamespace(get_rank=lambda: 0)
    utils = types.ModuleType('deepspeed.utils')
    utils.logger = log
    utils.log_dist = lambda message, ranks=None, level=logging.INFO: log.log(level, message)
    config_utils = types.ModuleType('deepspeed.runtime.config_utils')
    config_utils.DeepSpeedConfigObject = object
    runtime_utils = types.ModuleType('deepspeed.runtime.utils')
    runtime_utils.has_inf_or_nan = lambda x: bool((~torch.isfinite(x)).any())
    package = types.ModuleType('deepspeed')
    package.comm = comm
    package.__path__ = []
    runtime = types.ModuleType('deepspeed.runtime')
    runtime.__path__ = []
    return {'deepspeed': package, 'deepspeed.comm': comm, 'deepspeed.utils': utils,
            'deepspeed.runtime': runtime, 'deepspeed.runtime.config_utils': config_utils,
            'deepspeed.runtime.utils': runtime_utils}


def _load(release: str):
    root = wheels_dir()
    if root is None:
        pytest.skip('FP16UTILS_WHEELS_DIR is not set: .ci/migration sets it')
    path = root / release / 'deepspeed' / 'runtime' / 'fp16' / 'loss_scaler.py'
    if not path.is_file():
        pytest.fail(f'{path} is missing: .ci/migration downloads and unpacks {release}')
    saved = {name: sys.modules.get(name) for name in _stub_modules()}
    sys.modules.update(_stub_modules())
    try:
        spec = importlib.util.spec_from_file_location(f'_ds_loss_scaler_{release}', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    return module


@pytest.fixture(scope='module', params=RELEASES)
def release(request):
    return request.param, _load(request.param)


#: (initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis,
#: min_loss_scale): DeepSpeed's fp16 keys.
SETTINGS = [(8, 3, 2, False, 1), (8, 3, 2, True, 1), (6, 2, 3, False, 4), (6, 4, 3, True, 2),
            (5, 2, 1, False, 1), (10, 1000, 4, False, 1)]


def _sequences():
    rng = random.Random(3)
    fixed = [[True, True, False, True, False, False, False, True, True, True, False] * 3,
             [True] * 9 + [False] * 9 + [True] * 4]
    return fixed + [[rng.random() < p for _ in range(60)] for p in (0.15, 0.35, 0.6)]


def _pair(module, power, window, hysteresis, consecutive, min_scale, raise_at_min=False):
    theirs = module.DynamicLossScaler(
        init_scale=2.0**power, scale_window=window, min_scale=min_scale,
        delayed_shift=hysteresis, consecutive_hysteresis=consecutive,
        raise_error_at_min_scale=raise_at_min)
    keys = dict(initial_scale_power=power, loss_scale_window=window, hysteresis=hysteresis,
                consecutive_hysteresis=consecutive, min_loss_scale=min_scale,
                raise_error_at_min_scale=raise_at_min)
    spec = parse_loss_scale(keys, 'test')
    ours = LossScaler(init_scale=spec.init_scale, scale_window=spec.growth_interval,
                      **spec.policy.given())
    return theirs, ours


@pytest.mark.parametrize('settings', SETTINGS)
def test_same_overflows_same_scale_and_hysteresis(release, settings):
    name, module = release
    window = settings[1]
    # Newer releases grow later: with growth out of reach, the policy alone is compared.
    compared = settings[:1] + (10**6,) + settings[2:] if name in LATER else settings
    for sequence in _sequences():
        theirs, ours = _pair(module, *compared)
        for i, overflow in enumerate(sequence):
            theirs.update_scale(overflow)
            ours.update_scale(overflow)
            assert (ours.cur_scale, ours.cur_hysteresis) == (
                theirs.cur_scale, theirs.cur_hysteresis), (name, settings, i)
    if name in LATER:  # each growth one iteration after ours
        theirs, ours = _pair(module, *settings[:1], window, *settings[2:])
        grown = {'theirs': [], 'ours': []}
        for i, overflow in enumerate([True] + [False] * (2 * window + 1)):
            before = theirs.cur_scale, ours.cur_scale
            theirs.update_scale(overflow)
            ours.update_scale(overflow)
            if theirs.cur_scale > before[0]:
                grown['theirs'].append(i)
            if ours.cur_scale > before[1]:
                grown['ours'].append(i)
        assert grown['ours'] and grown['theirs'] == [i + 1 for i in grown['ours']]


def test_both_raise_at_the_floor_on_the_same_iteration(release):
    name, module = release
    theirs, ours = _pair(module, 3, 10**6, 2, False, 2, raise_at_min=True)
    sequence = [True] * 10
    raised = {}
    for who, scaler in (('theirs', theirs), ('ours', ours)):
        for i, overflow in enumerate(sequence):
            try:
                scaler.update_scale(overflow)
            except Exception as err:  # DeepSpeed raises a bare Exception
                raised[who] = (i, scaler.cur_scale, type(err).__name__)
                break
    assert raised['ours'][:2] == raised['theirs'][:2], name
    assert raised['ours'][2] == 'FloatingPointError'


def test_loaded_files_are_deepspeeds():
    """The file compared is DeepSpeed's own (its class and argument names)."""
    root = wheels_dir()
    if root is None:
        pytest.skip('FP16UTILS_WHEELS_DIR is not set: .ci/migration sets it')
    for release_name in RELEASES:
        text = (root / release_name / 'deepspeed' / 'runtime' / 'fp16' /
                'loss_scaler.py').read_text()
        assert 'class DynamicLossScaler' in text and 'delayed_shift' in text
