"""MMEngine's contract for the 1.x wrappers, without MMEngine: paramwise_cfg, base_lr,
OptimWrapperDict's whole-dict calls, AmpOptimWrapper's arguments.

The same cases run against MMEngine itself in ``tests/mmengine`` (the differential tier).
"""

from __future__ import annotations

import copy
import logging

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper, OptimWrapper, OptimWrapperDict, build_optim_wrapper

LR, WD = 0.01, 1e-4


FakeDeformConv2d = R.DeformConv2d


class Model(nn.Module):
    """Every kind of parameter the options tell apart."""

    def __init__(self, dcn=False):
        super().__init__()
        self.param1 = nn.Parameter(torch.ones(1))                     # flat, top level
        self.conv1 = nn.Conv2d(3, 4, 1, bias=False)                   # conv weight
        self.conv2 = nn.Conv2d(4, 2, 1)                               # conv weight + bias
        self.bn = nn.BatchNorm2d(2)                                   # norm
        self.sub = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2),        # depthwise conv
                                 nn.GroupNorm(1, 2), nn.Linear(2, 2), nn.LayerNorm(2))
        self.frozen = nn.Linear(2, 2)
        self.frozen.weight.requires_grad_(False)
        if dcn:
            self.dcn = FakeDeformConv2d()


def groups_by_name(model, wrapper):
    """{parameter name: (lr, weight_decay)} of the groups the wrapper's optimizer holds."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            out[names[id(p)]] = (group['lr'], group['weight_decay'])
    return out


def build(model, paramwise_cfg, **opt):
    return build_optim_wrapper(model, dict(
        optimizer=dict(type='SGD', lr=LR, momentum=0.9, weight_decay=WD, **opt),
        paramwise_cfg=paramwise_cfg))


def test_no_paramwise_cfg_gives_one_group():
    wrapper = build(Model(), None)
    assert len(wrapper.optimizer.param_groups) == 1
    assert wrapper.base_param_settings is None and wrapper.get_lr() == {'lr': [LR]}
    assert len(build(Model(), {}).optimizer.param_groups) == 1


def test_groups_hold_only_what_a_rule_sets_the_optimizer_fills_the_rest():
    from fp16utils.optim.constructor import check_paramwise_cfg, paramwise_groups

    assert check_paramwise_cfg(None, dict(lr=0.1), 'optim_wrapper') == {}
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    cfg = check_paramwise_cfg(dict(norm_decay_mult=0.0, bias_lr_mult=2.0),
                              dict(lr=0.1, weight_decay=1e-4), 'optim_wrapper')
    groups = paramwise_groups(model, cfg, 0.1, 1e-4)
    assert [(g.get('lr'), g.get('weight_decay')) for g in groups] == [
        (None, None), (0.2, None), (None, 0.0), (None, 0.0)]
    groups = paramwise_groups(nn.Linear(2, 1), dict(bias_decay_mult=0.0), 0.1, 0.5)
    assert [g.get('weight_decay') for g in groups] == [None, 0.0]


def test_every_option_sets_what_mmengine_sets():
    model = Model()
    cfg = dict(bias_lr_mult=2.0, bias_decay_mult=0.5, norm_decay_mult=0.0,
               dwconv_decay_mult=0.1, flat_decay_mult=0.3)
    got = groups_by_name(model, build(model, cfg))
    assert got == {
        'param1': (LR, WD * 0.3),               # one-dimensional
        'conv1.weight': (LR, WD),
        'conv2.weight': (LR, WD),
        'conv2.bias': (LR * 2, WD * 0.5),       # bias: both multipliers
        'bn.weight': (LR, WD * 0.0),            # norm: decay mult, no bias lr mult
        'bn.bias': (LR, WD * 0.0),
        'sub.0.weight': (LR, WD * 0.1),         # depthwise conv
        'sub.0.bias': (LR * 2, WD * 0.5),       # bias decay comes before dwconv decay
        'sub.1.weight': (LR, 0.0), 'sub.1.bias': (LR, 0.0),
        'sub.2.weight': (LR, WD), 'sub.2.bias': (LR * 2, WD * 0.5),
        'sub.3.weight': (LR, 0.0), 'sub.3.bias': (LR, 0.0),
        'frozen.bias': (LR * 2, WD * 0.5),      # frozen.weight is left out
    }


def test_custom_keys_longest_then_alphabetical_and_copied_into_the_group():
    model = Model()
    cfg = dict(bias_lr_mult=2.0, custom_keys={
        'sub': dict(lr_mult=0.1, decay_mult=0.2),
        'sub.2': dict(lr_mult=0.5),                       # longer: wins for sub.2.*
        'conv': dict(lr_mult=3.0), 'bn': dict(decay_mult=0.0, momentum=0.5)})
    wrapper = build(model, cfg)
    got = groups_by_name(model, wrapper)
    assert got['sub.0.bias'] == (LR * 0.1, WD * 0.2)       # no bias_lr_mult on top
    assert got['sub.2.weight'] == (LR * 0.5, WD)
    assert got['conv2.bias'] == (LR * 3.0, WD)
    assert got['bn.weight'] == (LR, 0.0)
    bn_group = next(g for g in wrapper.optimizer.param_groups
                    if g['params'][0] is model.bn.weight)
    assert bn_group['momentum'] == 0.5 and bn_group['decay_mult'] == 0.0
    assert got['param1'] == (LR, WD)


def test_dcn_offset_lr_mult_and_dcn_exclusions():
    model = Model(dcn=True)
    cfg = dict(dcn_offset_lr_mult=0.1, bias_lr_mult=2.0, bias_decay_mult=0.5,
               flat_decay_mult=0.0)
    got = groups_by_name(model, build(model, cfg))
    assert got['dcn.conv_offset.weight'] == (LR * 0.1, WD)
    assert got['dcn.conv_offset.bias'] == (LR * 0.1, WD)   # inside a DCN: no bias options
    assert got['dcn.bias'] == (LR * 2, WD * 0.5)           # the DCN's own bias is a bias


def test_bypass_duplicate_and_shared_modules(caplog):
    model = Model()
    model.shared = nn.Sequential(model.conv2)             # one module, two parents
    with pytest.raises(ValueError, match='more than one parameter group'):
        build(model, dict(bias_lr_mult=2.0))
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        wrapper = build(model, dict(bias_lr_mult=2.0, bypass_duplicate=True))
    params = [p for g in wrapper.optimizer.param_groups for p in g['params']]
    assert len(params) == len({id(p) for p in params}) == 15
    assert any('duplicate' in r.getMessage() for r in caplog.records)
    assert any('requires_grad=False' in r.getMessage() for r in caplog.records)


def test_decay_options_need_weight_decay_and_lr_options_need_lr():
    model = Model()
    for cfg in (dict(norm_decay_mult=0.0), dict(custom_keys={'bn': dict(decay_mult=0.0)})):
        with pytest.raises(ValueError, match='no weight_decay'):
            build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=LR),
                                            paramwise_cfg=cfg))
    with pytest.raises(ValueError, match='no lr to multiply'):
        build_optim_wrapper(model, dict(optimizer=dict(type='Adam'),
                                        paramwise_cfg=dict(bias_lr_mult=2.0)))
    with pytest.raises(TypeError, match='custom_keys must be a dict'):
        build(model, dict(custom_keys=[('bn', {})]))
    wrapper = build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=LR),
                                              paramwise_cfg=dict(flat_decay_mult=0.0)))
    assert {g['weight_decay'] for g in wrapper.optimizer.param_groups} == {0}


def test_multi_constructor_takes_paramwise_cfg_per_entry():
    gan = nn.ModuleDict(dict(generator=Model(), discriminator=nn.Linear(2, 1)))
    wrappers = build_optim_wrapper(gan, _caps.on_this_cpu(dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(type='AmpOptimWrapper', paramwise_cfg=dict(bias_lr_mult=2.0),
                       optimizer=dict(type='Adam', lr=1e-4)),
        discriminator=dict(optimizer=dict(type='SGD', lr=4e-4)))))
    lr = wrappers.get_lr()
    assert list(lr) == ['generator.base_lr', 'generator.lr', 'discriminator.lr']
    assert lr['generator.base_lr'] == [1e-4] and lr['discriminator.lr'] == [4e-4]
    assert sorted(set(lr['generator.lr'])) == [1e-4, 2e-4]
    assert isinstance(wrappers['generator'], AmpOptimWrapper)


# ------------------------------------------------------------------ base_param_settings


def test_base_param_settings_follow_mmengine():
    model = Model()
    wrapper = build(model, dict(bias_lr_mult=2.0))
    base = wrapper.base_param_settings
    assert base['lr'] == LR and base['weight_decay'] == WD and base['momentum'] == 0.9
    assert base['params'].tolist() == [0.0]
    groups = wrapper.param_groups
    assert len(groups) == len(wrapper.optimizer.param_groups) + 1 and groups[-1] is base
    lr = wrapper.get_lr()
    assert list(lr) == ['base_lr', 'lr'] and lr['base_lr'] == [LR]
    for group in wrapper.param_groups:  # what a param scheduler does
        group['lr'] *= 0.5
    assert wrapper.get_lr()['base_lr'] == [LR * 0.5]
    state = wrapper.state_dict()
    assert state['base_param_settings'] is base
    other = build(Model(), dict(bias_lr_mult=2.0))
    other.load_state_dict(copy.deepcopy(state))
    assert other.get_lr() == wrapper.get_lr()
    assert other.base_param_settings['lr'] == LR * 0.5
    assert 'base_param_settings' not in other.optimizer.state_dict()


def test_one_group_has_no_base_settings_and_an_unchanged_state():
    model = R.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    assert wrapper.base_param_settings is None
    assert wrapper.param_groups is wrapper.optimizer.param_groups
    assert set(wrapper.state_dict()) == {'state', 'param_groups'}


# ------------------------------------------------------------------ OptimWrapperDict


def test_optim_wrapper_dict_whole_dict_calls():
    gan = nn.ModuleDict(dict(generator=Model(), discriminator=nn.Linear(2, 1)))
    g = build(gan['generator'], dict(bias_lr_mult=2.0))
    d = OptimWrapper(torch.optim.SGD(gan['discriminator'].parameters(), lr=0.1))
    wrappers = OptimWrapperDict(generator=g, discriminator=d)
    assert wrappers.param_groups == {'generator': g.param_groups,
                                     'discriminator': d.param_groups}
    assert list(wrappers.get_lr()) == ['generator.base_lr', 'generator.lr', 'discriminator.lr']
    gan['generator'].conv1.weight.grad = torch.ones_like(gan['generator'].conv1.weight)
    gan['discriminator'].weight.grad = torch.ones_like(gan['discriminator'].weight)
    wrappers.zero_grad()
    for grad in (gan['generator'].conv1.weight.grad, gan['discriminator'].weight.grad):
        assert grad is None or not grad.any()  # torch's default set_to_none differs by version


# ------------------------------------------------------------------ AmpOptimWrapper arguments


def test_amp_arguments_in_mmengine_order_and_the_optimizer_first():
    _caps.require(torch.float16, 'native')  # the default dtype, with its GradScaler
    model = R.Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert AmpOptimWrapper(optimizer=sgd).loss_scale == 65536.0
    assert AmpOptimWrapper(512.0, optimizer=sgd).loss_scale == 512.0
    positional = AmpOptimWrapper(dict(init_scale=8.0), 'bfloat16', False, optimizer=sgd)
    assert positional.dtype == torch.bfloat16 and positional.loss_scale == 1.0
    assert AmpOptimWrapper(loss_scale=64.0, optimizer=sgd).loss_scale == 64.0
    assert AmpOptimWrapper(sgd, loss_scale=32.0).loss_scale == 32.0  # this package's form
    with pytest.raises(TypeError, match="multiple values for argument 'loss_scale'"):
        AmpOptimWrapper(32.0, loss_scale=64.0, optimizer=sgd)
    with pytest.raises(TypeError, match='two optimizers'):
        AmpOptimWrapper(sgd, optimizer=sgd)
    with pytest.raises(TypeError, match='needs the optimizer'):
        AmpOptimWrapper(512.0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['scale'\]"):
        AmpOptimWrapper(optimizer=sgd, scale=2.0)
    with pytest.raises(TypeError, match='use_fsdp must be True or False'):
        AmpOptimWrapper(optimizer=sgd, use_fsdp='yes')


def test_cast_dtype_is_the_argument_as_mmengine_keeps_it():
    _caps.require(torch.float16, 'native')  # the default dtype
    sgd = torch.optim.SGD(R.Net().parameters(), lr=0.1)
    assert AmpOptimWrapper(optimizer=sgd).cast_dtype is None
    assert AmpOptimWrapper(optimizer=sgd).dtype == torch.float16
    assert AmpOptimWrapper(optimizer=sgd, dtype='bfloat16').cast_dtype == torch.bfloat16
    assert AmpOptimWrapper(optimizer=sgd, dtype=torch.float16).cast_dtype == torch.float16


@pytest.mark.parametrize('dtype', ['float32', 'float64', torch.float64])
def test_full_precision_dtypes_run_without_autocast_or_scaling(dtype):
    model = R.Net()
    if dtype != 'float32':
        model = model.double()
    wrapper = AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              dtype=dtype)
    param_dtype = next(model.parameters()).dtype
    x = torch.ones(2, 8, dtype=param_dtype)
    with torch.autocast('cpu', dtype=torch.bfloat16):       # even inside an outer autocast
        with wrapper.optim_context(model):
            out = model(x)
    assert out.dtype == param_dtype
    before = [p.detach().clone() for p in model.parameters()]
    wrapper.update_params(out.sum())
    assert wrapper.loss_scale == 1.0  # the state saved says what a scaled run would start at:
    assert wrapper.state_dict()['loss_scaler'] == dict(
        scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
        _growth_tracker=0)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_full_precision_is_refused_on_the_legacy_backend():
    model = R.Net()
    with pytest.raises(ValueError, match='legacy backend runs a float16 or bfloat16 model'):
        AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        dtype='float32', backend='legacy', model=model)
    assert next(model.parameters()).dtype == torch.float32


def test_use_fsdp_without_a_process_group_steps_as_usual():
    model = R.Net()
    wrapper = build_optim_wrapper(model, _caps.on_this_cpu(dict(
        type='AmpOptimWrapper', use_fsdp=True, optimizer=dict(type='SGD', lr=0.1))))
    assert wrapper.use_fsdp is True
    for x, y in R.make_data(3):
        with wrapper.optim_context(model):
            loss = R.mse(model, (x, y))
        wrapper.update_params(loss)
    assert wrapper.skipped_steps == 0


# ------------------------------------------------------------------ convert_config(plugin=True)

FIXTURES = R.__file__.rsplit('/', 1)[0] + '/fixtures/legacy_codebase/configs'
MMDET_0X = dict(
    optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=1e-4,
                   paramwise_cfg=dict(norm_decay_mult=0.0, bias_lr_mult=2.0,
                                      custom_keys={'sub': dict(lr_mult=0.1)})),
    optimizer_config=dict(grad_clip=dict(max_norm=35, norm_type=2)),
    fp16=dict(loss_scale='dynamic'))


def test_converted_configs_build_here_with_and_without_the_plugin_names():
    import runpy

    _caps.require(torch.float16, 'native')  # the converted configs train in float16

    from fp16utils import convert_config
    biggan = {k: v for k, v in runpy.run_path(f'{FIXTURES}/biggan_128x128_fp16.py').items()
              if not k.startswith('__')}
    gan = nn.ModuleDict(dict(generator=Model(), discriminator=nn.Linear(2, 1)))
    for plugin in (False, True):
        new = convert_config(biggan, plugin=plugin)
        wrappers = build_optim_wrapper(gan, new['optim_wrapper'])
        assert [w.loss_scale for w in wrappers.values()] == [512.0, 512.0]
        assert [w.accumulative_counts for w in wrappers.values()] == [8, 8]
        assert ('custom_imports' in new) is plugin
    new = convert_config(biggan, plugin=True)
    assert new['custom_imports'] == dict(imports=['fp16utils.mmengine'],
                                         allow_failed_imports=False)
    assert new['optim_wrapper']['constructor'] == 'Fp16utilsMultiOptimWrapperConstructor'
    assert new['optim_wrapper']['generator']['type'] == 'Fp16utilsAmpOptimWrapper'
    model = Model()
    plain = build_optim_wrapper(model, convert_config(MMDET_0X)['optim_wrapper'])
    mmdet = convert_config(MMDET_0X, plugin=True)
    assert mmdet['optim_wrapper']['constructor'] == 'Fp16utilsOptimWrapperConstructor'
    assert mmdet['optim_wrapper']['paramwise_cfg']['bias_lr_mult'] == 2.0
    plugged = build_optim_wrapper(model, mmdet['optim_wrapper'])
    assert type(plugged) is AmpOptimWrapper and plugged.clip_grad['max_norm'] == 35
    assert groups_by_name(model, plugged) == groups_by_name(model, plain)
    assert groups_by_name(model, plugged)['sub.2.bias'] == (0.02 * 0.1, 1e-4)
    assert groups_by_name(model, plugged)['conv2.bias'] == (0.02 * 2.0, 1e-4)
