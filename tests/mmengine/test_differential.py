"""The same models and configs, built and stepped by MMEngine's classes and by ours.

What is compared: param groups (lr, weight decay and every other group option, per
parameter) under each ``paramwise_cfg`` option; errors for bad configs; ``get_lr`` /
``get_momentum`` / ``param_groups`` as MMEngine's schedulers drive them; state-dict
keys and round trips both ways; update counts, loss division and parameters under
accumulation; skip and scale behaviour (MMEngine's AmpOptimWrapper given a CPU
GradScaler, since it refuses to run without a GPU).
"""

from __future__ import annotations

import copy
import sys
import types
from importlib.util import find_spec

import pytest
import torch
from torch import nn

_spec = find_spec('mmengine')
if _spec is None or _spec.origin is None:  # absent, or only this folder (a namespace package)
    pytest.skip('mmengine is not installed: run .ci/mmengine for this tier',
                allow_module_level=True)
import _runner as R  # noqa: E402  (tests/ is on sys.path: see tests/conftest.py)
import mmengine.optim as mo  # noqa: E402
from mmengine.optim.optimizer import amp_optimizer_wrapper, default_constructor  # noqa: E402

import fp16utils  # noqa: E402
import fp16utils.mmengine as plugin  # noqa: E402

LR, WD = 0.01, 1e-4


DeformConv2d = R.DeformConv2d  # what mmcv.ops.DeformConv2d looks like to both


@pytest.fixture
def fake_mmcv(monkeypatch):
    """Make MMEngine see mmcv's DCN classes (it looks them up only when mmcv is there)."""
    ops = types.ModuleType('mmcv.ops')
    ops.DeformConv2d = DeformConv2d
    ops.ModulatedDeformConv2d = type('ModulatedDeformConv2d', (DeformConv2d,), {})
    monkeypatch.setitem(sys.modules, 'mmcv', types.ModuleType('mmcv'))
    monkeypatch.setitem(sys.modules, 'mmcv.ops', ops)
    monkeypatch.setattr(default_constructor, 'mmcv_full_available', lambda: True)


class Model(nn.Module):
    def __init__(self, dcn=False, shared=False):
        super().__init__()
        torch.manual_seed(0)
        self.param1 = nn.Parameter(torch.ones(1))
        self.conv1 = nn.Conv2d(3, 4, 1, bias=False)
        self.conv2 = nn.Conv2d(4, 2, 1)
        self.bn = nn.BatchNorm2d(2)
        self.sub = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.GroupNorm(1, 2),
                                 nn.Linear(2, 2), nn.LayerNorm(2), nn.InstanceNorm2d(2,
                                                                                   affine=True))
        self.frozen = nn.Linear(2, 2)
        self.frozen.weight.requires_grad_(False)
        if dcn:
            self.dcn = DeformConv2d()
        if shared:
            self.again = nn.Sequential(self.conv2)


PARAMWISE = {
    'none': None,
    'empty': {},
    'bias_lr': dict(bias_lr_mult=2.0),
    'bias_decay': dict(bias_decay_mult=0.5),
    'norm_decay': dict(norm_decay_mult=0.0),
    'dwconv_decay': dict(dwconv_decay_mult=0.1),
    'flat_decay': dict(flat_decay_mult=0.3),
    'all': dict(bias_lr_mult=2.0, bias_decay_mult=0.5, norm_decay_mult=0.0,
                dwconv_decay_mult=0.1, flat_decay_mult=0.3),
    'custom_keys': dict(bias_lr_mult=2.0, custom_keys={
        'sub': dict(lr_mult=0.1, decay_mult=0.2), 'sub.2': dict(lr_mult=0.5),
        'conv': dict(lr_mult=3.0), 'bn': dict(decay_mult=0.0, momentum=0.5),
        'sub.0': dict(lr_mult=0.7), 'sub.1': dict(lr_mult=0.6)}),
}


def described(model, wrapper):
    """Each group as (parameter names, every option but 'params'), in order."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    return [([names[id(p)] for p in g['params']],
             {k: v for k, v in g.items() if k != 'params'})
            for g in wrapper.optimizer.param_groups]


def both(model_factory, cfg):
    """(MMEngine's wrapper, ours, the plug-in's) built from one config on equal models."""
    models = [model_factory() for _ in range(3)]
    theirs = mo.build_optim_wrapper(models[0], copy.deepcopy(cfg))
    ours = fp16utils.build_optim_wrapper(models[1], copy.deepcopy(cfg))
    plug = mo.build_optim_wrapper(models[2], dict(copy.deepcopy(cfg),
                                                  constructor='Fp16utilsOptimWrapperConstructor'))
    return models, (theirs, ours, plug)


@pytest.mark.parametrize('name', list(PARAMWISE))
@pytest.mark.parametrize('optimizer', [dict(type='SGD', lr=LR, momentum=0.9, weight_decay=WD),
                                       dict(type='AdamW', lr=LR, weight_decay=WD)])
def test_param_groups_equal_mmengines(name, optimizer):
    cfg = dict(optimizer=optimizer, paramwise_cfg=PARAMWISE[name])
    models, wrappers = both(Model, cfg)
    want = described(models[0], wrappers[0])
    assert described(models[1], wrappers[1]) == want
    assert described(models[2], wrappers[2]) == want
    assert [w.get_lr() for w in wrappers[1:]] == [wrappers[0].get_lr()] * 2
    assert [w.get_momentum() for w in wrappers[1:]] == [wrappers[0].get_momentum()] * 2
    assert len(wrappers[1].param_groups) == len(wrappers[0].param_groups)
    assert wrappers[1].base_param_settings.keys() == wrappers[0].base_param_settings.keys() \
        if wrappers[0].base_param_settings else wrappers[1].base_param_settings is None


def test_dcn_and_bypass_duplicate_equal_mmengines(fake_mmcv):
    cfg = dict(optimizer=dict(type='SGD', lr=LR, weight_decay=WD),
               paramwise_cfg=dict(dcn_offset_lr_mult=0.1, bias_lr_mult=2.0,
                                  bias_decay_mult=0.5, flat_decay_mult=0.0,
                                  bypass_duplicate=True))
    models, wrappers = both(lambda: Model(dcn=True, shared=True), cfg)
    want = described(models[0], wrappers[0])
    assert any(names == ['dcn.conv_offset.weight'] and opts['lr'] == LR * 0.1
               for names, opts in want)
    assert described(models[1], wrappers[1]) == want
    assert described(models[2], wrappers[2]) == want


@pytest.mark.parametrize('paramwise, error', [
    (dict(norm_decay_mult=0.0), ValueError),
    (dict(custom_keys={'bn': dict(decay_mult=0.0)}), ValueError),
    (dict(custom_keys=[]), TypeError),
    ([], TypeError),
])
def test_bad_configs_raise_the_same_exception_type(paramwise, error):
    cfg = dict(optimizer=dict(type='SGD', lr=LR), paramwise_cfg=paramwise)
    with pytest.raises(error):
        mo.build_optim_wrapper(Model(), copy.deepcopy(cfg))
    with pytest.raises(error):
        fp16utils.build_optim_wrapper(Model(), copy.deepcopy(cfg))


def test_schedulers_drive_base_lr_the_same(tmp_path):
    cfg = dict(optimizer=dict(type='SGD', lr=LR, momentum=0.9, weight_decay=WD),
               paramwise_cfg=dict(bias_lr_mult=2.0))
    models, wrappers = both(Model, cfg)
    theirs, _, plug = wrappers
    schedulers = [[mo.MultiStepLR(w, milestones=[1, 2], gamma=0.5, by_epoch=False),
                   mo.MultiStepMomentum(w, milestones=[2], gamma=0.5, by_epoch=False)]
                  for w in (theirs, plug)]
    for _ in range(3):
        for pair in schedulers:
            for s in pair:
                s.step()
        assert plug.get_lr() == theirs.get_lr()
        assert plug.get_momentum() == theirs.get_momentum()
    assert theirs.get_lr()['base_lr'] == [LR * 0.25]
    state = [s.state_dict() for s in schedulers[1]]
    assert state[0]['base_values'] == [s.state_dict() for s in schedulers[0]][0]['base_values']


def train_pair(theirs, ours, models, steps, loss_of, max_counts=None):
    """Step both; return whether each step updated, and check the parameters match."""
    if max_counts:
        for w, m in zip((theirs, ours), models):
            w.initialize_count_status(m, 0, max_counts)
    updates = []
    for i in range(steps):
        flags = []
        for w, m in zip((theirs, ours), models):
            w.update_params(loss_of(m, i))
            flags.append(w.should_update())
        assert flags[0] == flags[1], i
        updates.append(flags[0])
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b), i
    return updates


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def loss_fn(model, i):
    g = torch.Generator().manual_seed(i)
    return model(torch.randn(3, 4, generator=g)).pow(2).mean()


@pytest.mark.parametrize('counts, max_counts', [(1, None), (3, None), (3, 7), (4, 10)])
def test_accumulation_updates_and_divides_the_same(counts, max_counts):
    models = [mlp(), mlp()]
    theirs = mo.OptimWrapper(torch.optim.SGD(models[0].parameters(), lr=0.1),
                             accumulative_counts=counts, clip_grad=dict(max_norm=0.5))
    ours = fp16utils.OptimWrapper(torch.optim.SGD(models[1].parameters(), lr=0.1),
                                  accumulative_counts=counts, clip_grad=dict(max_norm=0.5))
    updates = train_pair(theirs, ours, models, max_counts or 9, loss_fn, max_counts)
    assert sum(updates) == ((max_counts or 9) + counts - 1) // counts if max_counts \
        else sum(updates) == 9 // counts
    assert theirs.inner_count == ours.inner_count
    for value in (torch.tensor(6.0),):
        assert theirs.scale_loss(value) == ours.scale_loss(value)


def test_state_dict_keys_and_round_trips_both_ways():
    cfg = dict(optimizer=dict(type='SGD', lr=LR, momentum=0.9),
               paramwise_cfg=dict(bias_lr_mult=2.0))
    models, (theirs, ours, plug) = both(mlp, cfg)
    for w, m in zip((theirs, ours), models):
        w.update_params(loss_fn(m, 0))
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {
        'state', 'param_groups', 'base_param_settings'}
    plug.load_state_dict(copy.deepcopy(theirs.state_dict()))
    assert plug.get_lr() == theirs.get_lr()
    assert described(models[2], plug) == described(models[0], theirs)
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert theirs.get_lr() == ours.get_lr()


@pytest.fixture
def cpu_mmengine_amp(monkeypatch):
    """MMEngine's AmpOptimWrapper on the CPU: its device check passes, its GradScaler is CPU's."""
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(amp_optimizer_wrapper, 'GradScaler',
                        lambda **kw: torch.amp.GradScaler('cpu', **kw))


@pytest.mark.parametrize('loss_scale', ['dynamic', 512.0,
                                        dict(init_scale=1024.0, growth_interval=2)])
def test_skip_and_scale_match_mmengines(cpu_mmengine_amp, loss_scale):
    """The same losses (float32 forward, infs at steps 1 and 4): same skips, scales, params."""
    models = [mlp(), mlp()]
    theirs = mo.AmpOptimWrapper(copy.deepcopy(loss_scale),
                                optimizer=torch.optim.SGD(models[0].parameters(), lr=0.1))
    ours = fp16utils.AmpOptimWrapper(copy.deepcopy(loss_scale),
                                     optimizer=torch.optim.SGD(models[1].parameters(), lr=0.1))

    def poisoned(model, i):
        loss = loss_fn(model, i)
        return loss * float('inf') if i in (1, 4) else loss

    for i in range(7):
        for w, m in zip((theirs, ours), models):
            w.update_params(poisoned(m, i))
        assert ours.loss_scale == theirs.loss_scaler.get_scale(), i
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b), i
    assert ours.skipped_steps == 2
    theirs_state, ours_state = theirs.state_dict(), ours.state_dict()
    assert ours_state['loss_scaler'] == theirs_state['loss_scaler']
    assert set(ours_state) - set(theirs_state) == {'fp16_stats'}
    # and each loads the other's
    fresh = fp16utils.AmpOptimWrapper(optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))
    fresh.load_state_dict(theirs_state)
    assert fresh.loss_scale == theirs.loss_scaler.get_scale()
    other = mo.AmpOptimWrapper(optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))
    other.load_state_dict(copy.deepcopy(ours_state))
    assert other.loss_scaler.get_scale() == ours.loss_scale



def test_a_state_with_a_scale_policy_loads_in_mmengines_wrapper(cpu_mmengine_amp):
    """MMEngine's AmpOptimWrapper (its GradScaler) loads a state written with hysteresis
    and a floor: it reads its own keys, and its scale is ours."""
    model = mlp()
    ours = fp16utils.AmpOptimWrapper(
        dict(init_scale=1024.0, growth_interval=2, hysteresis=2, min_scale=8.0),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for i in range(4):
        loss = loss_fn(model, i)
        ours.update_params(loss * float('inf') if i in (1, 2) else loss)
    assert ours.loss_scale == 512.0  # the first overflow was tolerated
    state = copy.deepcopy(ours.state_dict())
    assert state['loss_scaler']['cur_hysteresis'] == 1
    theirs = mo.AmpOptimWrapper(optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))
    theirs.load_state_dict(state)
    assert theirs.loss_scaler.get_scale() == 512.0

def test_optim_wrapper_dicts_agree():
    gens = [mlp(), mlp()]
    discs = [nn.Linear(2, 1), nn.Linear(2, 1)]
    theirs = mo.OptimWrapperDict(
        generator=mo.build_optim_wrapper(gens[0], dict(
            optimizer=dict(type='Adam', lr=1e-4), paramwise_cfg=dict(bias_lr_mult=2.0))),
        discriminator=mo.OptimWrapper(torch.optim.SGD(discs[0].parameters(), lr=0.1,
                                                      momentum=0.5)))
    ours = fp16utils.OptimWrapperDict(
        generator=fp16utils.build_optim_wrapper(gens[1], dict(
            optimizer=dict(type='Adam', lr=1e-4), paramwise_cfg=dict(bias_lr_mult=2.0))),
        discriminator=fp16utils.OptimWrapper(torch.optim.SGD(discs[1].parameters(), lr=0.1,
                                                             momentum=0.5)))
    assert ours.get_lr() == theirs.get_lr()
    assert ours.get_momentum() == theirs.get_momentum()
    assert {k: len(v) for k, v in ours.param_groups.items()} == \
        {k: len(v) for k, v in theirs.param_groups.items()}
    assert set(ours.state_dict()) == set(theirs.state_dict())
    for m in gens + discs:
        m(torch.ones(1, m[0].in_features if isinstance(m, nn.Sequential) else 2)).sum().backward()
    theirs.zero_grad()
    ours.zero_grad()
    assert all(p.grad is None for m in gens + discs for p in m.parameters())
    with pytest.raises(NotImplementedError):
        ours.update_params(torch.tensor(1.0))
    with pytest.raises(NotImplementedError):
        theirs.update_params(torch.tensor(1.0))


class logger_records:
    """Collect the records a logger emits inside the block; fail when none."""

    def __init__(self, logger):
        import logging
        self.logger, self.records = logger, []
        self.handler = logging.Handler()
        self.handler.emit = self.records.append

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self.records

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        assert exc[0] is not None or self.records, 'nothing was logged'


def test_plugin_classes_are_what_mmengine_checks_for():
    model = mlp()
    wrapper = plugin.Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(),
                                                                        lr=0.1))
    assert isinstance(wrapper, mo.OptimWrapper) and isinstance(wrapper, mo.BaseOptimWrapper)
    assert isinstance(wrapper, fp16utils.AmpOptimWrapper)
    assert wrapper._accumulative_counts == 1 and wrapper.clip_grad_kwargs is None
    assert (wrapper._max_counts, wrapper._remainder_counts) == (-1, -1)
    wrapper.initialize_count_status(model, 0, 7)
    assert (wrapper._max_counts, wrapper._remainder_counts) == (7, 0)
    clipped = plugin.Fp16utilsOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                                           accumulative_counts=3, clip_grad=dict(max_norm=1))
    assert clipped.clip_grad_kwargs['max_norm'] == 1 and 'type' not in clipped.clip_grad_kwargs
    assert clipped._accumulative_counts == 3
    from mmengine.logging import MMLogger
    logger = MMLogger.get_instance('fp16utils-differential')
    with logger_records(logger) as records:
        clipped.initialize_count_status(model, 2, 9)  # the warning reaches the run's log
    assert any('Resumed iteration number 2' in r.getMessage() for r in records)
    wrappers = plugin.Fp16utilsOptimWrapperDict(g=wrapper)
    assert isinstance(wrappers, mo.OptimWrapperDict)
    from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS
    assert OPTIM_WRAPPERS.get('Fp16utilsAmpOptimWrapper') is plugin.Fp16utilsAmpOptimWrapper
    assert OPTIM_WRAPPERS.get('AmpOptimWrapper') is mo.AmpOptimWrapper  # theirs untouched
    assert OPTIM_WRAPPER_CONSTRUCTORS.get('Fp16utilsMultiOptimWrapperConstructor') is \
        plugin.Fp16utilsMultiOptimWrapperConstructor
