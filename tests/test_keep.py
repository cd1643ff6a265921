"""keep_fp32: float32 submodules named by pattern, class or class name, and its users."""

import copy
import logging

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from _roundtrip import pickle_roundtrip, torch_save_roundtrip
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    auto_fp16,
    build_optim_wrapper,
    find_overflow,
    force_fp32,
    keep_fp32,
    kept_fp32,
    wrap_fp16_model,
)

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
LOW = _caps.LOW


class DeformConv2d(nn.Module):
    """A stand-in with the name of mmcv's op (matched by class name)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class MyDeform(DeformConv2d):
    """A subclass: matched by its base's name along the MRO."""


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls = nn.Linear(4, 3)
        self.reg = nn.Linear(4, 2)

    def forward(self, x):
        return self.cls(x), self.reg(x)


class Net(nn.Module):
    """Runs under autocast with its LayerNorm kept in float32: autocast on the CPU of older
    torch cannot feed float32 norm weights low-precision inputs (that is what keep_fp32
    is for); the tests that run it name nn.LayerNorm among the kept modules."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), MyDeform())
        self.roi_head = Head()

    def forward(self, x):
        return self.roi_head(self.backbone(x))


class Decorated(nn.Module):
    """A forward decorated with @auto_fp16 (flag on) and a @force_fp32 method."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fp16_enabled = True
        self.fp16_dtype = LOW

    @auto_fp16()
    def forward(self, x):
        return self.fc(x)


class Forced(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fp16_enabled = True

    @force_fp32(out_fp16=True)
    def forward(self, x):
        return self.fc(x)


class Big(nn.Module):
    """Multiplies past float16's range: inf in float16, finite in float32."""

    def forward(self, x):
        return x * 1e5


class Overflowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Identity()
        self.big = Big()

    def forward(self, x):
        return self.big(self.stem(x))


def autocast(dtype=LOW):
    return torch.autocast('cpu', dtype=dtype)


def x4(n=2):
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------ matching


@pytest.mark.parametrize('modules, expected', [
    ('roi_head.*', ['roi_head.cls', 'roi_head.reg']),
    (['backbone.1'], ['backbone.1']),
    (nn.LayerNorm, ['backbone.1']),
    ('LayerNorm', ['backbone.1']),
    ('DeformConv2d', ['backbone.2']),         # a stand-in of that name, by its base
    (DeformConv2d, ['backbone.2']),           # subclasses match a class
    (['roi_head', 'roi_head.cls'], ['roi_head', 'roi_head.cls']),
    (('backbone.?', nn.Linear), ['backbone.0', 'backbone.1', 'backbone.2', 'backbone.2.fc',
                                 'roi_head.cls', 'roi_head.reg']),
])
def test_patterns_classes_and_class_names_pick_the_modules(modules, expected):
    model = Net()
    assert keep_fp32(model, modules) is model
    assert kept_fp32(model) == expected


def test_kept_module_runs_in_float32_under_autocast_and_others_do_not():
    model = Net()
    keep_fp32(model, ['roi_head.reg', nn.LayerNorm])
    with autocast():
        cls, reg = model(x4())
    assert cls.dtype == LOW and reg.dtype == F32
    ref = copy.deepcopy(model)
    # float32 exactly: the same as the module run in float32 outside autocast.
    with autocast():
        feat = model.backbone(x4())
    with torch.no_grad():
        expected = nn.functional.linear(feat.float(), ref.roi_head.reg.weight,
                                        ref.roi_head.reg.bias)
        with autocast():
            got = model.roi_head.reg(feat)
    assert got.dtype == F32 and torch.equal(got, expected)


def test_half_inputs_are_cast_and_other_inputs_left_alone():
    seen = {}

    class Probe(nn.Module):
        def forward(self, x, idx, scale=1.0, extra=None):
            seen.update(x=x.dtype, idx=idx.dtype, extra=extra.dtype,
                        autocast=_caps.autocast_now()[0])
            return x * scale

    probe = keep_fp32(Probe(), 'Probe')
    with autocast():
        out = probe(torch.ones(2, dtype=LOW), torch.arange(2), scale=2.0,
                    extra=torch.ones(1, dtype=LOW))
    assert seen == dict(x=F32, idx=torch.int64, extra=F32, autocast=False)
    assert out.dtype == F32 and out.tolist() == [2.0, 2.0]


def test_applying_twice_does_not_wrap_twice_and_state_dict_keys_are_unchanged():
    model = Net()
    keys = list(model.state_dict())
    keep_fp32(model, ['roi_head.*', 'backbone.1'])
    first = model.roi_head.cls.forward
    keep_fp32(model, ['roi_head.cls', nn.Linear])
    assert model.roi_head.cls.forward is first
    assert list(model.state_dict()) == keys
    with autocast():
        assert model(x4())[0].dtype == F32


def test_an_already_patched_instance_forward_is_kept_inside():
    gn = nn.GroupNorm(1, 4)
    calls = []

    def forward(x):
        calls.append(x.dtype)
        return nn.GroupNorm.forward(gn, x)

    gn.forward = forward
    keep_fp32(gn, '*')
    with autocast():
        out = gn(torch.ones(2, 4, 3, dtype=LOW))
    assert calls == [F32] and out.dtype == F32


@pytest.mark.parametrize('cls', [Decorated, Forced])
def test_decorated_forwards_run_in_float32(cls):
    module = cls()
    ref = copy.deepcopy(module)
    keep_fp32(module, cls)
    x = x4()
    with autocast():
        out = module(x.to(LOW))
    assert out.dtype == F32  # @auto_fp16 / out_fp16 would have made it low precision
    with torch.no_grad():
        expected = ref.fc(x.to(LOW).float())
    assert torch.equal(out.detach(), expected)


# ----------------------------------------------------------------- refusals


def test_a_pattern_that_matches_nothing_is_an_error_naming_it_and_changes_nothing():
    model = Net()
    with pytest.raises(ValueError, match=r"'roi_haed\.\*' matches no module.*'backbone'"):
        keep_fp32(model, ['roi_head.*', 'roi_haed.*'])
    assert kept_fp32(model) == []
    with pytest.raises(ValueError, match='DeformConv3d.*Head'):
        keep_fp32(model, 'DeformConv3d')
    with pytest.raises(ValueError, match='Conv2d matches no module'):
        keep_fp32(model, nn.Conv2d)
    assert kept_fp32(model) == []


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError, match='nn.Module subclass'):
        keep_fp32(Net(), [3])
    with pytest.raises(TypeError, match='nn.Module subclass'):
        keep_fp32(Net(), [int])
    with pytest.raises(TypeError, match='model must be an nn.Module'):
        keep_fp32('model', 'x')


# ------------------------------------------------------------- copies, compile


@pytest.mark.parametrize('roundtrip', [copy.deepcopy, pickle_roundtrip, torch_save_roundtrip])
def test_copies_keep_float32_forwards_that_run_the_copy(roundtrip):
    model = keep_fp32(Net(), ['roi_head.reg', 'DeformConv2d', 'LayerNorm'])
    clone = roundtrip(model)
    assert kept_fp32(clone) == ['backbone.1', 'backbone.2', 'roi_head.reg']
    assert clone.roi_head.reg.forward.owner is clone.roi_head.reg
    with torch.no_grad():
        clone.roi_head.reg.weight.add_(1.0)  # the copy's forward must use the copy's weights
        with autocast():
            _, reg = clone(x4())
            _, ref = model(x4())
    assert reg.dtype == F32 and not torch.equal(reg, ref)
    assert list(clone.state_dict()) == list(model.state_dict())


def test_compiles_fullgraph_without_graph_breaks():
    try:
        import torch._dynamo
        torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))
    except Exception as err:  # noqa: BLE001 - whatever stops it: no torch.compile here
        pytest.skip(f'torch.compile does not run here: {str(err).splitlines()[0]}')
    torch._dynamo.reset()
    why = _caps.fullgraph_autocast_state_lacks()
    if why is not None:
        pytest.skip(why)
    model = keep_fp32(Net(), ['roi_head.reg', nn.LayerNorm])

    def run(x):
        with torch.autocast('cpu', dtype=LOW):
            return model(x)

    explained = torch._dynamo.explain(run)(x4())
    assert explained.graph_break_count == 0, explained.break_reasons
    cls, reg = torch.compile(run, fullgraph=True, backend='eager')(x4())
    ref_cls, ref_reg = run(x4())
    assert (cls.dtype, reg.dtype) == (LOW, F32)
    assert torch.equal(reg, ref_reg) and torch.equal(cls, ref_cls)
    torch._dynamo.reset()


# ------------------------------------------------------------ wrap_fp16_model


def test_wrap_fp16_model_native_keeps_the_named_modules_in_float32():
    _caps.require(LOW, 'native', scaled=False)
    model = wrap_fp16_model(Net(), dtype=LOW, backend='native',
                            fp32_modules=['roi_head.cls', 'LayerNorm'])
    assert kept_fp32(model) == ['backbone.1', 'roi_head.cls']
    assert model.roi_head.cls.weight.dtype == F32
    with autocast():
        cls, reg = model(x4())
    assert (cls.dtype, reg.dtype) == (F32, LOW)


def test_wrap_fp16_model_legacy_keeps_float32_weights_and_feeds_half_layers_after():
    low = _caps.LEGACY_LOW
    model = Net()
    model.backbone.add_module('3', nn.Linear(4, 4))  # a half layer after the kept one
    wrap_fp16_model(model, dtype=low, backend='legacy', fp32_modules=['DeformConv2d'])
    deform = model.backbone[2]
    assert {p.dtype for p in deform.parameters()} == {F32}
    assert model.backbone[0].weight.dtype == low and model.backbone[3].weight.dtype == low
    seen = []
    deform.fc.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    cls, _ = model(x4().to(low))
    assert seen == [(F32, F32)] and cls.dtype == low


def test_wrap_fp16_model_checks_the_patterns_before_changing_the_model():
    model = Net()
    with pytest.raises(ValueError, match="'nope' matches no module"):
        wrap_fp16_model(model, dtype=_caps.LEGACY_LOW, backend='legacy', fp32_modules='nope')
    assert model.backbone[0].weight.dtype == F32 and kept_fp32(model) == []


# ------------------------------------------------------------ AmpOptimWrapper


def test_amp_wrapper_applies_fp32_modules_at_the_first_context_and_trains():
    _caps.require(LOW, 'native', scaled=False)
    model = Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=LOW,
                              fp32_modules=['roi_head.reg', nn.LayerNorm],
                              loss_scale=dict(init_scale=1.))
    assert kept_fp32(model) == []  # not before the first optim_context
    before = model.roi_head.reg.weight.detach().clone()
    with wrapper.optim_context(model):
        cls, reg = model(x4())
    assert (cls.dtype, reg.dtype) == (LOW, F32)
    assert kept_fp32(model) == ['backbone.1', 'roi_head.reg']
    wrapper.update_params(cls.float().sum() + reg.sum())
    assert not torch.equal(model.roi_head.reg.weight, before)
    forward = model.roi_head.reg.forward
    with wrapper.optim_context(model):
        model(x4())
    assert model.roi_head.reg.forward is forward


def test_amp_wrapper_looks_through_data_parallel_for_the_names():
    _caps.require(LOW, 'native', scaled=False)
    model = Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=LOW,
                              fp32_modules=['roi_head.cls', 'LayerNorm'], model=model)
    parallel = nn.DataParallel(model)  # no GPU: runs the module itself
    with wrapper.optim_context(parallel):
        cls, _ = parallel(x4())
    assert cls.dtype == F32 and kept_fp32(model) == ['backbone.1', 'roi_head.cls']


def test_amp_wrapper_checks_fp32_modules_against_the_model_up_front():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="'head.cls' matches no module"):
        AmpOptimWrapper(opt, dtype=LOW, model=model, fp32_modules=['head.cls'])
    with pytest.raises(TypeError, match='nn.Module subclass'):
        AmpOptimWrapper(opt, dtype=LOW, fp32_modules=[1.5])
    wrapper = AmpOptimWrapper(opt, dtype=LOW, fp32_modules='head.cls')  # no model: later
    with pytest.raises(ValueError, match="'head.cls' matches no module"):
        wrapper.optim_context(model)
    assert kept_fp32(model) == []


def test_amp_wrapper_legacy_keeps_fp32_modules_float32_through_steps():
    low = _caps.LEGACY_LOW
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = AmpOptimWrapper(opt, dtype=low, backend='legacy', model=model,
                              fp32_modules=[nn.LayerNorm], loss_scale=dict(init_scale=1.))
    norm = model.backbone[1]
    assert norm.weight.dtype == F32 and model.backbone[0].weight.dtype == low
    before = norm.weight.detach().clone()
    for _ in range(2):
        with wrapper.optim_context(model):
            cls, reg = model(x4())
        assert cls.dtype == F32  # _CastIO gives float32 outputs
        wrapper.update_params((cls.sum() + reg.sum()) * 0.01)
    assert norm.weight.dtype == F32 and norm.forward.out_dtype == low
    assert not torch.equal(norm.weight, before)


def test_build_optim_wrapper_takes_fp32_modules():
    _caps.require(LOW, 'native', scaled=False)
    model = Net()
    wrapper = build_optim_wrapper(model, dict(
        type='AmpOptimWrapper', dtype=_caps.NAMES[LOW], fp32_modules=['roi_head.*', 'backbone.1'],
        optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(model):
        cls, reg = model(x4())
    assert (cls.dtype, reg.dtype) == (F32, F32)
    with pytest.raises(TypeError, match='fp32_modules'):
        build_optim_wrapper(model, dict(type='AmpOptimWrapper', fp32_modules=[7],
                                        optimizer=dict(type='SGD', lr=0.1)))
    with pytest.raises(ValueError, match='unknown key'):
        build_optim_wrapper(model, dict(type='OptimWrapper', fp32_modules=['roi_head'],
                                        optimizer=dict(type='SGD', lr=0.1)))


# ------------------------------------------------------------- OverflowReport


def test_overflow_report_suggests_the_entry_that_fixes_it(caplog):
    _caps.require(F16)
    model = Overflowing()
    x = torch.full((2,), 1000.0, dtype=F16)
    with find_overflow(model, check_grads=False) as report:
        bad = model(x)
    assert torch.isinf(bad).all()
    assert report.suggest() == 'big'
    assert "fp32_modules=['big']" in str(report)
    keep_fp32(model, [report.suggest()])
    with find_overflow(model, check_grads=False) as clean:
        good = model(x)
    assert clean.suggest() is None and clean.ok
    assert good.dtype == F32 and good.tolist() == [1e8, 1e8]


def test_overflow_report_at_the_root_suggests_everything():
    _caps.require(F16)
    model = Big()
    with find_overflow(model, check_grads=False) as report:
        model(torch.full((1,), 1000.0, dtype=F16))
    assert report.suggest() == '*'
    assert kept_fp32(keep_fp32(model, report.suggest())) == ['']


def test_the_fp16utils_logger_is_quiet_when_nothing_needs_saying(caplog):
    _caps.require(LOW, 'native', scaled=False)
    model = Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=LOW,
                              fp32_modules=['roi_head.reg', nn.LayerNorm])
    with caplog.at_level(logging.INFO, logger='fp16utils'):
        with wrapper.optim_context(model):
            model(x4())
    assert caplog.records == []


def test_match_modules_names_each_match_once_in_model_order():
    from fp16utils.fp32_modules import check_fp32_modules, match_modules

    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.Sequential(nn.LayerNorm(2)))
    assert match_modules(model, ['LayerNorm', '0', nn.LayerNorm]) == ['0', '1', '2.0']
    assert match_modules(model, '*') == ['', '0', '1', '2', '2.0']  # '': the model itself
    assert match_modules(model, None) == []
    assert check_fp32_modules('head.*') == ['head.*']
    assert check_fp32_modules((nn.ReLU, 'x')) == [nn.ReLU, 'x']


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_wrapping_a_module_that_is_itself_kept_leaves_it_float32(backend):
    """keep_fp32(model, '1') then wrap_fp16_model(model[1]): the kept module stays float32."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    keep_fp32(model, '1')
    before = model[1].weight.detach().clone()
    wrapped = wrap_fp16_model(model[1], dtype=torch.bfloat16, backend=backend)
    assert wrapped is model[1] and kept_fp32(wrapped) == ['']
    assert wrapped.weight.dtype == torch.float32 and torch.equal(wrapped.weight, before)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert wrapped(torch.ones(1, 2)).dtype == (
            torch.bfloat16 if backend == 'legacy' else torch.float32)
