"""eval_precision and configured_precision (fp16utils.evaluation): no framework needed.

The forwards run in the dtype asked for (the half model's, for a legacy model), the
modules named run in float32 while the context is open and are put back after it,
``@force_fp32`` methods get float32, and what a wrapper or its config configured is
read back; each refusal names the problem and changes nothing.
"""

from __future__ import annotations

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    OptimWrapper,
    OptimWrapperDict,
    force_fp32,
    keep_fp32,
    kept_fp32,
    wrap_fp16_model,
)
from fp16utils._torch import autocast
from fp16utils.evaluation import EvalPrecision, configured_precision, eval_precision
from fp16utils.precision import auto_dtype

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
#: Largest |half - float32| / largest |float32| of Net's output, measured over the
#: initial weights of seeds 0-9: float16 6.9e-4 (native and legacy), bfloat16 6.5e-3
#: (native; legacy 4.4e-3); the tolerances leave a factor of about 3.
TOL = {F16: 2e-3, BF16: 2e-2}


class Head(nn.Module):
    """A 0.x head: its results are ``@force_fp32``; records what they received."""

    fp16_enabled = False  # wrap_fp16_model turns it on

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.seen: list = []

    def forward(self, x):
        return self.fc(x)

    @force_fp32(apply_to=('scores',))
    def get_results(self, scores):
        self.seen.append((scores.dtype, _caps.autocast_now()[0]))
        return scores.softmax(-1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm1d(8)
        self.proj = nn.Linear(8 * 6, 16)
        self.head = Head()

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        scores = self.head(torch.relu(self.proj(x.flatten(1))))
        return scores, self.head.get_results(scores)


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().eval()


def inputs() -> torch.Tensor:
    return torch.randn(5, 3, 6, generator=torch.Generator().manual_seed(1)) * 2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max())


def record_dtypes(model: nn.Module, names) -> dict:
    seen: dict = {}

    def hook(name):
        def record(module, args, out):
            seen.setdefault(name, out.dtype)
        return record

    for name in names:
        model.get_submodule(name).register_forward_hook(hook(name))
    return seen


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_native_forward_runs_the_dtype_force_fp32_gets_float32_and_matches(dtype):
    model = net()
    with torch.no_grad():
        ref, _ = model(inputs())
    seen = record_dtypes(model, ['conv', 'proj', 'head.fc'])
    with torch.no_grad(), eval_precision(model, dtype) as precision:
        scores, probs = model(inputs())
    assert (precision.dtype, precision.backend, precision.device_type) == (dtype, 'native', 'cpu')
    assert seen == {'conv': dtype, 'proj': dtype, 'head.fc': dtype}
    assert model.head.seen[-1] == (F32, False)  # @force_fp32: float32, autocast off
    assert probs.dtype == F32
    assert rel_err(scores, ref) <= TOL[dtype]
    assert not _caps.autocast_now()[0]  # left as it was


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_fp32_modules_are_kept_while_open_and_put_back_after(dtype):
    model = net()
    keep_fp32(model, 'conv')  # kept before: stays kept
    own = model.norm.forward  # a forward set on the instance: put back as it was
    model.norm.forward = own
    seen = record_dtypes(model, ['conv', 'proj', 'head.fc'])
    with torch.no_grad(), eval_precision(model, dtype, fp32_modules=['proj', 'Head']):
        model(inputs())
        assert kept_fp32(model) == ['conv', 'proj', 'head']
    assert seen == {'conv': F32, 'proj': F32, 'head.fc': F32}
    assert kept_fp32(model) == ['conv']
    assert 'forward' not in vars(model.proj) and vars(model.norm)['forward'] is own

    with pytest.raises(RuntimeError, match='boom'), eval_precision(model, dtype,
                                                                   fp32_modules=['proj']):
        raise RuntimeError('boom')
    assert kept_fp32(model) == ['conv'] and not _caps.autocast_now()[0]


@pytest.mark.parametrize('dtype', _caps.LEGACY_DTYPES)
def test_a_half_model_is_evaluated_half_with_its_inputs_cast(dtype):
    model = net()
    with torch.no_grad():
        ref, _ = model(inputs())
    wrap_fp16_model(model, dtype, backend='legacy', fp32_modules=['head.fc'])
    seen = record_dtypes(model, ['conv', 'proj', 'head.fc'])
    precision = eval_precision(model)  # the model is half: legacy, its dtype
    assert (precision.backend, precision.dtype) == ('legacy', dtype)
    with torch.no_grad(), precision:
        scores, probs = model(inputs())  # float32 inputs: cast on the way in
    # The kept head.fc ran in float32 (its weights are: half inputs would not run) and
    # gave its output back in the model's dtype.
    assert seen == {'conv': dtype, 'proj': dtype, 'head.fc': dtype}
    assert model.head.fc.weight.dtype == F32 and model.proj.weight.dtype == dtype
    assert scores.dtype == probs.dtype == F32  # outputs cast back to float32
    assert model.head.seen[-1] == (F32, False)
    assert rel_err(scores, ref) <= TOL[dtype]
    # The kept module may be named again; a half one may not.
    eval_precision(model, fp32_modules=['head.fc'])
    with pytest.raises(ValueError, match=r"\['proj'\] hold .* weights: a half model keeps "
                                         r'modules in float32 when it is converted'):
        eval_precision(model, fp32_modules=['proj'])
    other = BF16 if dtype == F16 else F16
    with pytest.raises(ValueError, match='so it evaluates in'):
        eval_precision(model, other)


def test_full_precision_and_auto():
    model = net()
    with torch.no_grad(), eval_precision(model, 'float32') as precision:
        scores, _ = model(inputs())
    assert precision.dtype == F32 and scores.dtype == F32
    assert eval_precision(model, 'auto').dtype == auto_dtype('cpu')[0]


def test_default_dtype_is_float16_where_autocast_runs_it_else_bfloat16(monkeypatch):
    model = net()
    monkeypatch.setattr(autocast, 'autocast_supports', lambda device_type, dtype: True)
    assert eval_precision(model).dtype == F16
    # An old torch: CPU autocast in bfloat16 only (MMEngine's loops pick it too).
    monkeypatch.setattr(autocast, 'autocast_supports',
                        lambda device_type, dtype: dtype == BF16)
    assert eval_precision(model).dtype == BF16
    with pytest.raises(ValueError, match=r"autocast on 'cpu' cannot run float16 with torch "
                                         r".*; evaluate with dtype='bfloat16', or convert the "
                                         r"model with wrap_fp16_model\(model, 'float16', "
                                         r"backend='legacy'\) first"):
        eval_precision(model, 'float16')
    monkeypatch.setattr(autocast, 'autocast_supports', lambda device_type, dtype: False)
    with pytest.raises(ValueError, match='runs neither float16 nor bfloat16'):
        eval_precision(model)


def test_refusals_name_the_problem_and_change_nothing():
    model = net()
    with pytest.raises(TypeError, match='takes an nn.Module, got str'):
        eval_precision('model')
    with pytest.raises(ValueError, match="'projection' matches no module"):
        eval_precision(model, fp32_modules=['projection'])
    with pytest.raises(ValueError, match="backend='legacy' evaluates a half model, and this "
                                         'one has no half parameters'):
        eval_precision(model, backend='legacy')
    with pytest.raises(ValueError, match='Unsupported'):
        eval_precision(model, 'int8')
    assert kept_fp32(model) == [] and {p.dtype for p in model.parameters()} == {F32}


def test_entering_twice_nests():
    model = net()
    precision = eval_precision(model, _caps.LOW, fp32_modules=['proj'])
    assert isinstance(precision, EvalPrecision)
    with precision:
        with precision:
            assert kept_fp32(model) == ['proj']
        assert kept_fp32(model) == ['proj'] and _caps.autocast_now()[0]
    assert kept_fp32(model) == [] and not _caps.autocast_now()[0]


# -- configured_precision --------------------------------------------------------------------


def amp_wrapper(module, dtype=_caps.LOW, **kwargs):
    return AmpOptimWrapper(torch.optim.SGD(module.parameters(), lr=0.1), dtype=dtype, **kwargs)


def test_reads_a_built_wrapper_and_a_dict_of_them():
    model = net()
    wrapper = amp_wrapper(model, fp32_modules=['head'], model=model)
    assert configured_precision(wrapper) == (_caps.LOW, wrapper.backend, ['head'])
    assert configured_precision(OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))) == (
        None, None, None)
    assert configured_precision(None) == (None, None, None)

    class MMEngineLike:  # MMEngine's AmpOptimWrapper: cast_dtype, no backend
        cast_dtype = BF16

    assert configured_precision(MMEngineLike()) == (BF16, None, None)
    both = OptimWrapperDict(conv=amp_wrapper(model.conv), head=amp_wrapper(model.head))
    assert configured_precision(both)[0] == _caps.LOW
    if len(_caps.LOW_DTYPES) == 2:
        mixed = OptimWrapperDict(conv=amp_wrapper(model.conv, F16),
                                 head=amp_wrapper(model.head, BF16))
        with pytest.raises(ValueError, match=r"different dtypes \(\{'conv': torch.float16, "
                                             r"'head': torch.bfloat16\}\)"):
            configured_precision(mixed)
        assert configured_precision(mixed, 'float16')[0] == 'float16'  # the loop's own
    other = net()
    legacy = amp_wrapper(other.head, _caps.LEGACY_LOW, backend='legacy', model=other.head)
    with pytest.raises(ValueError, match=r"different backends .*'head': 'legacy'.*partly "
                                         r'converted to half'):
        configured_precision(OptimWrapperDict(conv=amp_wrapper(other.conv, backend='native'),
                                              head=legacy), 'float16')


def test_reads_wrapper_configs_as_a_runner_holds_them():
    single = dict(type='AmpOptimWrapper', dtype='bf16', fp32_modules=['head.*'],
                  optimizer=dict(type='SGD', lr=0.1))
    assert configured_precision(single) == (BF16, None, ['head.*'])
    assert configured_precision(dict(single, type='Fp16utilsAmpOptimWrapper', dtype='auto'))[
        0] == 'auto'
    assert configured_precision(dict(type='OptimWrapper', optimizer={})) == (None, None, None)
    multi = dict(constructor='Fp16utilsMultiOptimWrapperConstructor',
                 generator=dict(single, fp32_modules=['fc', 'LayerNorm', nn.ReLU]),
                 discriminator=dict(type='OptimWrapper', optimizer={}))
    assert configured_precision(multi) == (BF16, None, ['generator.fc', 'LayerNorm', nn.ReLU])
    with pytest.raises(ValueError, match='Unsupported'):
        configured_precision(dict(single, dtype='float8'))
