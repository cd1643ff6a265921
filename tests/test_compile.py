"""Decorated and wrapped models under torch.compile, torch.jit.trace and torch.export.

The decorators must not break dynamo graphs: ``torch.compile(fullgraph=True)``
has to trace through ``auto_fp16``/``force_fp32`` (their autocast contexts,
casts and attribute reads) and give what eager mode gives.
"""

from __future__ import annotations

import functools
import inspect
import shutil
import warnings

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import _torch, auto_fp16, force_fp32, wrap_fp16_model

try:
    import torch._dynamo  # noqa: F401
    torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))
except Exception as err:  # noqa: BLE001 - whatever stops it: no torch.compile here
    pytest.skip(f'torch.compile does not run here: {str(err).splitlines()[0]}',
                allow_module_level=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    # Unwrapped modules follow the process default backend: make it 'native'.
    monkeypatch.delenv(_torch.versions.BACKEND_ENV, raising=False)
    _torch.decisions.refresh()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    monkeypatch.undo()  # the environment back first: refresh() reads it now
    _torch.decisions.refresh()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    @force_fp32(apply_to=('pred',))
    def loss(self, pred, target):
        return ((pred - target) ** 2).mean()


class Full(nn.Module):
    """Forward, then the float32 loss: both decorators in one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x, target):
        pred = self.net(x)
        return self.net.loss(self.norm(pred.float()), target), pred


class ClassFlag(nn.Module):
    """fp16_enabled as a class attribute, not set by wrap_fp16_model: the
    decorators then ask _torch for the process default backend."""

    fp16_enabled = True

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    @auto_fp16(apply_to=('x',), out_fp32=True, dtype=torch.bfloat16)
    def forward(self, x, *, scale=1.0):
        return self.fc(x) * scale

    @force_fp32(out_fp16=True)
    def loss(self, pred):
        return pred.abs().mean()


@functools.lru_cache(maxsize=None)
def _fullgraph_reason():
    """Why dynamo cannot trace a decorated module whole here (None: it can)."""
    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.fp16_enabled = False

        @auto_fp16(dtype=torch.bfloat16)
        def forward(self, x):
            return x * 2

    try:
        probe = wrap_fp16_model(Probe(), dtype=torch.bfloat16, backend='native')
        torch.compile(probe, fullgraph=True, backend='eager')(torch.ones(2))
    except Exception as err:  # noqa: BLE001 - dynamo's reason, shown in the skip
        return ('torch.compile(fullgraph=True) cannot trace the decorators here: '
                + str(err).splitlines()[0][:120])
    finally:
        torch._dynamo.reset()
    return None


def _require_fullgraph():
    why = _fullgraph_reason()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def fullgraph():
    """Skip unless dynamo traces a decorated module in one graph on this torch."""
    _require_fullgraph()


@functools.lru_cache(maxsize=None)
def _export_autocast_reason():
    """Why torch.export cannot export a region under autocast (None: it can)."""
    class Probe(nn.Module):
        def forward(self, x):
            with torch.autocast('cpu', dtype=torch.bfloat16):
                return torch.mm(x, x)

    try:
        _export(Probe(), (torch.ones(2, 2),)).module()(torch.ones(2, 2))
    except Exception as err:  # noqa: BLE001
        return 'torch.export cannot export autocast regions here: ' + str(err).splitlines()[0][:80]
    return None


def _export(model, args, strict=None):
    """``torch.export.export`` where torch has it (``strict`` where it takes it)."""
    export = getattr(getattr(torch, 'export', None), 'export', None)
    if export is None:
        pytest.skip('torch has no torch.export here')
    if strict is None:
        return export(model, args)
    if 'strict' not in inspect.signature(export).parameters:
        if not strict:
            pytest.skip('torch.export here has no non-strict mode (strict=False)')
        return export(model, args)  # strict: the only mode it has
    return export(model, args, strict=strict)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)


def _model(dtype=_caps.LOW, backend='native'):
    if backend == 'native':
        _caps.require_native_norms(dtype)  # Full has a GroupNorm
    torch.manual_seed(0)
    return wrap_fp16_model(Full(), dtype=dtype, backend=backend)


def _same(a, b):
    assert a.dtype == b.dtype
    assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.usefixtures('fullgraph')
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_explain_reports_no_graph_breaks(dtype):
    model = _model(dtype)
    x, t = _inputs()
    explained = torch._dynamo.explain(model)(x, t)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.usefixtures('fullgraph')
def test_explain_class_flag_and_outer_autocast():
    model = ClassFlag()
    x, _ = _inputs()

    def step(m, x):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y = m(x, scale=2.0)
            return m.loss(y.bfloat16())

    for fn, args in ((model, (x,)), (step, (model, x))):
        explained = torch._dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.usefixtures('fullgraph')
@pytest.mark.parametrize('backend', ['eager', 'aot_eager'])
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_compile_fullgraph_matches_eager(backend, dtype):
    model = _model(dtype)
    x, t = _inputs()
    ref_loss, ref_pred = model(x, t)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    loss, pred = compiled(x, t)
    assert pred.dtype == dtype and loss.dtype == torch.float32
    _same(pred, ref_pred)
    _same(loss, ref_loss)
    # A second call with new values reuses the graph and still matches.
    x2 = x * 3
    _same(compiled(x2, t)[1], model(x2, t)[1])


@pytest.mark.usefixtures('fullgraph')
def test_compile_backward_matches_eager():
    x, t = _inputs()
    eager, comp = _model(), _model()
    eager(x, t)[0].backward()
    torch.compile(comp, fullgraph=True, backend='aot_eager')(x, t)[0].backward()
    for (name, p), q in zip(eager.named_parameters(), comp.parameters()):
        assert q.grad is not None and q.grad.dtype == p.grad.dtype, name
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


@pytest.mark.usefixtures('fullgraph')
def test_compile_class_flag_outer_autocast_and_kwargs():
    model = ClassFlag()
    x, _ = _inputs()

    def step(m, x):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y = m(x, scale=2.0)
            return y, m.loss(y.bfloat16())

    ref_y, ref_loss = step(model, x)
    y, loss = torch.compile(step, fullgraph=True, backend='eager')(model, x)
    assert (y.dtype, loss.dtype) == (torch.float32, torch.float16)
    _same(y, ref_y)
    _same(loss, ref_loss)


@pytest.mark.usefixtures('fullgraph')
def test_compile_legacy_backend():
    model = _model(_caps.LEGACY_LOW, backend='legacy')
    assert model.net.fc1.weight.dtype == _caps.LEGACY_LOW
    x, t = _inputs()
    x = x.to(_caps.LEGACY_LOW)
    ref_loss, ref_pred = model(x, t)
    loss, pred = torch.compile(model, fullgraph=True, backend='eager')(x, t)
    _same(pred, ref_pred)
    _same(loss, ref_loss)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('g++') is None and shutil.which('c++') is None,
                    reason='inductor builds C++ on CPU and no C++ compiler was found')
@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch's own, on import
@pytest.mark.usefixtures('fullgraph')
def test_compile_inductor():
    model = _model(torch.bfloat16)
    x, t = _inputs()
    ref_loss, ref_pred = model(x, t)
    loss, pred = torch.compile(model, fullgraph=True)(x, t)
    assert (pred.dtype, loss.dtype) == (torch.bfloat16, torch.float32)
    # Inductor fuses and reorders; bfloat16 rounding may differ in the last bit.
    torch.testing.assert_close(pred, ref_pred, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------ fp16 switched off


def _disabled():
    torch.manual_seed(0)
    model = Full().eval()
    assert model.net.fp16_enabled is False
    return model


def test_jit_trace_when_fp16_disabled():
    model = _disabled()
    x, t = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # torch.jit.trace is deprecated in torch 2.x
        traced = torch.jit.trace(model, (x, t))
    for scale in (1.0, -2.0):
        ref_loss, ref_pred = model(x * scale, t)
        loss, pred = traced(x * scale, t)
        _same(pred, ref_pred)
        _same(loss, ref_loss)


@pytest.mark.parametrize('strict', [False, True])
def test_export_when_fp16_disabled(strict):
    if strict:
        _require_fullgraph()  # strict export traces with dynamo
    model = _disabled()
    x, t = _inputs()
    program = _export(model, (x, t), strict=strict)
    exported = program.module()
    for scale in (1.0, 0.5):
        ref_loss, ref_pred = model(x * scale, t)
        loss, pred = exported(x * scale, t)
        _same(pred, ref_pred)
        _same(loss, ref_loss)


@pytest.mark.usefixtures('fullgraph')  # strict export traces with dynamo
def test_export_when_fp16_enabled():
    if _export_autocast_reason() is not None:
        pytest.skip(_export_autocast_reason())
    model = _model(torch.bfloat16).eval()
    x, t = _inputs()
    exported = _export(model, (x, t)).module()
    ref_loss, ref_pred = model(x, t)
    loss, pred = exported(x, t)
    assert pred.dtype == torch.bfloat16
    _same(pred, ref_pred)
    _same(loss, ref_loss)


class EnvFlag(nn.Module):
    """Output dtype tells whether autocast was on: bfloat16 (native) or float32."""

    fp16_enabled = True

    @auto_fp16(apply_to=('x',), dtype=torch.bfloat16)
    def forward(self, x, y):
        return x.float() @ y


@pytest.mark.parametrize('backend, dtype', [('native', torch.bfloat16),
                                            ('legacy', torch.float32)])
@pytest.mark.usefixtures('fullgraph')
def test_backend_env_is_followed_under_compile(monkeypatch, backend, dtype):
    # EnvFlag was not wrapped, so the decorator asks _torch for the process
    # default, which refresh() reads from FP16UTILS_BACKEND (never the trace):
    # compiled code must agree with eager.
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, backend)
    _torch.decisions.refresh()
    model = EnvFlag()
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    ref = model(x, y)
    out = torch.compile(model, fullgraph=True, backend='eager')(x, y)
    assert ref.dtype == out.dtype == dtype
    _same(out, ref)


# ------------------------------------------------------ 1.x style: no flags, outer autocast


@pytest.mark.usefixtures('fullgraph')
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_compile_force_fp32_without_flag_under_autocast(dtype):
    """The migrated model: no fp16_enabled, a whole-forward autocast, a float32 loss."""
    model = Full()
    del model.net.fp16_enabled
    x, t = _inputs()

    def step(m, x, t):
        with torch.autocast('cpu', dtype=dtype):
            pred = m.net.fc2(m.net.fc1(x))
            return m.net.loss(pred, t), pred

    ref_loss, ref_pred = step(model, x, t)
    assert (ref_pred.dtype, ref_loss.dtype) == (dtype, torch.float32)
    explained = torch._dynamo.explain(step)(model, x, t)
    assert explained.graph_break_count == 0, explained.break_reasons
    loss, pred = torch.compile(step, fullgraph=True, backend='eager')(model, x, t)
    _same(pred, ref_pred)
    _same(loss, ref_loss)


# ------------------------------------------- questions a trace meets unanswered


@pytest.mark.usefixtures('fullgraph')
def test_unprobed_autocast_pair_in_a_trace_lets_torch_decide(monkeypatch):
    # A device/dtype pair nobody asked about before the trace (a device that came
    # up after import, say): no probe runs inside the trace, torch.autocast itself
    # decides, and no answer is kept (the next eager call probes for real).
    keys = [('autocast', 'cpu', d) for d in (torch.float16, torch.bfloat16)]
    for key in keys:
        monkeypatch.delitem(_torch.probes._probe_cache, key)
    model = EnvFlag()
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    explained = torch._dynamo.explain(model)(x, y)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    out = torch.compile(model, fullgraph=True, backend='eager')(x, y)
    assert all(key not in _torch.probes._probe_cache for key in keys)
    ref = model(x, y)
    assert out.dtype == ref.dtype == torch.bfloat16
    _same(out, ref)
    assert _torch.probes._probe_cache[keys[1]] is True


@pytest.mark.usefixtures('fullgraph')
def test_a_probe_reached_in_a_trace_answers_no_and_keeps_nothing(monkeypatch):
    key = ('autocast', 'cpu', torch.bfloat16)
    monkeypatch.delitem(_torch.probes._probe_cache, key)

    def scaled(x):
        return x * 2 if _torch.autocast.autocast_supports('cpu', torch.bfloat16) else x

    x = torch.ones(2)
    assert torch.equal(torch.compile(scaled, fullgraph=True, backend='eager')(x), x)
    assert key not in _torch.probes._probe_cache
    assert torch.equal(scaled(x), x * 2)  # eager: the real probe, kept
    assert _torch.probes._probe_cache[key] is True


def test_a_bad_backend_in_the_environment_fails_compiled_calls_too(monkeypatch):
    monkeypatch.setenv(_torch.versions.BACKEND_ENV, 'apex')
    _torch.decisions.refresh()  # decided now: the error is kept, the trace reads no environment
    model = EnvFlag()
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    with pytest.raises(ValueError, match=f"{_torch.versions.BACKEND_ENV}='apex'"):
        model(x, y)
    with pytest.raises(ValueError, match=f"{_torch.versions.BACKEND_ENV}='apex'"):
        torch.compile(model, backend='eager')(x, y)
    with pytest.raises(Exception, match='FP16UTILS_BACKEND|raised exception|ValueError'):
        torch.compile(model, fullgraph=True, backend='eager')(x, y)


@pytest.mark.usefixtures('fullgraph')
def test_fp32_modules_left_for_a_compiled_first_context_is_a_clear_error(monkeypatch):
    from fp16utils import AmpOptimWrapper, kept_fp32

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                              dtype=torch.bfloat16, fp32_modules=['1'])

    def forward(x):
        with wrapper.optim_context(model):
            return model(x)

    # Older dynamo reports its own "Observed exception", without the message.
    with pytest.raises((torch._dynamo.exc.TorchDynamoException, RuntimeError)):
        torch.compile(forward, fullgraph=True, backend='eager')(torch.ones(2, 8))
    assert kept_fp32(model) == []  # nothing applied inside the trace
    with monkeypatch.context() as mp:  # what the trace raised
        mp.setattr(_torch.tracing, 'is_compiling', lambda: True)
        with pytest.raises(RuntimeError, match=r"fp32_modules=\['1'\].*model=model"):
            wrapper.optim_context(model)
    assert kept_fp32(model) == []
    # Built with the model, the wrapper applies them at once: the trace has nothing to do.
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                              dtype=torch.bfloat16, fp32_modules=['1'], model=model)
    assert kept_fp32(model) == ['1']
    out = torch.compile(forward, fullgraph=True, backend='eager')(torch.ones(2, 8))
    assert out.dtype == torch.float32
    assert torch.equal(out, forward(torch.ones(2, 8)))
