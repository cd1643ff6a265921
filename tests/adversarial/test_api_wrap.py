"""Adversarial use of ``wrap_fp16_model``, ``patch_norm_fp32`` and ``patch_forward_method``."""

from __future__ import annotations

import copy

import _caps  # tests/ is on sys.path: see tests/conftest.py
import pytest
import torch
from torch import nn

from fp16utils import auto_fp16, patch_forward_method, patch_norm_fp32, wrap_fp16_model

F32 = torch.float32
LEGACY = _caps.LEGACY_LOW


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)
        self.gn = nn.GroupNorm(1, 2)
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, x):
        return self.gn(self.bn(self.fc(x)))


def snapshot(model):
    return ({k: (v.dtype, v.clone()) for k, v in model.state_dict().items()},
            {n: dict(vars(m)).get('fp16_enabled') for n, m in model.named_modules()},
            {n: 'forward' in vars(m) for n, m in model.named_modules()})


def same(a, b):
    (sa, fa, pa), (sb, fb, pb) = a, b
    return (fa == fb and pa == pb and sa.keys() == sb.keys()
            and all(sa[k][0] == sb[k][0] and torch.equal(sa[k][1], sb[k][1]) for k in sa))


# --------------------------------------------------------------------------- wrap_fp16_model


@pytest.mark.parametrize('dtype', ['int8', torch.float64, 'bogus', torch.int32, 3])
@pytest.mark.parametrize('backend', [None, 'legacy'])
def test_dtype_outside_the_low_dtypes_is_refused_and_nothing_changes(dtype, backend):
    net = Net()
    before = snapshot(net)
    with pytest.raises(ValueError, match='Unsupported low-precision dtype'):
        wrap_fp16_model(net, dtype=dtype, backend=backend)
    assert same(snapshot(net), before)


@pytest.mark.parametrize('backend', ['bogus', 'NATIVE', 3, ''])
def test_unknown_backend_argument_is_refused_and_nothing_changes(backend):
    net = Net()
    before = snapshot(net)
    with pytest.raises(ValueError, match="Unknown fp16utils backend .*expected one of"):
        wrap_fp16_model(net, backend=backend)
    assert same(snapshot(net), before)


@pytest.mark.parametrize('model', [None, 'model', torch.ones(1), [nn.Linear(1, 1)]])
def test_non_module_is_a_type_error(model):
    with pytest.raises(TypeError, match='takes an nn.Module'):
        wrap_fp16_model(model)


def test_dtype_none_means_float16_for_the_decorators():
    _caps.require(torch.float16, 'native', scaled=False)
    net = wrap_fp16_model(Net(), backend='native')
    assert net.fp16_dtype == torch.float16 and net.fp16_enabled is True


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_model_without_parameters_or_buffers(backend):
    _caps.require(LEGACY)

    class Empty(nn.Module):
        fp16_enabled = False

        @auto_fp16(out_fp32=True)
        def forward(self, x):
            return x * 2

    net = wrap_fp16_model(Empty(), dtype=LEGACY, backend=backend)
    assert net.fp16_enabled is True and net.fp16_dtype == LEGACY
    out = net(torch.ones(1))
    assert out.dtype == F32 and out.item() == 2


def test_wrapping_twice_with_another_dtype_patches_norms_for_the_new_one():
    if len(_caps.LEGACY_DTYPES) < 2:
        pytest.skip('the legacy backend needs float16 and bfloat16 kernels on cpu here')
    first, second = _caps.LEGACY_DTYPES[1], _caps.LEGACY_DTYPES[0]
    net = wrap_fp16_model(Net(), dtype=first, backend='legacy')
    wrap_fp16_model(net, dtype=second, backend='legacy')
    assert net.fc.weight.dtype == second and net.gn.weight.dtype == F32
    assert net.gn.forward.src_type == second and net.fp16_dtype == second
    out = net(torch.ones(3, 2))
    assert out.dtype == second


def test_wrapping_twice_with_the_same_dtype_changes_nothing_more():
    _caps.require(LEGACY)
    net = wrap_fp16_model(Net(), dtype=LEGACY, backend='legacy')
    patched = net.gn.forward
    before = snapshot(net)
    wrap_fp16_model(net, dtype=LEGACY, backend='legacy')
    assert same(snapshot(net), before) and net.gn.forward is patched


def test_scripted_norm_is_refused_on_the_legacy_backend_and_nothing_changes(script):
    _caps.require(LEGACY)
    net = script(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    with pytest.raises(TypeError, match=r"TorchScript norm '1' in float32.*nothing was changed"):
        wrap_fp16_model(net, dtype=LEGACY, backend='legacy')
    assert [p.dtype for p in net.parameters()] == [F32] * 4


def test_scripted_module_without_norms_is_converted_on_the_legacy_backend(script):
    _caps.require(LEGACY)
    net = nn.Sequential(script(nn.Linear(2, 2)), nn.BatchNorm1d(2))
    wrap_fp16_model(net, dtype=LEGACY, backend='legacy')
    assert (net[0].weight.dtype, net[1].weight.dtype) == (LEGACY, F32)


def test_scripted_model_on_the_native_backend_is_left_as_it_is(script):
    net = script(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert wrap_fp16_model(net, dtype=_caps.LOW, backend='native') is net
    assert [p.dtype for p in net.parameters()] == [F32] * 4


class Linear(nn.Linear):
    fp16_enabled = False

    @auto_fp16()
    def forward(self, x):
        return super().forward(x)


def test_data_parallel_wrapped_model_gets_its_flags():
    net = nn.DataParallel(Linear(2, 2))
    wrap_fp16_model(net, dtype=_caps.LOW, backend='native')
    assert net.module.fp16_enabled is True and net.module.fp16_dtype == _caps.LOW
    assert net(torch.ones(3, 2)).dtype == _caps.LOW


def test_distributed_data_parallel_wrapped_model_gets_its_flags(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip('torch.distributed with gloo is not available here')
    if dist.is_initialized():
        pytest.skip('a process group is already initialised in this process')
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0,
                            world_size=1)
    try:
        net = nn.parallel.DistributedDataParallel(Linear(2, 2))
        wrap_fp16_model(net, dtype=_caps.LOW, backend='native')
        assert net.module.fp16_enabled is True and net.module.fp16_dtype == _caps.LOW
        out = net(torch.ones(3, 2))
        assert out.dtype == _caps.LOW
        out.float().sum().backward()
        assert net.module.weight.grad.dtype == F32
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- patch_norm_fp32


@pytest.mark.parametrize('module', [None, 5, 'bn', torch.ones(1)])
def test_patch_norm_fp32_of_a_non_module_is_a_type_error(module):
    with pytest.raises(TypeError, match='patch_norm_fp32\\(\\) takes an nn.Module'):
        patch_norm_fp32(module)


def test_patch_norm_fp32_with_a_bad_dtype_changes_nothing():
    net = nn.Sequential(nn.GroupNorm(1, 2)).to(LEGACY)
    with pytest.raises(ValueError, match='Unsupported low-precision dtype'):
        patch_norm_fp32(net, dtype='int8')
    assert net[0].weight.dtype == LEGACY and 'forward' not in vars(net[0])


@pytest.mark.parametrize('make', [
    lambda: nn.SyncBatchNorm(2),
    lambda: nn.BatchNorm1d(2, affine=False),
    lambda: nn.BatchNorm1d(2, track_running_stats=False),
    lambda: nn.BatchNorm1d(2, affine=False, track_running_stats=False),
    lambda: nn.GroupNorm(1, 2, affine=False),
])
def test_odd_norms_are_put_back_in_float32(make):
    norm = make()
    net = patch_norm_fp32(nn.Sequential(norm).to(LEGACY), LEGACY)
    tensors = list(norm.parameters()) + [b for b in norm.buffers() if b.is_floating_point()]
    assert all(t.dtype == F32 for t in tensors)
    if isinstance(norm, nn.GroupNorm):
        _caps.require(LEGACY)
        assert net(torch.ones(2, 2, 2, dtype=LEGACY)).dtype == LEGACY


def test_lazy_batch_norm_materialises_in_float32():
    _caps.require(LEGACY)
    net = nn.Sequential(nn.Linear(2, 2), nn.LazyBatchNorm1d())
    wrap_fp16_model(net, dtype=LEGACY, backend='legacy')
    net(torch.ones(3, 2, dtype=LEGACY))
    assert net[1].weight.dtype == F32 and net[1].running_mean.dtype == F32


def test_patched_model_deepcopy_keeps_the_patch_on_the_copy():
    net = patch_norm_fp32(nn.Sequential(nn.GroupNorm(1, 2)).to(LEGACY), LEGACY)
    twin = copy.deepcopy(net)
    assert twin[0].forward.owner is twin[0]


# --------------------------------------------------------------------------- patch_forward_method


@pytest.mark.parametrize(('src', 'dst', 'bad'), [
    ('half', F32, "src_type='half'"),
    (torch.float16, 'float', "dst_type='float'"),
    (torch.float16, torch.int64, 'dst_type=torch.int64'),
    (torch.int8, F32, 'src_type=torch.int8'),
    (None, F32, 'src_type=None'),
])
def test_patch_forward_method_refuses_bad_dtypes_when_patching(src, dst, bad):
    layer = nn.Linear(1, 1)
    with pytest.raises(TypeError, match=f'floating-point torch dtypes, got {bad}'):
        patch_forward_method(layer.forward, src, dst)


@pytest.mark.parametrize('func', [None, 5, 'forward'])
def test_patch_forward_method_refuses_a_non_callable(func):
    with pytest.raises(TypeError, match='takes a callable forward'):
        patch_forward_method(func, torch.float16, F32)


def test_patch_forward_method_on_a_plain_function_casts_and_converts_back():
    patched = patch_forward_method(lambda x, k=None: (x.dtype, k.dtype, x), LEGACY, F32)
    got_x, got_k, out = patched(torch.ones(1, dtype=LEGACY), k=torch.ones(1, dtype=LEGACY))
    assert (got_x, got_k, out.dtype) == (F32, F32, LEGACY)
