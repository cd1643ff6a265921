"""Decorated and wrapped models under torch.compile, torch.jit.trace and torch.export.

The decorators must not break dynamo graphs: ``torch.compile(fullgraph=True)``
has to trace through ``auto_fp16``/``force_fp32`` (their autocast contexts,
casts and attribute reads) and give what eager mode gives.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from torch import nn

from fp16utils import _torch, auto_fp16, force_fp32, wrap_fp16_model

dynamo = pytest.importorskip('torch._dynamo')


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    # Unwrapped modules follow the process default backend: make it 'native'.
    monkeypatch.delenv(_torch.BACKEND_ENV, raising=False)
    _torch.refresh()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    _torch.refresh()


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


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)


def _model(dtype=torch.float16, backend='native'):
    torch.manual_seed(0)
    return wrap_fp16_model(Full(), dtype=dtype, backend=backend)


def _same(a, b):
    assert a.dtype == b.dtype
    assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_explain_reports_no_graph_breaks(dtype):
    model = _model(dtype)
    x, t = _inputs()
    explained = torch._dynamo.explain(model)(x, t)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


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


@pytest.mark.parametrize('backend', ['eager', 'aot_eager'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
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


def test_compile_backward_matches_eager():
    x, t = _inputs()
    eager, comp = _model(), _model()
    eager(x, t)[0].backward()
    torch.compile(comp, fullgraph=True, backend='aot_eager')(x, t)[0].backward()
    for (name, p), q in zip(eager.named_parameters(), comp.parameters()):
        assert q.grad is not None and q.grad.dtype == p.grad.dtype, name
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


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


def test_compile_legacy_backend():
    model = _model(backend='legacy')
    assert model.net.fc1.weight.dtype == torch.float16
    x, t = _inputs()
    x = x.half()
    ref_loss, ref_pred = model(x, t)
    loss, pred = torch.compile(model, fullgraph=True, backend='eager')(x, t)
    _same(pred, ref_pred)
    _same(loss, ref_loss)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('g++') is None and shutil.which('c++') is None,
                    reason='inductor builds C++ on CPU and no C++ compiler was found')
@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch's own, on import
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
    model = _disabled()
    x, t = _inputs()
    program = torch.export.export(model, (x, t), strict=strict)
    exported = program.module()
    for scale in (1.0, 0.5):
        ref_loss, ref_pred = model(x * scale, t)
        loss, pred = exported(x * scale, t)
        _same(pred, ref_pred)
        _same(loss, ref_loss)


def test_export_when_fp16_enabled():
    model = _model(torch.bfloat16).eval()
    x, t = _inputs()
    exported = torch.export.export(model, (x, t)).module()
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
def test_backend_env_is_followed_under_compile(monkeypatch, backend, dtype):
    # EnvFlag was not wrapped, so the decorator asks _torch for the process
    # default, which reads FP16UTILS_BACKEND: compiled code must agree with eager.
    monkeypatch.setenv(_torch.BACKEND_ENV, backend)
    model = EnvFlag()
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    ref = model(x, y)
    out = torch.compile(model, fullgraph=True, backend='eager')(x, y)
    assert ref.dtype == out.dtype == dtype
    _same(out, ref)
