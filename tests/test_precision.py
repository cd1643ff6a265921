"""precision_support, dtype='auto', and optim_context(cache_enabled=...)."""

import io
import logging
import sys

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    OptimWrapper,
    _torch,
    build_optim_wrapper,
    enable_amp,
    precision_support,
)
from fp16utils._torch import caps
from fp16utils.precision import auto_dtype, precision_summary
from fp16utils.tools.cli import main

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


@pytest.fixture
def levels(monkeypatch):
    """Make the capability table answer ``table[dtype]`` on every device."""
    table = {}
    monkeypatch.setattr(caps, 'table_level', lambda device_type, dtype, index=None: table[dtype])
    return table


@pytest.fixture
def fresh_probe(monkeypatch):
    """An empty probe cache and a counting stand-in for the timed probe."""
    calls = []

    def probe(device_type, dtype, index=None):
        calls.append((device_type, dtype, index))
        return 'native' if dtype == F16 else 'emulated'

    monkeypatch.setattr(caps, '_speed_cache', {})
    monkeypatch.setattr(caps, 'speed_probe', probe)
    return calls


# ------------------------------------------------------------ the table


@pytest.mark.parametrize('flags, expected', [
    ({'sse2', 'avx2'}, {F16: 'emulated', BF16: 'emulated'}),
    ({'sse2', 'avx512_bf16'}, {F16: 'emulated', BF16: 'native'}),
    ({'sse2', 'amx_bf16', 'amx_fp16'}, {F16: 'native', BF16: 'native'}),
    ({'sse2', 'avx512_fp16'}, {F16: 'native', BF16: 'emulated'}),
    ({'fp', 'asimd', 'asimdhp', 'bf16'}, {F16: 'native', BF16: 'native'}),  # arm64
    ({'fp', 'asimd'}, {F16: 'emulated', BF16: 'emulated'}),
])
def test_cpu_table_reads_the_isa_flags(monkeypatch, flags, expected):
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset(flags))
    monkeypatch.setattr(caps, 'kernels_support', lambda device_type, dtype: True)
    assert precision_support('cpu', probe=_no_probe) == expected


def _no_probe(*args):
    raise AssertionError(f'the table should have decided, not the probe {args}')


@pytest.mark.parametrize('capability, expected', [
    ((9, 0), {F16: 'native', BF16: 'native'}),
    ((8, 0), {F16: 'native', BF16: 'native'}),
    ((7, 5), {F16: 'native', BF16: 'emulated'}),
    ((7, 0), {F16: 'native', BF16: 'emulated'}),
    ((6, 0), {F16: 'native', BF16: 'emulated'}),   # P100: full-rate float16
    ((6, 1), {F16: 'emulated', BF16: 'emulated'}),  # consumer Pascal: 1/64 rate
    ((5, 2), {F16: 'emulated', BF16: 'emulated'}),
])
def test_cuda_table_reads_the_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(caps, 'kernels_support', lambda device_type, dtype: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda index=None: capability)
    monkeypatch.setattr(torch.version, 'hip', None, raising=False)
    got = {d: caps.table_level('cuda', d) for d in (F16, BF16)}
    assert got == expected


def test_no_kernels_is_unsupported_whatever_else(monkeypatch):
    monkeypatch.setattr(caps, 'kernels_support', lambda device_type, dtype: dtype != BF16)
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset({'sse2', 'amx_bf16'}))
    assert precision_support('cpu', probe=_no_probe)[BF16] == 'unsupported'


def test_where_the_table_cannot_tell_the_probe_decides_once_per_process(monkeypatch,
                                                                        fresh_probe):
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset())  # unreadable cpuinfo
    first = precision_support('cpu')
    second = precision_support(torch.device('cpu'))
    # the probe's answers, where torch has the kernels at all
    expected = {F16: 'native', BF16: 'emulated'}
    expected = {d: v if _torch.caps.kernels_support('cpu', d) else 'unsupported'
                for d, v in expected.items()}
    assert first == second == expected
    assert sorted(fresh_probe, key=str) == sorted(
        [('cpu', d, None) for d in (F16, BF16) if _torch.caps.kernels_support('cpu', d)], key=str)


def test_a_probe_that_fails_means_unsupported(monkeypatch):
    monkeypatch.setattr(caps, '_speed_cache', {})
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset())

    def broken(*args):
        raise RuntimeError('no kernel')

    monkeypatch.setattr(caps, 'speed_probe', broken)
    assert precision_support('cpu') == {F16: 'unsupported', BF16: 'unsupported'}


def test_the_real_probe_is_short_and_answers_a_level():
    import time
    start = time.perf_counter()
    answer = caps.speed_probe('cpu', BF16)
    assert answer in ('native', 'emulated')
    assert time.perf_counter() - start < 5.0


def test_none_is_the_best_device_present_and_absent_devices_are_unsupported(monkeypatch):
    present = {'cpu', 'mps', 'xpu'}
    monkeypatch.setattr(caps, 'device_present', lambda kind: kind in present)
    assert caps.best_device_type() == 'mps'
    present.discard('mps')
    assert caps.best_device_type() == 'xpu'
    monkeypatch.undo()
    asked = []
    monkeypatch.setattr(_torch.caps, 'best_device_type', lambda: asked.append(1) or 'cpu')
    assert precision_support() == precision_support('cpu') and asked == [1]
    if not torch.cuda.is_available():
        assert precision_support('cuda') == {F16: 'unsupported', BF16: 'unsupported'}


def test_the_cpu_answer_here_agrees_with_the_kernels():
    support = precision_support('cpu')
    for dtype in (F16, BF16):
        assert (support[dtype] == 'unsupported') == (not _torch.caps.kernels_support('cpu', dtype))


# -------------------------------------------------------------- dtype='auto'


@pytest.mark.parametrize('table, expected', [
    ({BF16: 'native', F16: 'native'}, BF16),
    ({BF16: 'emulated', F16: 'native'}, F16),
    ({BF16: 'unsupported', F16: 'native'}, F16),
    ({BF16: 'emulated', F16: 'emulated'}, F32),
    ({BF16: 'unsupported', F16: 'unsupported'}, F32),
])
def test_auto_dtype_prefers_native_bfloat16_then_float16_then_float32(levels, table, expected):
    levels.update(table)
    dtype, why = auto_dtype('cpu')
    assert dtype == expected
    assert (why is None) == (expected != F32)
    if why is not None:
        assert 'neither low-precision dtype is native on cpu' in why
        assert f'bfloat16 {table[BF16]}' in why and f'float16 {table[F16]}' in why


def test_amp_wrapper_auto_picks_bfloat16_without_loss_scaling(levels):
    _caps.require(BF16, 'native')
    levels.update({BF16: 'native', F16: 'native'})
    model = nn.Linear(4, 2)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype='auto')
    assert wrapper.dtype == BF16 and wrapper.cast_dtype == BF16 and wrapper.auto_reason is None
    with wrapper.optim_context(model):
        out = model(torch.ones(1, 4))
    assert out.dtype == BF16 and wrapper.loss_scale == 1.0


def test_amp_wrapper_auto_picks_float16_with_dynamic_loss_scaling(levels):
    _caps.require(F16, 'native')
    levels.update({BF16: 'emulated', F16: 'native'})
    model = nn.Linear(4, 2)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype='auto')
    assert wrapper.dtype == F16
    with wrapper.optim_context(model):
        out = model(torch.ones(1, 4))
    assert out.dtype == F16 and wrapper.loss_scale == 2.0 ** 16


def test_amp_wrapper_auto_stays_float32_and_says_why_once(levels, caplog):
    levels.update({BF16: 'emulated', F16: 'emulated'})
    model = nn.Linear(4, 2)
    reference = nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype='auto')
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    assert wrapper.dtype == F32 and 'float32' in wrapper.auto_reason
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        for _ in range(2):
            with wrapper.optim_context(model):
                out = model(x)
            assert out.dtype == F32
            wrapper.update_params(out.sum())
            reference(x).sum().backward()
            ref_opt.step()
            ref_opt.zero_grad()
    lines = [r.getMessage() for r in caplog.records if 'auto' in r.getMessage()]
    assert lines == [wrapper.auto_reason]
    assert torch.equal(model.weight, reference.weight)  # plain float32 training


def test_build_optim_wrapper_takes_auto(levels):
    _caps.require(BF16, 'native')
    levels.update({BF16: 'native', F16: 'emulated'})
    wrapper = build_optim_wrapper(nn.Linear(2, 2), dict(
        type='AmpOptimWrapper', dtype='auto', optimizer=dict(type='SGD', lr=0.1)))
    assert wrapper.dtype == BF16


def test_enable_amp_writes_auto_for_the_wrapper_to_resolve():
    cfg = dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))
    new = enable_amp(cfg, 'auto')
    assert new['optim_wrapper'] == dict(optimizer=dict(type='SGD', lr=0.1),
                                        type='AmpOptimWrapper', loss_scale='dynamic',
                                        dtype='auto')
    assert cfg == dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))


def test_cli_migrate_amp_dtype_auto(tmp_path):
    src = tmp_path / 'old.py'
    src.write_text("optimizer = dict(type='SGD', lr=0.02)\n"
                   'optimizer_config = dict(grad_clip=None)\n')
    buf = io.StringIO()
    assert main(['migrate', str(src), '--amp', '--dtype', 'auto'], out=buf) == 0
    text = buf.getvalue()
    assert "dtype='auto'" in text and "type='AmpOptimWrapper'" in text
    namespace: dict = {}
    exec(text, namespace)
    assert namespace['optim_wrapper']['dtype'] == 'auto'


def test_env_and_demo_show_the_table(monkeypatch):
    buf = io.StringIO()
    assert main(['env'], out=buf) == 0
    row = next(ln for ln in buf.getvalue().splitlines() if ln.strip().startswith('precision'))
    assert row.split(None, 1)[1] == precision_summary('cpu')
    support = precision_support('cpu')
    for dtype, name in ((F16, 'float16'), (BF16, 'bfloat16')):
        assert f'{name} {support[dtype]}' in row
    from fp16utils.tools.demo import run_demo
    out = io.StringIO()
    monkeypatch.setattr(sys, 'stderr', io.StringIO())
    run_demo('cpu', steps=1, out=out, modes=('fp32',))
    assert f'precision: {precision_summary("cpu")}' in out.getvalue().splitlines()


# ---------------------------------------------------------- cache_enabled


def _cache_seen(wrapper, model, cache_enabled):
    seen = []
    hook = model.register_forward_hook(
        lambda *a: seen.append(torch.is_autocast_cache_enabled()))
    with wrapper.optim_context(model, cache_enabled=cache_enabled):
        model(torch.ones(1, 4))
    hook.remove()
    return seen


@pytest.mark.parametrize('cache_enabled, expected', [(None, True), (True, True),
                                                     (False, False)])
def test_cache_enabled_reaches_autocast_and_is_restored(cache_enabled, expected):
    _caps.require(_caps.LOW, 'native', scaled=False)
    model = nn.Linear(4, 2)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=_caps.LOW)
    assert _cache_seen(wrapper, model, cache_enabled) == [expected]
    assert torch.is_autocast_cache_enabled()


def test_no_grad_sub_forward_then_grad_forward_gives_the_right_grads():
    """pytorch#105211: a weight cast cached under no_grad must not lose the gradient."""
    _caps.require(_caps.LOW, 'native', scaled=False)
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    grads = []
    for sub_forward in (False, True):
        model = nn.Linear(4, 2)
        model.load_state_dict({'weight': torch.ones(2, 4) * 0.5, 'bias': torch.zeros(2)})
        wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                                  dtype=_caps.LOW, loss_scale=1.0)
        with wrapper.optim_context(model, cache_enabled=False):
            if sub_forward:
                with torch.no_grad():
                    model(x)  # e.g. a teacher pass of the same weights
            out = model(x)
        out.float().sum().backward()
        assert model.weight.grad is not None
        grads.append(model.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_cache_enabled_on_the_other_wrappers():
    model = nn.Linear(4, 2)
    plain = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with plain.optim_context(model, cache_enabled=False):  # accepted: no autocast there
        assert model(torch.ones(1, 4)).dtype == F32
        assert torch.is_autocast_cache_enabled()
    low = _caps.LEGACY_LOW
    legacy_model = nn.Linear(4, 2)
    legacy = AmpOptimWrapper(torch.optim.SGD(legacy_model.parameters(), lr=0.1), dtype=low,
                             backend='legacy', model=legacy_model)
    with legacy.optim_context(legacy_model, cache_enabled=False):
        assert legacy_model(torch.ones(1, 4)).dtype == F32  # half inside, float32 out


@pytest.mark.parametrize('bad', ['no', 0, 1.0])
def test_cache_enabled_must_be_a_bool_or_none(bad):
    model = nn.Linear(4, 2)
    for wrapper in (OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1)),
                    AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                                    dtype=_caps.LOW)):
        with pytest.raises(TypeError, match='cache_enabled must be None'):
            wrapper.optim_context(model, cache_enabled=bad)


def test_autocast_for_passes_cache_enabled():
    _caps.require(_caps.LOW, 'native', scaled=False)
    with _torch.autocast.autocast_for('cpu', _caps.LOW, cache_enabled=False):
        assert not torch.is_autocast_cache_enabled()
    with _torch.autocast.autocast_for('cpu', _caps.LOW):
        assert torch.is_autocast_cache_enabled()
