"""Tests for fp16utils.debug: find_overflow, OverflowReport, nonfinite_summary."""

from __future__ import annotations

import json
from collections import OrderedDict, namedtuple

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
from fp16utils import (
    NonFiniteRecord,
    OverflowReport,
    auto_fp16,
    find_overflow,
    nonfinite_summary,
    wrap_fp16_model,
)

FP16_0_8 = float(torch.tensor(0.8, dtype=torch.float16))


class Div0(nn.Module):
    """Divides by zero: inf for non-zero entries, nan for zeros."""

    def forward(self, x):
        return x / 0


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class MakeNan(nn.Module):
    def forward(self, x):
        return torch.sqrt(-1.0 - x.abs())


def _chain(overflow: bool = True) -> nn.Sequential:
    """stem -> blow -> act (inplace) -> head, with weights chosen by hand.

    For ``x = ones(3, 4)``: stem outputs 2.0 everywhere; blow's first output
    column is 4 * 2 * 1e5 = 8e5 (beyond float16's 65504) when ``overflow``,
    its other columns 0.8; head averages.
    """
    model = nn.Sequential(OrderedDict(
        stem=nn.Linear(4, 4), blow=nn.Linear(4, 4), act=nn.ReLU(inplace=True),
        head=nn.Linear(4, 2)))
    with torch.no_grad():
        model.stem.weight.fill_(0.5)
        model.stem.bias.zero_()
        model.blow.weight.fill_(0.1)
        if overflow:
            model.blow.weight[0].fill_(1e5)
        model.blow.bias.zero_()
        model.head.weight.fill_(0.25)
        model.head.bias.zero_()
    return model


def _all_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in model.modules())


def _kwargs_flags(model: nn.Module) -> int:
    # Only a torch whose hooks take keyword arguments keeps these flags.
    return sum(len(getattr(m, '_forward_hooks_with_kwargs', ())) for m in model.modules())


def _fp16():
    """CPU autocast to float16 (these tests overflow float16); skip where torch lacks it."""
    _caps.require(torch.float16, 'native', scaled=False)
    return torch.autocast('cpu', dtype=torch.float16)


X = torch.ones(3, 4)


# ----------------------------------------------------------------- forward


def test_fp16_autocast_overflow_names_the_layer_that_overflowed():
    model = _chain()
    with find_overflow(model) as report:
        with _fp16():
            out = model(X)
        out.float().sum().backward()
    assert report.first_module == 'blow'
    fwd = report.forward
    assert fwd.kind == 'forward-output'
    assert fwd.name == 'blow' and fwd.module_type == 'Linear' and fwd.call == 1
    assert fwd.dtype == torch.float16 and fwd.shape == (3, 4) and fwd.numel == 12
    assert (fwd.num_inf, fwd.num_nan) == (3, 0)
    assert fwd.has_inf and not fwd.has_nan
    assert fwd.max_abs == FP16_0_8
    assert fwd.inputs_finite is True
    # Later modules (act, head, the root) went non-finite too; only blow is first.
    assert report.nonfinite_outputs == 4 and report.checked_outputs == 5
    assert not report.ok


def test_parameters_with_non_finite_grads_are_listed_with_dtype_and_counts():
    model = _chain()
    with find_overflow(model) as report:
        with _fp16():
            out = model(X)
        out.float().sum().backward()
    by_name = {p.name: p for p in report.parameters}
    assert list(by_name) == ['stem.weight', 'stem.bias', 'head.weight']
    assert all(p.kind == 'param-grad' and p.dtype == torch.float32
               for p in report.parameters)
    assert (by_name['stem.weight'].shape, by_name['stem.weight'].num_inf) == ((4, 4), 16)
    assert by_name['stem.weight'].max_abs is None  # no finite entry left
    assert (by_name['stem.bias'].num_inf, by_name['stem.bias'].num_nan) == (4, 0)
    head = by_name['head.weight']
    assert (head.num_inf, head.num_nan, head.numel) == (2, 0, 8)
    assert head.max_abs == pytest.approx(3 * 0.8, rel=1e-2)
    assert report.checked_params == 6
    # The gradient w.r.t. stem's output is the first non-finite one in backward
    # (blow's float16 weight holds inf).
    assert report.backward.name == 'stem'
    assert report.backward.kind == 'backward-grad'
    assert report.backward.dtype == torch.float16


def test_same_model_in_float32_is_clean():
    model = _chain()
    with find_overflow(model) as report:
        model(X).sum().backward()
    assert report.ok
    assert report.first_module is None
    assert report.records == [] and report.parameters == []
    text = str(report)
    assert 'no non-finite values found' in text
    assert '5 module outputs' in text and '6 parameter gradients' in text
    assert report.to_dict()['ok'] is True


def test_bfloat16_autocast():
    model = nn.Sequential(OrderedDict(stem=nn.Linear(4, 4), div=Div0(),
                                      head=nn.Linear(4, 2)))
    with torch.no_grad():
        model.stem.weight.fill_(0.5)
        model.stem.bias.zero_()
    with find_overflow(model) as report:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = model(X)
        out.float().sum().backward()
    assert report.first_module == 'div'
    assert report.forward.dtype == torch.bfloat16
    assert (report.forward.num_inf, report.forward.num_nan) == (12, 0)
    assert report.forward.max_abs is None
    assert report.forward.module_type == 'Div0'


def test_bfloat16_clean_model_is_ok():
    model = _chain()  # 8e5 fits in bfloat16
    with find_overflow(model) as report:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = model(X)
        out.float().sum().backward()
    assert report.ok, str(report)


def test_nan_and_inf_are_told_apart():
    model = nn.Sequential(OrderedDict(lin=nn.Linear(3, 3), nan=MakeNan()))
    with find_overflow(model) as report:
        model(torch.ones(2, 3))
    rec = report.forward
    assert report.first_module == 'nan'
    assert rec.has_nan and not rec.has_inf
    assert (rec.num_inf, rec.num_nan) == (0, 6)
    assert '6 nan of 6' in str(report)

    div = Div0()
    with find_overflow(div) as report:
        div(torch.tensor([1.0, 0.0, -1.0]))
    rec = report.forward
    assert report.first_module == '<root>'
    assert (rec.num_inf, rec.num_nan, rec.numel) == (2, 1, 3)
    assert rec.problem == '2 inf, 1 nan of 3'


def test_float32_overflow_in_a_custom_module():
    model = nn.Sequential(OrderedDict(a=Scale(1e20), b=Scale(1e20), c=Scale(2.0)))
    with find_overflow(model) as report:
        model(torch.tensor([1.0, 1e-20]))  # a: [1e20, 1], b: [inf, 1e20]
    assert report.first_module == 'b'
    assert report.forward.max_abs == pytest.approx(1e20, rel=1e-6)
    assert report.forward.dtype == torch.float32


def test_which_call_of_a_shared_module():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Scale(1000.0)

        def forward(self, x):
            return self.scale(self.scale(x))

    model = Twice()
    with find_overflow(model) as report:
        model(torch.full((2,), 10.0, dtype=torch.float16))  # 1e4, then 1e7 = inf
    assert report.first_module == 'scale'
    assert report.forward.call == 2


def test_nested_outputs_are_checked_and_located():
    Out = namedtuple('Out', ['good', 'bad'])

    class Multi(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how = how

        def forward(self, x):
            bad = x / 0
            if self.how == 'dict':
                return {'good': x, 'bad': bad, 'n': 3}
            if self.how == 'tuple':
                return x, [torch.arange(3), bad]
            return Out(x, bad)

    expected = {'dict': "['bad']", 'tuple': '[1][1]', 'named': '.bad'}
    for how, path in expected.items():
        model = nn.Sequential(OrderedDict(inner=Multi(how)))
        with find_overflow(model) as report:
            model.inner(torch.ones(2))
        assert report.forward.path == path, how
        assert report.forward.where == f'inner{path}'


def test_inputs_already_non_finite_is_pointed_out():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def forward(self, x):
            return self.b(self.a(x) / 0)  # the functional op is the culprit

    model = Parent()
    with find_overflow(model) as report:
        model(torch.ones(1, 2))
    assert report.first_module == 'b'
    assert report.forward.inputs_finite is False
    assert 'already non-finite' in str(report)


def test_backward_only_overflow():
    model = _chain(overflow=False)
    with find_overflow(model) as report:
        with _fp16():
            out = model(X)
        (out.float().sum() * 2.0**20).backward()  # 2**20 does not fit in float16
    assert report.forward is None
    assert report.first_module == 'head'
    assert report.backward.kind == 'backward-grad'
    assert report.backward.dtype == torch.float16
    assert (report.backward.num_inf, report.backward.numel) == (6, 6)
    assert {p.name for p in report.parameters} == {
        'stem.weight', 'stem.bias', 'blow.weight', 'blow.bias', 'head.weight',
        'head.bias'}
    text = str(report)
    assert "first module: 'head' (backward-grad)" in text
    assert 'loss scale' in text


def test_check_flags():
    model = _chain()
    with find_overflow(model, check_outputs=False) as report:
        with _fp16():
            out = model(X)
        out.float().sum().backward()
    assert report.forward is None and report.checked_outputs == 0
    assert report.backward.name == 'stem' and report.parameters

    model = _chain()
    with find_overflow(model, check_grads=False) as report:
        with _fp16():
            out = model(X)
        out.float().sum().backward()
    assert report.first_module == 'blow'
    assert report.backward is None and report.parameters == []
    assert report.checked_grads == 0 and report.checked_params == 0


def test_decorated_and_wrapped_model():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 4)
            self.fc2 = nn.Linear(4, 4)
            self.fc3 = nn.Linear(4, 1)
            self.fp16_enabled = False

        @auto_fp16()
        def forward(self, x):
            return self.fc3(self.fc2(self.fc1(x)))

    _caps.require(torch.float16, 'native', scaled=False)
    model = Net()
    with torch.no_grad():
        model.fc1.weight.fill_(1.0)
        model.fc2.weight.fill_(1e4)
    wrap_fp16_model(model, backend='native')
    with find_overflow(model) as report:
        model(torch.ones(2, 4)).float().sum().backward()
    assert report.first_module == 'fc2'
    assert report.forward.dtype == torch.float16
    assert 'float16 cannot hold magnitudes above 65504' in str(report)


# ------------------------------------------------------------ hook removal


def test_hooks_removed_on_exit():
    model = _chain()
    assert _all_hooks(model) == 0
    with find_overflow(model):
        assert _all_hooks(model) == len(list(model.modules())) == 5
    assert _all_hooks(model) == 0 and _kwargs_flags(model) == 0
    # Tensor hooks are removed too: a backward after the block is not seen.
    with find_overflow(model) as report:
        with torch.autocast('cpu', dtype=_caps.LOW):
            out = model(X)
    (out.float().sum() * 2.0**20).backward()
    assert report.checked_grads == 0 and report.backward is None


def test_hooks_removed_when_the_block_raises():
    model = _chain()
    with pytest.raises(RuntimeError, match='boom'):
        with find_overflow(model) as report:
            with torch.autocast('cpu', dtype=_caps.LOW):
                model(X)
            raise RuntimeError('boom')
    assert _all_hooks(model) == 0 and _kwargs_flags(model) == 0
    if _caps.LOW == torch.float16:  # 8e5 overflows float16 only
        assert report.first_module == 'blow'  # what was seen before the raise is kept


def test_user_hooks_are_left_alone():
    model = _chain()
    calls = []
    model.stem.register_forward_hook(lambda m, a, o: calls.append(1))
    with find_overflow(model):
        model(X)
    model(X)
    assert len(calls) == 2
    assert len(model.stem._forward_hooks) == 1


def test_rejects_non_modules():
    with pytest.raises(TypeError, match='nn.Module'):
        with find_overflow(lambda x: x):
            pass


# -------------------------------------------------------------- rendering


def test_table_and_dict():
    model = _chain()
    with find_overflow(model) as report:
        with _fp16():
            out = model(X)
        out.float().sum().backward()
    lines = str(report).splitlines()
    assert lines[0] == "find_overflow: non-finite values found; first module: 'blow' " \
                       '(forward-output)'
    header = lines[1].split()
    assert header[:4] == ['where', 'module/parameter', 'dtype', 'shape']
    assert 'max |value|' in lines[1] and lines[1].rstrip().endswith('problem')
    assert set(lines[2].replace(' ', '')) == {'-'}
    assert lines[3].split()[:3] == ['forward-output', 'blow', 'float16']
    assert lines[3].endswith('3 inf of 12')
    assert lines[4].split()[:2] == ['backward-grad', 'stem']
    assert [line.split()[1] for line in lines[5:8]] == [
        'stem.weight', 'stem.bias', 'head.weight']
    assert 'checked 5 module calls (4 with non-finite outputs)' in str(report)

    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data['first_module'] == 'blow' and data['ok'] is False
    assert data['forward']['dtype'] == 'float16'
    assert data['forward']['shape'] == [3, 4]
    assert data['forward']['has_inf'] is True
    assert [p['name'] for p in data['parameters']] == [
        'stem.weight', 'stem.bias', 'head.weight']
    assert "first_module='blow'" in repr(report)


def test_empty_report():
    report = OverflowReport()
    assert report.ok and report.first_module is None and report.hints() == []
    assert 'no non-finite values found' in str(report)


# ------------------------------------------------------- nonfinite_summary


def test_nonfinite_summary_inputs():
    good, bad = torch.ones(3), torch.tensor([1.0, float('inf'), float('nan')])
    recs = nonfinite_summary([good, bad, torch.arange(3), 'not a tensor'])
    assert [(r.name, r.kind, r.num_inf, r.num_nan, r.max_abs) for r in recs] == [
        ('1', 'value', 1, 1, 1.0)]
    assert nonfinite_summary({'good': good}) == []
    assert [r.name for r in nonfinite_summary({'good': good, 'bad': bad})] == ['bad']
    assert [r.name for r in nonfinite_summary([('x', bad)])] == ['x']

    z = torch.tensor([1 + 1j, complex(float('inf'), 0.0)])
    (rec,) = nonfinite_summary([z])
    assert rec.dtype == torch.complex64 and rec.shape == (2,) and rec.num_inf == 1


def test_nonfinite_summary_grads():
    lin = nn.Linear(2, 2)
    lin.weight.grad = torch.tensor([[1.0, float('inf')], [2.0, -3.0]])
    lin.bias.grad = None
    (rec,) = nonfinite_summary(lin, grads=True)
    assert isinstance(rec, NonFiniteRecord)
    assert (rec.kind, rec.name, rec.num_inf, rec.max_abs) == ('param-grad', 'weight', 1, 3.0)
    assert nonfinite_summary(lin) == []  # the values themselves are finite
    (rec,) = nonfinite_summary(lin.named_parameters(), grads=True)
    assert rec.kind == 'grad'


def test_public_api():
    for name in ('find_overflow', 'OverflowReport', 'NonFiniteRecord',
                 'nonfinite_summary'):
        assert name in fp16utils.__all__
    assert fp16utils.__all__ == sorted(fp16utils.__all__)


def test_nonfinite_summary_reads_a_float64_magnitude_beyond_float32_exactly():
    (record,) = nonfinite_summary(torch.tensor([1e300, -3.0, float('inf')],
                                               dtype=torch.float64))
    assert record.max_abs == 1e300 and record.num_inf == 1
    (half,) = nonfinite_summary(torch.tensor([65504., float('nan')], dtype=torch.float16))
    assert half.max_abs == 65504.0
