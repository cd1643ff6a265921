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
    assert _torch.versions.digit_version(older) < _torch.versions.digit_version(newer)
    assert _torch.versions.digit_version(newer) > _torch.versions.digit_version(older)


@pytest.mark.parametrize(('a', 'b'), [
    ('2.1.0+cu121', '2.1.0'),     # local labels are ignored
    ('1.13.1+cpu', '1.13.1+cu117'),
    ('1.6', '1.6.0'),
    ('1.6', '1.6.0.0'),
])
def test_digit_version_equal(a, b):
    assert _torch.versions.digit_version(a) == _torch.versions.digit_version(b)


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
    assert _torch.versions.digit_version(version) == expected


def test_digit_version_length():
    assert _torch.versions.digit_version('1.2.3', length=2) == (1, 2, 0, 0)
    assert _torch.versions.digit_version('1', length=3) == (1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match='length >= 1'):
        _torch.versions.digit_version('1.2', length=0)


@pytest.mark.parametrize('bad', ['parrots', 'not a version', '', '1.6.0-foo-bar'])
def test_digit_version_invalid(bad):
    with pytest.raises(ValueError, match='not a PEP 440 version') as info:
        _torch.versions.digit_version(bad)
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
    assert _torch.versions.has_native_amp(version) is native


def test_has_native_amp_follows_torch_version(old_torch):
    assert _torch.versions.TORCH_VERSION == '1.5.0'
    assert _torch.versions.has_native_amp() is False
    assert _torch.versions.has_native_amp('1.6.0') is True


def test_has_native_amp_real_torch(no_backend_env):
    assert _torch.versions.TORCH_VERSION == torch.__version__
    assert _torch.versions.has_native_amp() is True


# --------------------------------------------------------------------------- backends


@pytest.mark.parametrize('name', ['native', 'legacy'])
def test_resolve_backend_explicit(name, no_backend_env):
    assert _torch.versions.resolve_backend(name) == name


def test_resolve_backend_default_native(no_backend_env):
    assert _torch.versions.resolve_backend() == 'native'
    assert _torch.versions.resolve_backend(None) == 'native'
    assert _torch.versions.default_backend() == 'native'
    assert 'native AMP' in _torch.versions.backend_reason()


def test_resolve_backend_default_legacy_on_old_torch(no_backend_env, old_torch):
    assert _torch.versions.resolve_backend() == 'legacy'
    assert '1.5.0' in _torch.versions.backend_reason()
    assert 'older than 1.6' in _torch.versions.backend_reason()


@pytest.mark.parametrize('value', ['legacy', ' Legacy ', 'LEGACY'])
def test_resolve_backend_env(force_backend, value):
    force_backend(value)
    assert _torch.versions.resolve_backend() == 'legacy'
    assert _torch.versions.BACKEND_ENV in _torch.versions.backend_reason()
    # An explicit argument wins over the environment.
    assert _torch.versions.resolve_backend('native') == 'native'


def test_resolve_backend_env_native(force_backend):
    force_backend('native')
    assert _torch.versions.resolve_backend() == 'native'


def test_resolve_backend_env_empty_is_unset(force_backend):
    force_backend('')
    assert _torch.versions.resolve_backend() == 'native'


@pytest.mark.parametrize('name', ['apex', 'Native', 'cuda', ''])
def test_resolve_backend_unknown(name, no_backend_env):
    with pytest.raises(ValueError, match='Unknown fp16utils backend') as info:
        _torch.versions.resolve_backend(name)
    assert repr(name) in str(info.value)
    assert 'native' in str(info.value) and 'legacy' in str(info.value)


def test_resolve_backend_native_on_old_torch(old_torch, no_backend_env):
    with pytest.raises(ValueError, match=r'torch >= 1\.6') as info:
        _torch.versions.resolve_backend('native')
    assert '1.5.0' in str(info.value)
    assert "backend='legacy'" in str(info.value)
    assert _torch.versions.resolve_backend('legacy') == 'legacy'


def test_env_native_on_old_torch(old_torch, force_backend):
    force_backend('native')
    with pytest.raises(ValueError, match='1.5.0'):
        _torch.versions.resolve_backend()


@pytest.mark.parametrize('value', ['apex', 'fp16', 'nativ'])
def test_env_invalid(force_backend, value):
    force_backend(value)
    with pytest.raises(ValueError, match=_torch.versions.BACKEND_ENV) as info:
        _torch.versions.resolve_backend()
    assert repr(value) in str(info.value)
    assert 'legacy' in str(info.value)
    # Explicit choices still work while the environment is wrong.
    assert _torch.versions.resolve_backend('legacy') == 'legacy'


def test_refresh_picks_up_env_change(monkeypatch, no_backend_env):
    assert _torch.versions.default_backend() == 'native'
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, 'legacy')
    assert _torch.decisions.refresh() is None
    assert _torch.versions.default_backend() == 'legacy'
    monkeypatch.delenv(_torch.versions.BACKEND_ENV)
    _torch.decisions.refresh()
    assert _torch.versions.default_backend() == 'native'


def test_refresh_reads_the_environment_when_called(monkeypatch, no_backend_env):
    # Decided eagerly (at import and by refresh()), so that a torch.compile trace
    # only reads the answer: a change without refresh() is not seen.
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, 'legacy')
    _torch.decisions.refresh()
    monkeypatch.delenv(_torch.versions.BACKEND_ENV)
    assert _torch.versions.default_backend() == 'legacy'
    _torch.decisions.refresh()
    assert _torch.versions.default_backend() == 'native'


def test_refresh_keeps_a_bad_environment_for_the_first_use(monkeypatch, no_backend_env):
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, 'apex')
    assert _torch.decisions.refresh() is None  # refresh() itself does not raise
    with pytest.raises(ValueError, match="FP16UTILS_BACKEND='apex'"):
        _torch.versions.default_backend()
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, 'legacy')  # eager calls read it again
    assert _torch.versions.default_backend() == 'legacy'


def test_refresh_then_version_change(monkeypatch, no_backend_env):
    assert _torch.versions.default_backend() == 'native'
    monkeypatch.setattr(_torch.versions, 'TORCH_VERSION', '1.4.0')
    _torch.decisions.refresh()
    assert _torch.versions.default_backend() == 'legacy'
    assert _torch.versions.has_native_amp() is False
    monkeypatch.undo()
    _torch.decisions.refresh()
    assert _torch.versions.default_backend() == 'native'


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
    assert _torch.dtypes.resolve_dtype(given) is expected


def test_resolve_dtype_default():
    assert _torch.dtypes.resolve_dtype(None) is torch.float16
    assert _torch.dtypes.resolve_dtype(None, default=torch.bfloat16) is torch.bfloat16


@pytest.mark.parametrize('bad', [torch.float32, torch.float64, torch.int8, 'float32',
                                 'fp32', 'int8', 16, ''])
def test_resolve_dtype_errors(bad):
    with pytest.raises(ValueError, match='Unsupported low-precision dtype') as info:
        _torch.dtypes.resolve_dtype(bad)
    assert repr(bad) in str(info.value)
    assert 'torch.bfloat16' in str(info.value)


def test_needs_loss_scaling():
    assert _torch.dtypes.needs_loss_scaling(torch.float16) is True
    assert _torch.dtypes.needs_loss_scaling(torch.bfloat16) is False
    assert _torch.dtypes.needs_loss_scaling(torch.float32) is False


# --------------------------------------------------------------------------- autocast


def _mm():
    return torch.mm(torch.ones(2, 2), torch.ones(2, 2))


@pytest.mark.parametrize('dtype', LOW_DTYPES)
def test_autocast_for_cpu(dtype):
    assert not _cpu_state()[0]
    with _torch.autocast.autocast_for('cpu', dtype):
        assert _cpu_state()[0]
        assert _cpu_state()[1] == dtype
        assert _mm().dtype == dtype
        assert _torch.autocast.autocast_state('cpu') == (True, dtype)
    assert not _cpu_state()[0]
    assert _mm().dtype == torch.float32


def test_autocast_for_default_dtype():
    with _torch.autocast.autocast_for('cpu'):
        # torch's default CPU autocast dtype is bfloat16.
        assert _mm().dtype == torch.bfloat16


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, None])
def test_autocast_for_disabled_inside_outer(dtype):
    # Any dtype, supported by autocast on the CPU or not: off is off.
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with _torch.autocast.autocast_for('cpu', dtype, enabled=False):
            assert not _cpu_state()[0]
            assert _mm().dtype == torch.float32
        assert _cpu_state()[0]
        assert _mm().dtype == torch.bfloat16


def test_autocast_for_old_torch(old_torch):
    ctx = _torch.autocast.autocast_for('cpu', torch.float16)
    assert isinstance(ctx, contextlib.nullcontext)
    with ctx:
        assert not _cpu_state()[0]
        assert _mm().dtype == torch.float32


def test_autocast_state_outside():
    enabled, _ = _torch.autocast.autocast_state('cpu')
    assert enabled is False


def test_autocast_state_old_api(monkeypatch):
    # torch < 2.4 has no per-device is_autocast_enabled/get_autocast_dtype.
    monkeypatch.setattr(_torch.autocast, '_HAS_DEVICE_AUTOCAST_STATE', False)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        assert _torch.autocast.autocast_state('cpu')[0] is False
        with torch.autocast('cpu', dtype=LOW):
            assert _torch.autocast.autocast_state('cpu') == (True, LOW)
        assert _torch.autocast.autocast_state('cuda') == (False, torch.float16)
        assert _torch.autocast.autocast_state('some_device') == (False, None)


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
        monkeypatch.setattr(_torch.autocast, '_HAS_DEVICE_AUTOCAST_STATE', False)
    elif not _torch.autocast._HAS_DEVICE_AUTOCAST_STATE:
        pytest.skip('torch has no per-device autocast state setters (set_autocast_dtype)')
    return request.param


@pytest.mark.usefixtures('call_path')
@pytest.mark.parametrize('dtype', LOW_DTYPES)
def test_call_autocast_enables(dtype):
    state, mm_dtype = _torch.autocast.call_autocast('cpu', dtype, True, _state_probe)
    assert state == (True, dtype) and mm_dtype == dtype
    assert _cpu_state()[0] is False
    assert _mm().dtype == torch.float32


@pytest.mark.usefixtures('call_path')
def test_call_autocast_passes_arguments_and_result():
    a = torch.ones(2, 3)
    out = _torch.autocast.call_autocast('cpu', torch.bfloat16, True, torch.matmul, a, other=a.t())
    assert out.dtype == torch.bfloat16 and torch.equal(out.float(), torch.full((2, 2), 3.0))


@pytest.mark.usefixtures('call_path')
def test_call_autocast_disables_and_restores_outer():
    outer = LOW_DTYPES[0]  # float16 where CPU autocast has it: unlike the inner bfloat16
    with torch.autocast('cpu', dtype=outer):
        state, mm_dtype = _torch.autocast.call_autocast('cpu', None, False, _state_probe)
        assert state[0] is False and mm_dtype == torch.float32
        assert _cpu_state() == (True, outer)
        # dtype None inside an enabled region keeps the region's dtype.
        state, _ = _torch.autocast.call_autocast('cpu', None, True, _state_probe)
        assert state == (True, outer)
        state, _ = _torch.autocast.call_autocast('cpu', torch.bfloat16, True, _state_probe)
        assert state == (True, torch.bfloat16)
        assert _cpu_state() == (True, outer)


@pytest.mark.usefixtures('call_path')
def test_call_autocast_restores_after_exception():
    def boom():
        raise LookupError('inside autocast')

    with pytest.raises(LookupError, match='inside autocast'):
        _torch.autocast.call_autocast('cpu', LOW, True, boom)
    assert _cpu_state()[0] is False
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(LookupError):
            _torch.autocast.call_autocast('cpu', LOW, False, boom)
        assert _cpu_state() == (True, torch.bfloat16)
        assert _mm().dtype == torch.bfloat16


def test_call_autocast_unsupported_dtype_runs_without_autocast():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)  # torch warns about the dtype
        state, mm_dtype = _torch.autocast.call_autocast('cpu', torch.float64, True, _state_probe)
    assert state[0] is False and mm_dtype == torch.float32
    assert _cpu_state()[0] is False


def test_call_autocast_unsupported_dtype_cached_answer():
    """The supported-dtype answer is kept: later calls behave exactly like the first."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)
        results = [_torch.autocast.call_autocast('cpu', torch.float64, True, _state_probe)
                   for _ in range(3)]
    assert all(state[0] is False and mm is torch.float32 for state, mm in results)
    assert _torch.autocast.call_autocast('cpu', torch.bfloat16, True, _state_probe)[0] == (
        True, torch.bfloat16)


@pytest.mark.skipif(not _torch.autocast._HAS_DEVICE_AUTOCAST_STATE,
                    reason='torch has no per-device autocast state setters (set_autocast_dtype)')
def test_call_autocast_nesting_and_cache():
    """Like the context: nesting counted, the cast cache cleared on the outermost exit."""
    levels = []

    def probe():
        levels.append(torch.autocast_increment_nesting() - 1)
        torch.autocast_decrement_nesting()

    _torch.autocast.call_autocast('cpu', torch.bfloat16, True, probe)
    with torch.autocast('cpu', dtype=torch.float16):
        _torch.autocast.call_autocast('cpu', torch.bfloat16, True, probe)
        probe()
    assert levels == [1, 2, 1]
    cleared = []
    real_clear = torch.clear_autocast_cache
    try:
        torch.clear_autocast_cache = lambda: cleared.append(True) or real_clear()
        _torch.autocast.call_autocast('cpu', torch.bfloat16, True, probe)
    finally:
        torch.clear_autocast_cache = real_clear
    assert cleared == [True]


@pytest.mark.skipif(not _torch.autocast._HAS_DEVICE_AUTOCAST_STATE,
                    reason='torch has no per-device autocast state setters (set_autocast_dtype)')
def test_call_autocast_under_torch_function_mode_uses_the_context(monkeypatch):
    """Under a torch-function mode (as torch.export uses) the autocast context is used."""
    from torch.overrides import TorchFunctionMode

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    contexts = []
    real = _torch.autocast.autocast_for

    def recording(*args):
        contexts.append(args)
        return real(*args)

    monkeypatch.setattr(_torch.autocast, 'autocast_for', recording)
    assert _torch.autocast.call_autocast('cpu', torch.bfloat16, True, _state_probe) == (
        (True, torch.bfloat16), torch.bfloat16)
    assert contexts == []  # the eager path sets the state directly
    with Passthrough():
        state, mm_dtype = _torch.autocast.call_autocast('cpu', torch.bfloat16, True, _state_probe)
    assert state == (True, torch.bfloat16) and mm_dtype == torch.bfloat16
    assert contexts == [('cpu', torch.bfloat16, True)]
    assert torch.is_autocast_enabled('cpu') is False


def test_call_autocast_old_torch(old_torch):
    state, mm_dtype = _torch.autocast.call_autocast('cpu', torch.float16, True, _state_probe)
    assert state[0] is False and mm_dtype == torch.float32


# --------------------------------------------------------------------------- GradScaler


def test_make_grad_scaler_cpu_works():
    if not _torch.caps.grad_scaler_supports('cpu'):
        pytest.skip('torch has no GradScaler for cpu here (torch.amp.GradScaler(device))')
    scaler = _torch.factory.make_grad_scaler('cpu', init_scale=256.0, growth_factor=4.0,
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
    scaler = _torch.factory.make_grad_scaler('cpu', enabled=False)
    assert not scaler.is_enabled()
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss


def test_make_grad_scaler_old_torch(old_torch):
    with pytest.raises(RuntimeError, match='no native GradScaler') as info:
        _torch.factory.make_grad_scaler('cpu')
    assert '1.5.0' in str(info.value)
    assert 'LossScaler' in str(info.value)


def test_make_grad_scaler_torch_without_amp_grad_scaler(monkeypatch):
    # torch < 2.3: only torch.cuda.amp.GradScaler exists.
    monkeypatch.setattr(_torch.factory, '_AMP_GRAD_SCALER', None)
    with pytest.raises(RuntimeError, match="cuda only, not for 'cpu'"):
        _torch.factory.make_grad_scaler('cpu')


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
            with _torch.autocast.autocast_for('cpu', dtype):
                _mm()
            _torch.autocast.autocast_state('cpu')
        _torch.factory.make_grad_scaler('cpu', enabled=_torch.caps.grad_scaler_supports('cpu'))
        fp16utils.LossScaler().has_overflow(net.parameters())
    assert out.dtype == torch.float32
    bad = [f'{w.category.__name__}: {w.message}' for w in caught
           if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert bad == []


# --------------------------------------------------------------------------- grouping


def test_group_by_device_and_dtype_empty():
    assert _torch.ops.group_by_device_and_dtype([]) == []


@pytest.mark.parametrize('fused', [True, False])
def test_group_by_device_and_dtype(monkeypatch, fused):
    if not fused:
        monkeypatch.setattr(_torch.ops, '_c_group', None)
    a, b = torch.ones(2), torch.zeros(3)
    h = torch.ones(1, dtype=torch.float16)
    bf = torch.ones(4, dtype=torch.bfloat16)
    c = torch.ones(5)
    groups = _torch.ops.group_by_device_and_dtype([a, h, b, bf, c])
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
    [(key, group)] = _torch.ops.group_by_device_and_dtype(ts)
    assert key == (torch.device('cpu'), torch.float32)
    assert group[0] is ts[0] and group[1] is ts[1]


# --------------------------------------------------------------------------- capabilities


def _pretend(monkeypatch, kind, device_type, dtype, answer):
    """Make a capability probe answer ``answer`` (what another torch would find)."""
    monkeypatch.setitem(_torch.probes._probe_cache, (kind, device_type, dtype), answer)


def test_capability_probes_answer_for_the_cpu():
    for dtype in (torch.float16, torch.bfloat16):
        assert isinstance(_torch.caps.kernels_support('cpu', dtype), bool)
        assert isinstance(_torch.autocast.autocast_supports('cpu', dtype), bool)
        assert isinstance(_torch.caps.fused_check_supports('cpu', dtype), bool)
    assert _torch.caps.kernels_support('cpu', torch.bfloat16)  # every supported torch has these
    assert _torch.autocast.autocast_supports('cpu', torch.bfloat16)
    assert not _torch.autocast.autocast_supports('cpu', torch.float64)
    assert _torch.probes.device_present('cpu')
    assert not _torch.probes.device_present('no_such_device')
    assert not _torch.caps.kernels_support('no_such_device', torch.float16)


def test_probes_leave_the_autocast_state_as_it_was():
    before = _cpu_state()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        _torch.probes._probe_cache.clear()
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            _torch.autocast.autocast_supports('cpu', dtype)
            _torch.caps.autocast_norms_support('cpu', dtype)
        assert _cpu_state() == (True, torch.bfloat16)
    assert _cpu_state() == before


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_backend_for_fails_up_front_without_kernels(monkeypatch, dtype):
    _pretend(monkeypatch, 'kernels', 'cpu', dtype, False)
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    name, other_name = str(dtype)[6:], str(other)[6:]
    for backend in (None, 'native', 'legacy'):
        with pytest.raises(ValueError, match=f'{name} is not supported on cpu by torch') as info:
            _torch.caps.backend_for(backend, 'cpu', dtype)
        if _torch.caps.kernels_support('cpu', other):
            assert f'use dtype=torch.{other_name}' in str(info.value)
    _pretend(monkeypatch, 'kernels', 'cpu', other, False)
    with pytest.raises(ValueError, match='train in float32 there'):
        _torch.caps.backend_for(None, 'cpu', dtype)


def test_backend_for_falls_back_to_legacy_where_autocast_lacks_the_dtype(monkeypatch):
    _pretend(monkeypatch, 'kernels', 'cpu', torch.float16, True)
    _pretend(monkeypatch, 'autocast', 'cpu', torch.float16, False)
    monkeypatch.delenv(_torch.versions.BACKEND_ENV, raising=False)
    _torch.decisions.refresh()
    assert _torch.caps.backend_for(None, 'cpu', torch.float16) == 'legacy'
    assert _torch.caps.backend_for('legacy', 'cpu', torch.float16) == 'legacy'
    with pytest.raises(ValueError, match="backend='native' cannot train float16 on cpu: "
                                         'torch.autocast does not support float16 on cpu'):
        _torch.caps.backend_for('native', 'cpu', torch.float16)


def test_backend_for_needs_a_grad_scaler_for_float16_only(monkeypatch):
    for dtype in (torch.float16, torch.bfloat16):
        _pretend(monkeypatch, 'kernels', 'cpu', dtype, True)
        _pretend(monkeypatch, 'autocast', 'cpu', dtype, True)
        _pretend(monkeypatch, 'autocast_norms', 'cpu', dtype, True)
    monkeypatch.setattr(_torch.factory, '_AMP_GRAD_SCALER', None)  # only torch.cuda.amp.GradScaler
    monkeypatch.delenv(_torch.versions.BACKEND_ENV, raising=False)
    _torch.decisions.refresh()
    assert not _torch.caps.grad_scaler_supports('cpu')
    assert 'GradScaler for cpu' in _torch.caps.native_reason('cpu', torch.float16)
    assert _torch.caps.backend_for(None, 'cpu', torch.float16) == 'legacy'
    assert _torch.caps.backend_for(None, 'cpu', torch.bfloat16) == 'native'  # nothing to scale
    with pytest.raises(ValueError, match="or dtype=torch.bfloat16"):
        _torch.caps.backend_for('native', 'cpu', torch.float16)


def test_backend_for_norms_matter_only_for_models_that_have_them(monkeypatch):
    _pretend(monkeypatch, 'kernels', 'cpu', torch.bfloat16, True)
    _pretend(monkeypatch, 'autocast', 'cpu', torch.bfloat16, True)
    _pretend(monkeypatch, 'autocast_norms', 'cpu', torch.bfloat16, False)
    monkeypatch.delenv(_torch.versions.BACKEND_ENV, raising=False)
    _torch.decisions.refresh()
    with_norm = nn.Sequential(nn.Linear(2, 4), nn.GroupNorm(2, 4))
    assert _torch.caps.backend_for(None, 'cpu', torch.bfloat16, with_norm) == 'legacy'
    assert _torch.caps.backend_for(None, 'cpu', torch.bfloat16, nn.Linear(2, 2)) == 'native'
    assert _torch.caps.backend_for(None, 'cpu', torch.bfloat16) == 'native'  # no model to convert
    assert _torch.caps.backend_for('native', 'cpu', torch.bfloat16, with_norm) == 'native'
    rows = dict(_torch.caps.capability_rows('cpu'))
    assert 'legacy for models with Group/LayerNorm' in rows['bfloat16']


def test_backend_for_old_torch_is_legacy(old_torch):
    dtype = _caps.LEGACY_LOW
    assert _torch.caps.backend_for(None, 'cpu', dtype) == 'legacy'
    with pytest.raises(ValueError, match='needs torch >= 1.6'):
        _torch.caps.backend_for('native', 'cpu', dtype)


def test_wrappers_and_hooks_choose_legacy_where_native_cannot_run(monkeypatch):
    import fp16utils

    dtype = _caps.LEGACY_LOW
    _pretend(monkeypatch, 'autocast', 'cpu', dtype, False)
    monkeypatch.delenv(_torch.versions.BACKEND_ENV, raising=False)
    _torch.decisions.refresh()
    model = nn.Linear(2, 2)
    wrapper = fp16utils.AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                                        dtype=dtype, model=model)
    assert wrapper.backend == 'legacy' and model.weight.dtype == dtype
    with pytest.raises(ValueError, match='needs the model'):  # native cannot, legacy needs it
        fp16utils.AmpOptimWrapper(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1),
                                  dtype=dtype)
    net = nn.Linear(2, 2)

    class Runner:
        meta, iter = {}, 0
        model = net
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    hook = fp16utils.Fp16OptimizerHook(dtype=dtype, loss_scale='dynamic')
    hook.before_run(Runner())
    assert hook.backend == 'legacy' and net.weight.dtype == dtype
    assert isinstance(hook.loss_scaler, fp16utils.LossScaler)
    # 'dynamic' re-read for the legacy backend: mmcv's LossScaler default, not GradScaler's.
    assert hook.loss_scaler.loss_scale == 2.0**32


def test_capability_rows_name_every_capability():
    rows = dict(_torch.caps.capability_rows('cpu'))
    assert set(rows) == {'float16', 'bfloat16'}
    for text in rows.values():
        for word in ('kernels', 'autocast', 'fused overflow check', '->'):
            assert word in text
    assert 'GradScaler' in rows['float16'] and 'GradScaler' not in rows['bfloat16']


def test_autocast_for_an_unsupported_pair_is_off_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with _torch.autocast.autocast_for('cpu', torch.float64):
            assert _cpu_state()[0] is False
            assert _mm().dtype == torch.float32


@pytest.mark.parametrize('native_hooks', [True, False])
def test_forward_pre_hook_with_kwargs_on_any_torch(monkeypatch, native_hooks):
    if native_hooks and not _torch.compat.forward_pre_hook_takes_kwargs():
        pytest.skip('register_forward_pre_hook takes no with_kwargs here')
    monkeypatch.setattr(_torch.compat, '_PRE_HOOK_KWARGS', native_hooks)

    class M(nn.Module):
        def forward(self, x, *, scale=1.0):
            return x * scale

    m = M()
    seen = []

    def hook(module, args, kwargs):
        seen.append((module, kwargs.get('scale')))
        return (args[0] + 1,), {'scale': kwargs.get('scale', 1.0) * 10}

    handle = _torch.compat.register_forward_pre_hook_with_kwargs(m, hook)
    assert m(torch.ones(1), scale=2.0).item() == 40.0
    assert seen == [(m, 2.0)]
    handle.remove()
    assert m(torch.ones(1), scale=2.0).item() == 2.0
    assert 'forward' not in m.__dict__


def test_forward_pre_hook_emulation_keeps_a_patched_forward(monkeypatch):
    monkeypatch.setattr(_torch.compat, '_PRE_HOOK_KWARGS', False)
    lin = nn.Linear(2, 2)
    patched = lambda x: x * 0  # noqa: E731 - an instance forward, as patch_norm_fp32 sets
    lin.forward = patched
    handle = _torch.compat.register_forward_pre_hook_with_kwargs(lin, lambda m, a, k: None)
    assert lin(torch.ones(1, 2)).sum().item() == 0.0
    handle.remove()
    assert lin.__dict__['forward'] is patched


@pytest.mark.parametrize('fused', [True, False])
def test_foreach_copy(monkeypatch, fused):
    if fused and _torch.compat._foreach_copy is None:
        pytest.skip('torch has no torch._foreach_copy_ here')
    if not fused:
        monkeypatch.setattr(_torch.compat, '_foreach_copy', None)
    dst = [torch.zeros(2), torch.zeros(3, dtype=torch.bfloat16)]
    _torch.compat.foreach_copy_(dst, [torch.ones(2), torch.full((3,), 2.0)])
    assert dst[0].tolist() == [1.0, 1.0] and dst[1].tolist() == [2.0] * 3
    assert dst[1].dtype == torch.bfloat16


def test_clip_helpers_drop_foreach_where_torch_lacks_it(monkeypatch):
    p = nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 3.0)
    monkeypatch.setattr(_torch.compat, '_CLIP_NORM_ARGS', frozenset({'parameters', 'max_norm'}))
    calls = []
    monkeypatch.setattr(_torch.compat, '_clip_norm', lambda params, **kw: calls.append(kw) or 1.0)
    _torch.compat.clip_grad_norm_([p], max_norm=1.0, foreach=None)
    assert calls == [{'max_norm': 1.0}]
    monkeypatch.undo()
    norm = _torch.compat.clip_grad_norm_([p], max_norm=1.0, foreach=None)
    assert float(norm) == 6.0 and torch.allclose(p.grad.norm(), torch.tensor(1.0))


def test_a_probe_first_asked_under_fake_tensor_mode_runs_on_real_tensors():
    fake_tensor = pytest.importorskip('torch._subclasses.fake_tensor')
    from fp16utils._torch import probes

    def probe():  # "can" only where it really runs: False on a fake tensor
        return not isinstance(torch.ones(1), fake_tensor.FakeTensor)

    key = ('fake-mode-test', 'cpu', None)
    probes._probe_cache.pop(key, None)
    try:
        with fake_tensor.FakeTensorMode():
            inside = probes._cached_probe(*key, probe)
        outside = probes._cached_probe(*key, probe)
        assert outside is True
        # Where torch can set the modes aside the real answer is given and kept; else
        # "cannot", and nothing kept.
        assert inside is (probes._disable_current_modes is not None)
    finally:
        probes._probe_cache.pop(key, None)


# --------------------------------------------------------------------------- helpers


def test_dtype_names_and_tracing_answers():
    assert _torch.dtypes.LOW_PRECISION == (torch.float16, torch.bfloat16)
    assert _torch.dtypes.resolve_dtype('bf16') is torch.bfloat16
    assert _torch.dtypes.resolve_dtype(None, torch.bfloat16) is torch.bfloat16
    assert _torch.dtypes.needs_loss_scaling(torch.float16)
    assert not _torch.dtypes.needs_loss_scaling(torch.bfloat16)
    tracing = _torch.tracing
    assert (tracing.is_compiling(), tracing.is_scripting(),
            tracing.torch_function_mode_active()) == (False, False, False)
    assert _torch.probes.device_present('cpu') and _torch.probes.device_present('meta')


def test_backend_helpers_answer_outside_a_simulation():
    versions = _torch.versions
    assert versions.resolve_backend('legacy') == 'legacy'
    assert isinstance(versions.backend_reason(), str)
    versions.forget()
    assert versions.default_backend() in versions.BACKENDS
    _torch.decisions.warm_device('cpu')
    assert _torch.decisions.decided('cpu', torch.bfloat16)
    assert _torch.decisions.decided('cpu', torch.float16)


def _needs_a_cpu_grad_scaler():
    if not _torch.caps.grad_scaler_supports('cpu'):
        pytest.skip('torch has no GradScaler for cpu here (torch.amp.GradScaler(device))')


def test_a_disabled_grad_scaler_passes_the_loss_through_on_any_device():
    disabled = _torch.factory.make_grad_scaler('cuda', init_scale=512.0, enabled=False)
    assert disabled.scale(torch.tensor(3.0)).item() == 3.0
    assert not _torch.state.dispatch_mode_active()


def test_grad_scaler_factory_and_state_reads():
    _needs_a_cpu_grad_scaler()
    state = _torch.state
    assert _torch.factory.make_grad_scaler('cpu', init_scale=8.0).get_scale() == 8.0
    p = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=1.0)
    assert not state.optimizer_handles_unscaling(opt)
    scaler = _torch.factory.make_grad_scaler('cpu', init_scale=8.0)
    before = state.grad_scaler_fingerprint(scaler)
    assert not state.grad_scaler_started(scaler)
    scaler.scale(p.sum()).backward()
    assert state.grad_scaler_started(scaler)
    assert state.grad_scaler_fingerprint(scaler) == before  # making the scale tensor
    scaler.unscale_(opt)
    assert [bool(f) for f in state.grad_scaler_found_inf(scaler, opt).values()] == [False]
    state.reset_grad_scaler_step(scaler)
    scaler.unscale_(opt)  # no "unscale_() has already been called"
    scaler.update(4.0)
    assert state.grad_scaler_fingerprint(scaler) != before


def test_an_observed_grad_scaler_counts_outside_loads():
    _needs_a_cpu_grad_scaler()
    state = _torch.state
    scaler = state.make_observed_grad_scaler('cpu', init_scale=8.0)
    scaler.load_state_dict(dict(scaler.state_dict(), scale=4.0))
    assert (state.grad_scaler_changes(scaler), scaler.get_scale()) == (1, 4.0)
    state.quiet_grad_scaler_load(scaler, dict(scaler.state_dict(), scale=2.0))
    assert (state.grad_scaler_changes(scaler), scaler.get_scale()) == (1, 2.0)
    plain = _torch.factory.make_grad_scaler('cpu', init_scale=8.0)
    assert state.observed_grad_scaler(plain).get_scale() == 8.0
    assert state.grad_scaler_changes(plain) == 0


def test_private_tensor_operations():
    ops = _torch.ops
    grads = [torch.ones(2), torch.full((1,), 4.0)]
    ops.foreach_div_(grads, 2.0)
    assert [g.tolist() for g in grads] == [[0.5, 0.5], [2.0]]
    ops.foreach_zero_(grads)
    assert [g.tolist() for g in grads] == [[0.0, 0.0], [0.0]]
    flat = ops.flatten_dense_tensors([torch.ones(2, 2), torch.zeros(1)])
    assert flat.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    shaped = ops.unflatten_dense_tensors(torch.arange(3.0), [torch.zeros(2), torch.zeros(1, 1)])
    assert [t.shape for t in shaped] == [torch.Size([2]), torch.Size([1, 1])]
    sparse = torch.tensor([1.0, 0.0, 5.0]).to_sparse()
    ops.sparse_values(sparse).mul_(2)  # shares the sparse tensor's memory
    assert sparse.to_dense().tolist() == [2.0, 0.0, 10.0]
    t = torch.ones(2)
    assert ops.local_tensor(t) is t
    assert ops.fused_non_finite_check() is torch._amp_foreach_non_finite_check_and_unscale_


def test_compat_hooks_and_clipping():
    compat = _torch.compat
    seen = []
    m = nn.Identity()
    handle = compat.register_forward_hook_with_kwargs(
        m, lambda mod, args, kwargs, out: seen.append(out.item()))
    m(torch.ones(1))
    handle.remove()
    m(torch.ones(1))
    assert seen == [1.0]
    p = nn.Parameter(torch.ones(4))
    p.grad = torch.ones(4)
    assert float(compat.clip_grad_norm_([p], max_norm=1.0, foreach=None)) == 2.0
    q = nn.Parameter(torch.ones(1))
    q.grad = torch.full((1,), 5.0)
    compat.clip_grad_value_([q], clip_value=1.0, foreach=None)
    assert q.grad.item() == 1.0


def test_model_helpers():
    models = _torch.models
    inner = nn.Linear(1, 1)
    assert models.module_device_type(inner) == models.module_device_type(nn.ReLU()) == 'cpu'
    assert models.module_device_type(nn.Linear(1, 1, device='meta')) == 'meta'
    assert models.module_device_type(nn.ReLU(), None) is None
    path = models.TensorPath()
    assert models.module_device_type(inner, cache=path) == 'cpu' and path.name == 'weight'
    assert models.unwrap_model(nn.DataParallel(inner)) is inner
    assert models.unwrap_model(inner) is inner
    assert models.own_tensor(nn.BatchNorm1d(2), 'running_mean').tolist() == [0.0, 0.0]
    assert not models.has_no_sync(inner)


def test_autocast_helpers_on_the_cpu():
    ac = _torch.autocast
    assert not ac.any_autocast_enabled()
    with ac.autocast_for('cpu', torch.bfloat16):
        assert ac.autocast_state('cpu') == (True, torch.bfloat16)
        assert ac.any_autocast_enabled()
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    assert ac.autocast_supports('cpu', torch.bfloat16)
    assert (ac.autocast_available('cpu'), ac.autocast_available('meta')) == (True, False)
    a = torch.ones(2, 2)
    assert ac.call_autocast('cpu', torch.bfloat16, True, torch.mm, a, a).dtype == torch.bfloat16


def test_capability_answers_on_the_cpu():
    caps = _torch.caps
    assert caps.kernels_support('cpu', torch.bfloat16)
    assert caps.native_reason('cpu', torch.bfloat16) is None
    caps.check_dtype('cpu', torch.bfloat16)
    assert caps.backend_for('legacy', 'cpu', torch.bfloat16) == 'legacy'
    assert dict(caps.capability_rows('cpu'))['bfloat16'].startswith('kernels yes')
    for answer in (caps.autocast_norms_support('cpu', torch.bfloat16),
                   caps.grad_scaler_supports('cpu'),
                   caps.fused_check_supports('cpu', torch.float32)):
        assert isinstance(answer, bool)
    assert isinstance(caps.cpu_isa_flags(), frozenset)
    assert caps.table_level('cpu', torch.bfloat16) in (None, 'native', 'emulated')
    assert caps.speed_probe('cpu', torch.bfloat16) in ('native', 'emulated')
    assert caps.precision_level('cpu', torch.float16, probe=lambda *a: 'emulated') in caps.LEVELS
    assert caps.best_device_type() in ('cuda', 'mps', 'xpu', 'cpu')
