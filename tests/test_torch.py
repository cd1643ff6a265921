"""Tests for fp16utils._torch: versions, backends, dtypes, autocast, grad scaler."""

import contextlib
import subprocess
import sys
import textwrap
import warnings

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
from fp16utils import _torch

LOW_DTYPES, LOW = _caps.LOW_DTYPES, _caps.LOW

# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(('older', 'newer'), [
    ('1.5.0', '1.6.0'),
    ('1.5.1', '1.6.0'),
    ('1.9.0', '1.10.0'),          # numeric, not lexicographic
    ('1.6.0.dev20200101', '1.6.0a0'),
    ('1.6.0a0', '1.6.0a1'),
    ('1.6.0a1', '1.6.0b1'),
    ('1.6.0b1', '1.6.0rc1'),
    ('1.6.0rc1', '1.6.0rc2'),
    ('1.6.0rc2', '1.6.0'),
    ('1.6.0', '1.6.0.post1'),
    ('1.6.0.post1', '1.6.0.post2'),
    ('1.6.0.post2', '1.6.1'),
    ('1.5.9', '1.6.0rc1'),
    ('2.0.0', '2.13.0+cpu'),
])
def test_digit_version_orders(older, newer):
    assert _torch.digit_version(older) < _torch.digit_version(newer)
    assert _torch.digit_version(newer) > _torch.digit_version(older)


@pytest.mark.parametrize(('a', 'b'), [
    ('2.1.0+cu121', '2.1.0'),     # local labels are ignored
    ('1.13.1+cpu', '1.13.1+cu117'),
    ('1.6', '1.6.0'),
    ('1.6', '1.6.0.0'),
])
def test_digit_version_equal(a, b):
    assert _torch.digit_version(a) == _torch.digit_version(b)


@pytest.mark.parametrize(('version', 'expected'), [
    ('2.13.0+cpu', (2, 13, 0, 0, 0, 0)),
    ('1.6.0rc1', (1, 6, 0, 0, -1, 1)),
    ('1.6.0b2', (1, 6, 0, 0, -2, 2)),
    ('1.6.0a3', (1, 6, 0, 0, -3, 3)),
    ('1.6.0.dev5', (1, 6, 0, 0, -4, 5)),
    ('1.6.0.post7', (1, 6, 0, 0, 1, 7)),
    ('1.2.3.4.5', (1, 2, 3, 4, 0, 0)),
])
def test_digit_version_values(version, expected):
    assert _torch.digit_version(version) == expected


def test_digit_version_length():
    assert _torch.digit_version('1.2.3', length=2) == (1, 2, 0, 0)
    assert _torch.digit_version('1', length=3) == (1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match='length >= 1'):
        _torch.digit_version('1.2', length=0)


@pytest.mark.parametrize('bad', ['parrots', 'not a version', '', '1.6.0-foo-bar'])
def test_digit_version_invalid(bad):
    with pytest.raises(ValueError, match='not a PEP 440 version') as info:
        _torch.digit_version(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize(('version', 'native'), [
    ('1.5.0', False),
    ('1.5.1', False),
    ('1.6.0', True),
    ('1.10.2+cu113', True),
    ('2.13.0+cpu', True),
    ('parrots', False),
])
def test_has_native_amp(version, native):
    assert _torch.has_native_amp(version) is native


def test_has_native_amp_follows_torch_version(old_torch):
    assert _torch.TORCH_VERSION == '1.5.0'
    assert _torch.has_native_amp() is False
    assert _torch.has_native_amp('1.6.0') is True


def test_has_native_amp_real_torch(no_backend_env):
    assert _torch.TORCH_VERSION == torch.__version__
    assert _torch.has_native_amp() is True


# --------------------------------------------------------------------------- backends


@pytest.mark.parametrize('name', ['native', 'legacy'])
def test_resolve_backend_explicit(name, no_backend_env):
    assert _torch.resolve_backend(name) == name


def test_resolve_backend_default_native(no_backend_env):
    assert _torch.resolve_backend() == 'native'
    assert _torch.resolve_backend(None) == 'native'
    assert _torch.default_backend() == 'native'
    assert 'native AMP' in _torch.backend_reason()


def test_resolve_backend_default_legacy_on_old_torch(no_backend_env, old_torch):
    assert _torch.resolve_backend() == 'legacy'
    assert '1.5.0' in _torch.backend_reason()
    assert 'older than 1.6' in _torch.backend_reason()


@pytest.mark.parametrize('value', ['legacy', ' Legacy ', 'LEGACY'])
def test_resolve_backend_env(force_backend, value):
    force_backend(value)
    assert _torch.resolve_backend() == 'legacy'
    assert _torch.BACKEND_ENV in _torch.backend_reason()
    # An explicit argument wins over the environment.
    assert _torch.resolve_backend('native') == 'native'


def test_resolve_backend_env_native(force_backend):
    force_backend('native')
    assert _torch.resolve_backend() == 'native'


def test_resolve_backend_env_empty_is_unset(force_backend):
    force_backend('')
    assert _torch.resolve_backend() == 'native'


@pytest.mark.parametrize('name', ['apex', 'Native', 'cuda', ''])
def test_resolve_backend_unknown(name, no_backend_env):
    with pytest.raises(ValueError, match='Unknown fp16utils backend') as info:
        _torch.resolve_backend(name)
    assert repr(name) in str(info.value)
    assert 'native' in str(info.value) and 'legacy' in str(info.value)


def test_resolve_backend_native_on_old_torch(old_torch, no_backend_env):
    with pytest.raises(ValueError, match=r'torch >= 1\.6') as info:
        _torch.resolve_backend('native')
    assert '1.5.0' in str(info.value)
    assert "backend='legacy'" in str(info.value)
    assert _torch.resolve_backend('legacy') == 'legacy'


def test_env_native_on_old_torch(old_torch, force_backend):
    force_backend('native')
    with pytest.raises(ValueError, match='1.5.0'):
        _torch.resolve_backend()


@pytest.mark.parametrize('value', ['apex', 'fp16', 'nativ'])
def test_env_invalid(force_backend, value):
    force_backend(value)
    with pytest.raises(ValueError, match=_torch.BACKEND_ENV) as info:
        _torch.resolve_backend()
    assert repr(value) in str(info.value)
    assert 'legacy' in str(info.value)
    # Explicit choices still work while the environment is wrong.
    assert _torch.resolve_backend('legacy') == 'legacy'


def test_refresh_picks_up_env_change(monkeypatch, no_backend_env):
    assert _torch.default_backend() == 'native'
    monkeypatch.setenv(_torch.BACKEND_ENV, 'legacy')
    assert _torch.refresh() is None
    assert _torch.default_backend() == 'legacy'
    monkeypatch.delenv(_torch.BACKEND_ENV)
    _torch.refresh()
    assert _torch.default_backend() == 'native'


def test_refresh_then_version_change(monkeypatch, no_backend_env):
    assert _torch.default_backend() == 'native'
    monkeypatch.setattr(_torch, 'TORCH_VERSION', '1.4.0')
    _torch.refresh()
    assert _torch.default_backend() == 'legacy'
    assert _torch.has_native_amp() is False
    monkeypatch.undo()
    _torch.refresh()
    assert _torch.default_backend() == 'native'


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(('given', 'expected'), [
    ('float16', torch.float16),
    ('fp16', torch.float16),
    ('half', torch.float16),
    ('FP16', torch.float16),
    ('torch.float16', torch.float16),
    ('bfloat16', torch.bfloat16),
    ('bf16', torch.bfloat16),
    ('BF16', torch.bfloat16),
    ('torch.bfloat16', torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.half, torch.float16),
    (torch.bfloat16, torch.bfloat16),
])
def test_resolve_dtype(given, expected):
    assert _torch.resolve_dtype(given) is expected


def test_resolve_dtype_default():
    assert _torch.resolve_dtype(None) is torch.float16
    assert _torch.resolve_dtype(None, default=torch.bfloat16) is torch.bfloat16


@pytest.mark.parametrize('bad', [torch.float32, torch.float64, torch.int8, 'float32',
                                 'fp32', 'int8', 16, ''])
def test_resolve_dtype_errors(bad):
    with pytest.raises(ValueError, match='Unsupported low-precision dtype') as info:
        _torch.resolve_dtype(bad)
    assert repr(bad) in str(info.value)
    assert 'torch.bfloat16' in str(info.value)


def test_needs_loss_scaling():
    assert _torch.needs_loss_scaling(torch.float16) is True
    assert _torch.needs_loss_scaling(torch.bfloat16) is False
    assert _torch.needs_loss_scaling(torch.float32) is False


# --------------------------------------------------------------------------- autocast


def _mm():
    return torch.mm(torch.ones(2, 2), torch.ones(2, 2))


@pytest.mark.parametrize('dtype', LOW_DTYPES)
def test_autocast_for_cpu(dtype):
    assert not _cpu_state()[0]
    with _torch.autocast_for('cpu', dtype):
        assert _cpu_state()[0]
        assert _cpu_state()[1] == dtype
        assert _mm().dtype == dtype
        assert _torch.autocast_state('cpu') == (True, dtype)
    assert not _cpu_state()[0]
    assert _mm().dtype == torch.float32


def test_autocast_for_default_dtype():
    with _torch.autocast_for('cpu'):
        # torch's default CPU autocast dtype is bfloat16.
        assert _mm().dtype == torch.bfloat16


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, None])
def test_autocast_for_disabled_inside_outer(dtype):
    # Any dtype, supported by autocast on the CPU or not: off is off.
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with _torch.autocast_for('cpu', dtype, enabled=False):
            assert not _cpu_state()[0]
            assert _mm().dtype == torch.float32
        assert _cpu_state()[0]
        assert _mm().dtype == torch.bfloat16


def test_autocast_for_old_torch(old_torch):
    ctx = _torch.autocast_for('cpu', torch.float16)
    assert isinstance(ctx, contextlib.nullcontext)
    with ctx:
        assert not _cpu_state()[0]
        assert _mm().dtype == torch.float32


def test_autocast_for_torch_without_device_autocast(monkeypatch):
    # torch 1.6 - 1.9: no torch.autocast, CUDA float16 autocast only.
    monkeypatch.setattr(_torch, '_HAS_DEVICE_AUTOCAST', False)
    ctx = _torch.autocast_for('cpu', torch.bfloat16)
    assert isinstance(ctx, contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # deprecated on current torch; no CUDA here
        cuda_ctx = _torch.autocast_for('cuda', torch.float16)
    assert isinstance(cuda_ctx, torch.cuda.amp.autocast)


def test_autocast_state_outside():
    enabled, _ = _torch.autocast_state('cpu')
    assert enabled is False


def test_autocast_state_old_api(monkeypatch):
    # torch < 2.4 has no per-device is_autocast_enabled/get_autocast_dtype.
    monkeypatch.setattr(_torch, '_HAS_DEVICE_AUTOCAST_STATE', False)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        assert _torch.autocast_state('cpu')[0] is False
        with torch.autocast('cpu', dtype=LOW):
            assert _torch.autocast_state('cpu') == (True, LOW)
        assert _torch.autocast_state('cuda') == (False, torch.float16)
        assert _torch.autocast_state('some_device') == (False, None)


def _cpu_state():
    """CPU autocast (enabled, dtype), read from torch directly (not through _torch)."""
    if hasattr(torch, 'get_autocast_dtype'):  # per-device state calls
        return torch.is_autocast_enabled('cpu'), torch.get_autocast_dtype('cpu')
    return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()


def _state_probe():
    return _cpu_state(), _mm().dtype


@pytest.fixture(params=['fast', 'context'])
def call_path(request, monkeypatch):
    """Both ways call_autocast works: per-device setters (torch >= 2.4), or the context."""
    if request.param == 'context':
        monkeypatch.setattr(_torch, '_HAS_DEVICE_AUTOCAST_STATE', False)
    elif not _torch._HAS_DEVICE_AUTOCAST_STATE:
        pytest.skip('torch has no per-device autocast state setters (set_autocast_dtype)')
    return request.param


@pytest.mark.usefixtures('call_path')
@pytest.mark.parametrize('dtype', LOW_DTYPES)
def test_call_autocast_enables(dtype):
    state, mm_dtype = _torch.call_autocast('cpu', dtype, True, _state_probe)
    assert state == (True, dtype) and mm_dtype == dtype
    assert _cpu_state()[0] is False
    assert _mm().dtype == torch.float32


@pytest.mark.usefixtures('call_path')
def test_call_autocast_passes_arguments_and_result():
    a = torch.ones(2, 3)
    out = _torch.call_autocast('cpu', torch.bfloat16, True, torch.matmul, a, other=a.t())
    assert out.dtype == torch.bfloat16 and torch.equal(out.float(), torch.full((2, 2), 3.0))


@pytest.mark.usefixtures('call_path')
def test_call_autocast_disables_and_restores_outer():
    outer = LOW_DTYPES[0]  # float16 where CPU autocast has it: unlike the inner bfloat16
    with torch.autocast('cpu', dtype=outer):
        state, mm_dtype = _torch.call_autocast('cpu', None, False, _state_probe)
        assert state[0] is False and mm_dtype == torch.float32
        assert _cpu_state() == (True, outer)
        # dtype None inside an enabled region keeps the region's dtype.
        state, _ = _torch.call_autocast('cpu', None, True, _state_probe)
        assert state == (True, outer)
        state, _ = _torch.call_autocast('cpu', torch.bfloat16, True, _state_probe)
        assert state == (True, torch.bfloat16)
        assert _cpu_state() == (True, outer)


@pytest.mark.usefixtures('call_path')
def test_call_autocast_restores_after_exception():
    def boom():
        raise LookupError('inside autocast')

    with pytest.raises(LookupError, match='inside autocast'):
        _torch.call_autocast('cpu', LOW, True, boom)
    assert _cpu_state()[0] is False
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(LookupError):
            _torch.call_autocast('cpu', LOW, False, boom)
        assert _cpu_state() == (True, torch.bfloat16)
        assert _mm().dtype == torch.bfloat16


def test_call_autocast_unsupported_dtype_runs_without_autocast():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)  # torch warns about the dtype
        state, mm_dtype = _torch.call_autocast('cpu', torch.float64, True, _state_probe)
    assert state[0] is False and mm_dtype == torch.float32
    assert _cpu_state()[0] is False


def test_call_autocast_old_torch(old_torch):
    state, mm_dtype = _torch.call_autocast('cpu', torch.float16, True, _state_probe)
    assert state[0] is False and mm_dtype == torch.float32


# --------------------------------------------------------------------------- GradScaler


def test_make_grad_scaler_cpu_works():
    if not _torch.grad_scaler_supports('cpu'):
        pytest.skip('torch has no GradScaler for cpu here (torch.amp.GradScaler(device))')
    scaler = _torch.make_grad_scaler('cpu', init_scale=256.0, growth_factor=4.0,
                                     backoff_factor=0.25, growth_interval=3)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled()
    assert scaler.get_scale() == 256.0
    assert scaler.get_growth_factor() == 4.0
    assert scaler.get_backoff_factor() == 0.25
    assert scaler.get_growth_interval() == 3

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    assert torch.allclose(model.weight.grad, torch.full((1, 3), 2.0 * 256.0))
    scaler.step(opt)
    scaler.update()
    assert torch.allclose(model.weight, before - 0.1 * 2.0)

    # An inf gradient: the step is skipped and the scale backs off.
    after = model.weight.detach().clone()
    opt.zero_grad()
    scaler.scale(model(torch.full((1, 3), float('inf'))).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight, after)
    assert scaler.get_scale() == 256.0 * 0.25


def test_make_grad_scaler_disabled():
    scaler = _torch.make_grad_scaler('cpu', enabled=False)
    assert not scaler.is_enabled()
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss


def test_make_grad_scaler_old_torch(old_torch):
    with pytest.raises(RuntimeError, match='no native GradScaler') as info:
        _torch.make_grad_scaler('cpu')
    assert '1.5.0' in str(info.value)
    assert 'LossScaler' in str(info.value)


def test_make_grad_scaler_torch_without_amp_grad_scaler(monkeypatch):
    # torch < 2.3: only torch.cuda.amp.GradScaler exists.
    monkeypatch.setattr(_torch, '_AMP_GRAD_SCALER', None)
    with pytest.raises(RuntimeError, match="cuda only, not for 'cpu'"):
        _torch.make_grad_scaler('cpu')


# --------------------------------------------------------------------------- warnings


def test_import_emits_no_deprecation_warning():
    code = textwrap.dedent("""
        import warnings
        import torch  # torch's own import-time warnings are not ours
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            import fp16utils
        bad = [f'{w.category.__name__}: {w.message}' for w in caught
               if issubclass(w.category, (DeprecationWarning, FutureWarning))]
        print(repr(bad))
        raise SystemExit(1 if bad else 0)
    """)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_use_emits_no_deprecation_warning(no_backend_env):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.fp16_enabled = False

        @fp16utils.auto_fp16(out_fp32=True)
        def forward(self, x):
            return self.loss(self.fc(x))

        @fp16utils.force_fp32()
        def loss(self, y):
            return y * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for dtype in LOW_DTYPES:
            net = fp16utils.wrap_fp16_model(Net(), dtype=dtype)
            out = net(torch.ones(2, 4))
            out.sum().backward()
            with _torch.autocast_for('cpu', dtype):
                _mm()
            _torch.autocast_state('cpu')
        _torch.make_grad_scaler('cpu', enabled=_torch.grad_scaler_supports('cpu'))
        fp16utils.LossScaler().has_overflow(net.parameters())
    assert out.dtype == torch.float32
    bad = [f'{w.category.__name__}: {w.message}' for w in caught
           if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert bad == []


# --------------------------------------------------------------------------- grouping


def test_group_by_device_and_dtype_empty():
    assert _torch.group_by_device_and_dtype([]) == []


@pytest.mark.parametrize('fused', [True, False])
def test_group_by_device_and_dtype(monkeypatch, fused):
    if not fused:
        monkeypatch.setattr(_torch, '_c_group', None)
    a, b = torch.ones(2), torch.zeros(3)
    h = torch.ones(1, dtype=torch.float16)
    bf = torch.ones(4, dtype=torch.bfloat16)
    c = torch.ones(5)
    groups = _torch.group_by_device_and_dtype([a, h, b, bf, c])
    by_key = {key: ts for key, ts in groups}
    assert set(by_key) == {(torch.device('cpu'), torch.float32),
                           (torch.device('cpu'), torch.float16),
                           (torch.device('cpu'), torch.bfloat16)}
    f32 = by_key[(torch.device('cpu'), torch.float32)]
    # The very tensors (not copies), in their original order.
    assert len(f32) == 3 and f32[0] is a and f32[1] is b and f32[2] is c
    assert by_key[(torch.device('cpu'), torch.float16)][0] is h
    assert by_key[(torch.device('cpu'), torch.bfloat16)][0] is bf
    assert sum(len(ts) for _, ts in groups) == 5


def test_group_by_device_and_dtype_accepts_tuple():
    ts = (torch.ones(1), torch.ones(1))
    [(key, group)] = _torch.group_by_device_and_dtype(ts)
    assert key == (torch.device('cpu'), torch.float32)
    assert group[0] is ts[0] and group[1] is ts[1]
