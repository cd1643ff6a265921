"""Tests for wrap_fp16_model, patch_norm_fp32 and patch_forward_method."""

import copy

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from _roundtrip import pickle_roundtrip, torch_save_roundtrip  # tests/ is on sys.path
from torch import nn

from fp16utils import (
    _torch,
    auto_fp16,
    force_fp32,
    keep_fp32,
    patch_forward_method,
    patch_norm_fp32,
    wrap_fp16_model,
)

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
#: The dtype of the legacy tests: float16 where the CPU has its kernels, else bfloat16.
LEGACY = _caps.LEGACY_LOW


class Block(nn.Module):
    """A submodule with the 0.x flag."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.bn = nn.BatchNorm2d(4)
        self.fp16_enabled = False

    @auto_fp16(apply_to=('x',))
    def forward(self, x):
        return torch.relu(self.bn(self.gn(self.conv(x))))


class Model(nn.Module):
    """Top level with the flag; a Linear head without it."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.plain = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.GroupNorm(2, 6),
                                   nn.Linear(6, 2))
        self.fp16_enabled = False

    @auto_fp16(apply_to=('x',), out_fp32=True)
    def forward(self, x):
        feat = self.block(x).mean(dim=(2, 3))
        return self.loss_input(self.plain(feat))

    @force_fp32(apply_to=('y',))
    def loss_input(self, y):
        return y * 1.0


def make(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def inputs(seed=1):
    torch.manual_seed(seed)
    return torch.randn(2, 3, 5, 5)


def norms(model):
    return [m for m in model.modules()
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm))]


def float_state(module):
    return {k: v.dtype for k, v in module.state_dict().items() if v.is_floating_point()}


# --------------------------------------------------------------------------- native


def test_native_sets_flags_only_where_present():
    model = make()
    assert wrap_fp16_model(model, dtype=_caps.LOW, backend='native') is model
    assert model.fp16_enabled is True and model.block.fp16_enabled is True
    for m in (model.plain, model.plain[0], model.plain[2], model.block.conv, model.block.gn):
        assert not hasattr(m, 'fp16_enabled')
    assert all(p.dtype == F32 for p in model.parameters())
    assert all(b.dtype in (F32, torch.int64) for b in model.buffers())
    assert model._fp16_autocast is True
    assert model.fp16_dtype == _caps.LOW and model.block.fp16_dtype == _caps.LOW
    assert 'forward' not in model.block.gn.__dict__  # no norm patching natively


def test_wrap_without_dtype_keeps_existing_fp16_dtype():
    _caps.require(F16)  # the default dtype
    model = make()
    model.block.fp16_dtype = BF16
    wrap_fp16_model(model)
    assert model.block.fp16_dtype == BF16 and model.fp16_dtype == F16
    wrap_fp16_model(model, dtype=F16)  # an explicit dtype wins
    assert model.block.fp16_dtype == F16


def test_native_is_default_on_current_torch():
    model = wrap_fp16_model(make(), dtype=_caps.native_norm_dtype())
    assert model.fp16_enabled is True and model._fp16_autocast is True
    assert model.block.conv.weight.dtype == F32


@pytest.mark.parametrize('dtype', _caps.LEGACY_DTYPES)
def test_automatic_backend_follows_what_torch_supports(dtype):
    model = wrap_fp16_model(make(), dtype=dtype)
    native = _caps.auto_backend(dtype) == 'native'
    assert model._fp16_autocast is native
    assert model.block.conv.weight.dtype == (F32 if native else dtype)
    assert model.block.gn.weight.dtype == F32
    out = model(inputs())
    assert out.dtype == F32 and torch.isfinite(out).all()


@pytest.mark.parametrize('backend', [None, 'native', 'legacy'])
@pytest.mark.parametrize('dtype', [F16, BF16])
def test_a_dtype_without_kernels_fails_up_front(monkeypatch, dtype, backend):
    # What torch without float16 CPU kernels does, on every torch: the probe's answer.
    monkeypatch.setitem(_torch.probes._probe_cache, ('kernels', 'cpu', dtype), False)
    other = BF16 if dtype == F16 else F16
    model = make()
    with pytest.raises(ValueError, match=f'{_caps.NAMES[dtype]} is not supported on cpu') as info:
        wrap_fp16_model(model, dtype=dtype, backend=backend)
    message = str(info.value)
    if _torch.caps.kernels_support('cpu', other):
        assert f'use dtype=torch.{_caps.NAMES[other]}' in message
    assert not model.fp16_enabled and model.block.conv.weight.dtype == F32  # nothing changed


@pytest.mark.parametrize('dtype', [BF16, 'bf16'])
def test_native_records_dtype(dtype):
    model = wrap_fp16_model(make(), dtype=dtype, backend='native')
    assert model.fp16_dtype == BF16 and model.block.fp16_dtype == BF16
    assert not hasattr(model.plain, 'fp16_dtype')
    assert model.block.conv.weight.dtype == F32


def test_native_forward_runs_in_low_precision():
    ref, model = make(), wrap_fp16_model(make(), dtype=BF16)
    assert model._fp16_autocast is (_caps.auto_backend(BF16) == 'native')
    x = inputs()
    out = model(x)
    assert out.dtype == F32
    assert torch.allclose(out, ref(x), atol=0.1, rtol=0.1)


# --------------------------------------------------------------------------- legacy


@pytest.mark.parametrize('dtype', _caps.LEGACY_DTYPES)
def test_legacy_converts_and_keeps_norms_float32(dtype):
    model = make()
    assert wrap_fp16_model(model, dtype=dtype, backend='legacy') is model
    assert model.block.conv.weight.dtype == dtype
    assert model.plain[0].weight.dtype == dtype
    for norm in norms(model):
        assert norm.weight.dtype == F32 and norm.bias.dtype == F32
        if isinstance(norm, nn.modules.batchnorm._BatchNorm):
            assert norm.running_mean.dtype == F32 and norm.running_var.dtype == F32
            assert norm.num_batches_tracked.dtype == torch.int64
    assert model.fp16_enabled is True and model.block.fp16_enabled is True
    assert model._fp16_autocast is False


@pytest.mark.parametrize('dtype', _caps.LEGACY_DTYPES)
def test_legacy_forward(dtype):
    ref, model = make(), wrap_fp16_model(make(), dtype=dtype, backend='legacy')
    x = inputs()
    out = model(x)
    assert out.dtype == F32
    tol = 2e-2 if dtype == F16 else 1e-1
    assert torch.allclose(out, ref(x), atol=tol, rtol=tol)


def test_legacy_is_default_on_old_torch(old_torch):
    model = wrap_fp16_model(make(), dtype=LEGACY)
    assert model.block.conv.weight.dtype == LEGACY
    assert model.block.gn.weight.dtype == F32
    assert model._fp16_autocast is False
    with pytest.raises(ValueError, match='1.5.0'):
        wrap_fp16_model(make(), backend='native')


def test_legacy_from_env(force_backend):
    force_backend('legacy')
    model = wrap_fp16_model(make(), dtype=LEGACY)
    assert model.block.conv.weight.dtype == LEGACY


@pytest.mark.parametrize('cls', [nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
                                 nn.SyncBatchNorm, nn.GroupNorm])
def test_every_norm_kind_stays_float32(cls):
    norm = cls(2, 4) if cls is nn.GroupNorm else cls(4)
    model = wrap_fp16_model(nn.Sequential(nn.Linear(4, 4), norm), dtype=LEGACY,
                            backend='legacy')
    assert model[0].weight.dtype == LEGACY
    assert model[1].weight.dtype == F32 and model[1].bias.dtype == F32


@pytest.mark.parametrize('dtype', _caps.LEGACY_DTYPES)
def test_group_norm_half_in_half_out(dtype):
    torch.manual_seed(0)
    ref = nn.GroupNorm(2, 4)
    nn.init.normal_(ref.weight)
    nn.init.normal_(ref.bias)
    model = wrap_fp16_model(nn.Sequential(copy.deepcopy(ref)), dtype=dtype, backend='legacy')
    x = torch.randn(3, 4, 5).to(dtype)
    out = model(x)
    assert out.dtype == dtype
    # The parameters went through `dtype` once (as in mmcv: half() then float()).
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(dtype))
    expected = ref(x.float()).to(dtype)  # computed in float32, rounded once
    assert torch.equal(out, expected)


def test_batch_norm_half_input():
    bn = nn.BatchNorm2d(3).eval()
    wrap_fp16_model(nn.Sequential(bn), dtype=LEGACY, backend='legacy')
    x = torch.randn(2, 3, 4, 4)
    out = bn(x.to(LEGACY))
    assert out.dtype == LEGACY
    tol = 1e-2 if LEGACY == F16 else 5e-2
    assert torch.allclose(out.float(), nn.BatchNorm2d(3).eval()(x), atol=tol)


def test_wrap_type_error_on_non_module():
    with pytest.raises(TypeError, match='nn.Module') as info:
        wrap_fp16_model({'not': 'a model'})
    assert 'dict' in str(info.value)
    with pytest.raises(TypeError, match='function'):
        wrap_fp16_model(make)


def test_wrap_bad_arguments():
    with pytest.raises(ValueError, match='apex'):
        wrap_fp16_model(make(), backend='apex')
    with pytest.raises(ValueError, match='low-precision dtype'):
        wrap_fp16_model(make(), dtype=F32)


# --------------------------------------------------------------------------- patch_norm_fp32


def test_patch_norm_fp32_returns_module_and_keeps_others():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.GroupNorm(1, 2),
                                                         nn.BatchNorm1d(2))).half()
    assert patch_norm_fp32(model) is model
    assert model[0].weight.dtype == F16
    assert model[1][0].weight.dtype == F32 and model[1][1].weight.dtype == F32
    assert model[1][1].running_mean.dtype == F32
    assert 'forward' not in model[1][1].__dict__  # BatchNorm takes half input natively


def test_patch_norm_fp32_top_level_norm():
    gn = nn.GroupNorm(1, 2).half()
    assert patch_norm_fp32(gn) is gn
    assert gn.weight.dtype == F32
    assert gn(torch.ones(1, 2, 3, dtype=F16)).dtype == F16


def test_patch_norm_fp32_idempotent():
    gn = nn.GroupNorm(1, 2).half()
    patch_norm_fp32(gn)
    first = gn.__dict__['forward']
    patch_norm_fp32(gn)
    patch_norm_fp32(gn)
    assert gn.__dict__['forward'] is first
    x = torch.randn(2, 2, 3).half()
    assert torch.equal(gn(x), nn.GroupNorm(1, 2)(x.float()).half())


def test_patch_norm_fp32_bfloat16():
    gn = nn.GroupNorm(1, 2).to(BF16)
    patch_norm_fp32(gn, BF16)
    x = torch.randn(2, 2, 3).to(BF16)
    out = gn(x)
    assert out.dtype == BF16
    assert torch.equal(out, nn.GroupNorm(1, 2)(x.float()).to(BF16))


# --------------------------------------------------------------------------- patch_forward_method


def test_patch_forward_method_convert_output():
    lin = nn.Linear(3, 2)
    seen = []

    def forward(x, ids, *, extra=None):
        seen.append((x.dtype, ids.dtype, extra.dtype))
        return lin(x), ids

    ids = torch.arange(3)
    patched = patch_forward_method(forward, F16, F32)
    out, ids_out = patched(torch.ones(1, 3, dtype=F16), ids, extra=torch.ones(1, dtype=F16))
    assert seen == [(F32, torch.int64, F32)]
    assert out.dtype == F16
    assert ids_out is ids
    assert torch.equal(out, lin(torch.ones(1, 3)).half())


def test_patch_forward_method_no_convert_output():
    lin = nn.Linear(3, 2)
    patched = patch_forward_method(lin.forward, F16, F32, convert_output=False)
    out = patched(torch.ones(1, 3, dtype=F16))
    assert out.dtype == F32
    assert torch.equal(out, lin(torch.ones(1, 3)))


def test_patch_forward_method_bound_method_on_module():
    lin = nn.Linear(3, 2)
    lin.forward = patch_forward_method(lin.forward, F16, F32)
    out = lin(torch.ones(1, 3, dtype=F16))
    assert out.dtype == F16
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.fill_(1.0)
    # The patched forward runs the module's current parameters.
    assert torch.equal(lin(torch.ones(1, 3, dtype=F16)), torch.ones(1, 2, dtype=F16))


# --------------------------------------------------------------------------- copies


def legacy_gn_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4))
    return wrap_fp16_model(model, dtype=LEGACY, backend='legacy')


def test_deepcopy_group_norm_runs_copy_parameters():
    original = legacy_gn_model()
    clone = copy.deepcopy(original)
    x = torch.randn(3, 4).to(LEGACY)
    before = original(x)
    assert torch.equal(clone(x), before)

    with torch.no_grad():
        clone[1].weight.fill_(2.0)
        clone[1].bias.fill_(-1.0)
    assert torch.equal(original(x), before)  # the original is not affected
    changed = clone(x)
    assert not torch.equal(changed, before)
    assert changed.dtype == LEGACY

    with torch.no_grad():
        original[1].weight.fill_(0.0)
    assert torch.equal(clone(x), changed)  # nor the copy by the original
    assert torch.equal(original(x), original[1].bias.to(LEGACY).expand(3, 4))


def test_deepcopy_keeps_flags_and_patches():
    model = wrap_fp16_model(make(), dtype=LEGACY, backend='legacy')
    clone = copy.deepcopy(model)
    assert clone.fp16_enabled is True and clone._fp16_autocast is False
    assert clone.block.gn.weight.dtype == F32 and clone.block.conv.weight.dtype == LEGACY
    x = inputs()
    assert torch.equal(clone(x), model(x))


@pytest.mark.parametrize('roundtrip', [pickle_roundtrip, torch_save_roundtrip])
@pytest.mark.parametrize('backend', ['legacy', 'native'])
def test_whole_model_serialization(roundtrip, backend):
    dtype = LEGACY if backend == 'legacy' else _caps.native_norm_dtype()
    model = wrap_fp16_model(make(), dtype=dtype, backend=backend)
    loaded = roundtrip(model)
    x = inputs()
    expected = model(x)
    out = loaded(x)
    assert out.dtype == F32
    assert torch.equal(out, expected)
    assert loaded.fp16_enabled is True and loaded.block.fp16_enabled is True
    if backend == 'legacy':
        gn = loaded.block.gn
        assert gn.weight.dtype == F32
        assert gn(torch.randn(1, 4, 2, 2).to(dtype)).dtype == dtype
        with torch.no_grad():
            gn.weight.fill_(3.0)
        assert torch.equal(model(x), expected)  # the loaded GN runs its own weights
        assert not torch.equal(loaded(x), expected)


def test_state_dict_roundtrip_into_fresh_model():
    source = wrap_fp16_model(make(seed=0), dtype=LEGACY, backend='legacy')
    target = wrap_fp16_model(make(seed=123), dtype=LEGACY, backend='legacy')
    x = inputs()
    assert not torch.equal(source(x), target(x))
    state = source.state_dict()
    assert set(state) == set(make().state_dict())  # patching adds no keys
    assert state['block.conv.weight'].dtype == LEGACY
    assert state['block.gn.weight'].dtype == F32
    target.load_state_dict(state)
    assert torch.equal(target(x), source(x))
    assert float_state(target) == float_state(source)


def test_state_dict_from_float32_model_into_wrapped():
    ref = make(seed=0)
    target = wrap_fp16_model(make(seed=5), dtype=LEGACY, backend='legacy')
    target.load_state_dict(ref.state_dict())
    assert target.block.conv.weight.dtype == LEGACY  # load_state_dict copies into place
    tol = 2e-2 if LEGACY == F16 else 1e-1
    assert torch.allclose(target(inputs()), ref(inputs()), atol=tol, rtol=tol)


# ------------------------------------------------- fp32_modules on the legacy backend


class _Scaled(nn.Module):
    """A kept island holding a large weight and an @auto_fp16 method of its own."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.fp16_enabled = False
        with torch.no_grad():
            self.fc.weight.fill_(1e5)  # beyond float16's largest value
            self.fc.bias.copy_(torch.tensor([0.1, 1 / 3, 2.0 ** -20]))  # not exact in half
        self.register_buffer('count', torch.tensor([1 / 3]))

    @auto_fp16(apply_to=('x',))
    def forward(self, x):
        return self.fc(x) * 1e-5 + self.count


def test_legacy_kept_modules_keep_their_float32_values_bit_for_bit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), _Scaled())
    before = {k: v.clone() for k, v in model[1].state_dict().items()}
    low = _caps.LEGACY_LOW  # float16 where this torch has CPU half kernels, else bfloat16
    wrap_fp16_model(model, backend='legacy', fp32_modules=['1'], dtype=low)
    assert model[0].weight.dtype == low
    for key, value in model[1].state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, before[key]), key
    out = model(torch.ones(2, 3, dtype=low))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_modules_inside_a_kept_island_are_not_switched_to_half(backend):
    model = nn.Sequential(nn.Linear(3, 3), _Scaled())
    model[0].fp16_enabled = False
    wrap_fp16_model(model, backend=backend, fp32_modules=['1'], dtype=torch.bfloat16)
    assert model[0].fp16_enabled is True
    assert model[1].fp16_enabled is False  # its @auto_fp16 would cast back to half
    seen = []
    model[1].fc.register_forward_hook(lambda m, args, out: seen.append(args[0].dtype))
    x = torch.ones(2, 3)
    if backend == 'native':
        with torch.autocast('cpu', dtype=torch.bfloat16):
            model(x)
    else:
        model(x.bfloat16())
    assert seen == [torch.float32]


def test_a_module_kept_before_wrapping_stays_float32_on_the_legacy_backend():
    # What a 0.x script does before Fp16OptimizerHook wraps the model (the hook takes no
    # fp32_modules): keep_fp32 first, then wrap_fp16_model converts the rest.
    model = nn.Sequential(nn.Linear(3, 3), _Scaled())
    before = {k: v.clone() for k, v in model[1].state_dict().items()}
    keep_fp32(model, ['1'])
    low = _caps.LEGACY_LOW
    wrap_fp16_model(model, backend='legacy', dtype=low)
    assert model[0].weight.dtype == low and model[1].fp16_enabled is False
    for key, value in model[1].state_dict().items():
        assert torch.equal(value, before[key]), key
    out = model(torch.ones(2, 3, dtype=low))
    assert out.dtype == low and torch.isfinite(out).all()  # cast back for what follows
