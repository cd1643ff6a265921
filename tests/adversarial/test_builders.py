"""Attacks on ``build_optim_wrapper``, its constructors and ``paramwise_cfg``.

A refused build leaves the model exactly as it was: no sub-model converted to
half, no flag set, every weight bit-identical; and the config is not changed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _state_attacks import INF, assert_same, deep, require_f16
from torch import nn

from fp16utils import build_optim_wrapper


def _gan():
    torch.manual_seed(0)
    return nn.ModuleDict(dict(generator=nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)),
                              discriminator=nn.Linear(4, 1)))


def _legacy(**extra):
    cfg = dict(type='AmpOptimWrapper', optimizer=dict(type='Adam', lr=1e-3),
               backend='legacy', dtype='float16')
    cfg.update(extra)
    return cfg


def _model_state(model):
    return deep({'state': dict(model.state_dict()),
                 'dtypes': [p.dtype for p in model.parameters()],
                 'flags': [getattr(m, 'fp16_enabled', None) for m in model.modules()]})


def _assert_refused(model, cfg, exc, match):
    """Building ``cfg`` raises ``exc``; the model and the config are unchanged."""
    frozen_cfg = copy.deepcopy(cfg)
    before = _model_state(model)
    with pytest.raises(exc, match=match):
        build_optim_wrapper(model, cfg)
    assert_same(before, _model_state(model))
    assert cfg == frozen_cfg


# A later entry that fails only when its wrapper is made (its config reads well).
LATE_ERRORS = [
    ('nonfinite-bogus', _legacy(nonfinite='bogus'), ValueError, 'nonfinite'),
    ('use_fsdp-a-str', _legacy(use_fsdp='yes'), TypeError, 'use_fsdp'),
    ('legacy-float32', dict(_legacy(), dtype='float32'), ValueError, 'legacy backend'),
    ('legacy-fsdp', _legacy(use_fsdp=True), ValueError, 'FSDP'),
]


@pytest.mark.parametrize(('case', 'entry', 'exc', 'match'), LATE_ERRORS,
                         ids=[c[0] for c in LATE_ERRORS])
def test_a_later_entry_failing_converts_no_sub_model(case, entry, exc, match):
    require_f16('legacy')
    model = _gan()
    _assert_refused(model, dict(constructor='MultiOptimWrapperConstructor',
                                generator=_legacy(), discriminator=entry), exc, match)


def test_a_later_entry_on_a_half_sub_model_converts_no_other():
    require_f16('legacy')
    model = _gan()
    model.discriminator.half()
    before = _model_state(model)
    with pytest.raises(ValueError, match='float32 model'):
        build_optim_wrapper(model, dict(constructor='MultiOptimWrapperConstructor',
                                        generator=_legacy(), discriminator=_legacy()))
    assert_same(before, _model_state(model))


def test_every_legacy_entry_is_converted_once_all_are_built():
    require_f16('legacy')
    model = _gan()
    wrappers = build_optim_wrapper(model, dict(
        constructor='MultiOptimWrapperConstructor', generator=_legacy(),
        discriminator=_legacy()))
    assert model.generator[0].weight.dtype == torch.float16
    assert model.generator[1].weight.dtype == torch.float32  # norms stay float32
    assert model.discriminator.weight.dtype == torch.float16
    assert len(wrappers['generator'].master_params) == 4


BAD_CFGS = [
    ('not-a-dict', [1], TypeError, 'config dict'),
    ('unknown-constructor', dict(constructor='X', optimizer=dict(type='SGD', lr=0.1)),
     ValueError, 'unknown constructor'),
    ('unknown-type', dict(type='X', optimizer=dict(type='SGD', lr=0.1)), ValueError,
     'unknown wrapper type'),
    ('no-optimizer', dict(type='OptimWrapper'), ValueError, "missing 'optimizer'"),
    ('optimizer-a-str', dict(optimizer='SGD'), ValueError, "with a 'type'"),
    ('unknown-optimizer', dict(optimizer=dict(type='Nope')), ValueError, 'unknown optimizer'),
    ('optimizer-rejects', dict(optimizer=dict(type='SGD', lr=-1.0)), ValueError, 'rejected'),
    ('amp-key-on-plain', dict(optimizer=dict(type='SGD', lr=0.1), loss_scale=512.),
     ValueError, 'AmpOptimWrapper'),
    ('loss-scale-inf', _legacy(loss_scale=INF), ValueError, 'loss_scale'),
    ('loss-scale-huge', _legacy(loss_scale=dict(init_scale=1e300)), ValueError, 'init_scale'),
    ('loss-scale-window-0', _legacy(loss_scale=dict(scale_window=0)), ValueError,
     'growth_interval'),
    ('loss-scale-bool', _legacy(loss_scale=True), ValueError, 'loss_scale'),
    ('counts-0', dict(optimizer=dict(type='SGD', lr=0.1), accumulative_counts=0), ValueError,
     'accumulative_counts'),
    ('clip-a-list', dict(optimizer=dict(type='SGD', lr=0.1), clip_grad=[1]), ValueError,
     'clip_grad'),
    ('bad-dtype', _legacy(dtype='int8'), ValueError, 'dtype'),
    ('bad-backend', _legacy(backend='fast'), ValueError, 'backend'),
    ('paramwise-a-list', dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg=[1]),
     TypeError, 'paramwise_cfg'),
    ('paramwise-unknown', dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg=dict(x=1)),
     ValueError, 'unknown option'),
    ('paramwise-mult-a-str', dict(optimizer=dict(type='SGD', lr=0.1),
                                  paramwise_cfg=dict(bias_lr_mult='2')), ValueError,
     'must be a number'),
    ('paramwise-decay-without-wd', dict(optimizer=dict(type='SGD', lr=0.1),
                                        paramwise_cfg=dict(norm_decay_mult=0.)), ValueError,
     'weight_decay'),
    ('custom-keys-a-list', dict(optimizer=dict(type='SGD', lr=0.1),
                                paramwise_cfg=dict(custom_keys=[1])), TypeError, 'custom_keys'),
    ('custom-entry-a-float', dict(optimizer=dict(type='SGD', lr=0.1),
                                  paramwise_cfg=dict(custom_keys={'fc': 0.1})), TypeError,
     'custom_keys'),
    ('custom-without-lr', dict(optimizer=dict(type='SGD'),
                               paramwise_cfg=dict(custom_keys={'fc': dict(lr_mult=0.1)})),
     ValueError, 'no lr'),
    ('multi-missing-sub-model', dict(constructor='MultiOptimWrapperConstructor',
                                     critic=dict(optimizer=dict(type='SGD', lr=0.1))),
     ValueError, 'no sub-module'),
    ('multi-entry-a-str', dict(constructor='MultiOptimWrapperConstructor', generator='x'),
     ValueError, 'wrapper config dict'),
    ('multi-empty', dict(constructor='MultiOptimWrapperConstructor'), ValueError,
     'one config per'),
    ('multi-paramwise-on-top', dict(constructor='MultiOptimWrapperConstructor',
                                    paramwise_cfg=dict(bias_lr_mult=2.),
                                    generator=dict(optimizer=dict(type='SGD', lr=0.1))),
     ValueError, 'inside each sub-model'),
]


@pytest.mark.parametrize(('case', 'cfg', 'exc', 'match'), BAD_CFGS, ids=[c[0] for c in BAD_CFGS])
def test_a_bad_config_is_refused_and_changes_nothing(case, cfg, exc, match):
    _assert_refused(_gan(), cfg, exc, match)


@pytest.mark.parametrize('model', [None, 'model', [nn.Linear(1, 1)]])
def test_build_takes_a_module(model):
    with pytest.raises(TypeError, match='nn.Module'):
        build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1)))


def _tied():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 1))
    model[1].weight = model[0].weight  # tied weights: one parameter in two modules
    return model


def test_paramwise_with_frozen_and_tied_parameters():
    model = _tied()
    model[2].requires_grad_(False)
    wrapper = build_optim_wrapper(model, dict(
        optimizer=dict(type='SGD', lr=0.1, weight_decay=1e-4),
        paramwise_cfg=dict(bias_decay_mult=0.0, bypass_duplicate=True)))
    params = [p for g in wrapper.optimizer.param_groups for p in g['params']]
    assert params == [model[0].weight, model[0].bias, model[1].bias]
    assert [g.get('weight_decay') for g in wrapper.optimizer.param_groups] == [1e-4, 0.0, 0.0]


def test_paramwise_with_tied_parameters_and_no_bypass_is_torch_s_error():
    model = _tied()
    before = _model_state(model)
    with pytest.raises(ValueError, match='more than one parameter group'):
        build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1),
                                        paramwise_cfg=dict(bias_lr_mult=2.0)))
    assert_same(before, _model_state(model))


def test_a_model_with_only_frozen_parameters_is_torch_s_error_and_changes_nothing():
    model = nn.Linear(2, 1).requires_grad_(False)
    before = _model_state(model)
    with pytest.raises(ValueError, match='empty parameter list'):
        build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1),
                                        paramwise_cfg=dict(bias_lr_mult=2.0)))
    assert_same(before, _model_state(model))
