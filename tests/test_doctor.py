"""Tests for the precision doctor: diagnose_precision, PrecisionReport, ``fp16utils doctor``.

The failures are torch's own, on the CPU: a ``torch.mm`` with a float32 table (a plain
attribute, so ``model.half()`` leaves it float32), an ``index_add_`` into a float32
buffer, a projection whose output exceeds float16's range, and a large offset added
and taken away (the small part is lost in low precision).
"""

from __future__ import annotations

import copy
import io
import json
import sys

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
from fp16utils import AmpOptimWrapper, PrecisionReport, diagnose_precision, kept_fp32
from fp16utils.tools import cli

F16, BF16 = torch.float16, torch.bfloat16


class TableLookup(nn.Module):
    """Multiplies by a float32 table kept as a plain attribute (not a buffer)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.table = torch.eye(n)

    def forward(self, x):
        return torch.mm(self.fc(x), self.table)


class ScatterSum(nn.Module):
    """Adds rows into a float32 buffer with ``index_add_``, as pooling code does."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        out = torch.zeros(x.shape[0], x.shape[1])
        return out.index_add_(0, torch.arange(x.shape[0]), self.fc(x))


class Blowup(nn.Module):
    """A projection above 65504 (float16's largest value), scaled down afterwards."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)
        with torch.no_grad():
            self.fc.weight.fill_(2e4)
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(x.abs() + 1) * 1e-5


class Offset(nn.Module):
    """Adds 4000 and takes it away: float16 keeps steps of 2 there, bfloat16 of 16."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)
        with torch.no_grad():
            self.fc.bias.fill_(4000.)

    def forward(self, x):
        return self.fc(x) - 4000.


class Net(nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, n)
        self.table = TableLookup(n)
        self.scatter = ScatterSum(n)
        self.blowup = Blowup(n)
        self.offset = Offset(n)
        self.head = nn.Linear(n, 1)

    def forward(self, x):
        x = self.offset(self.blowup(self.scatter(self.table(self.stem(x)))))
        return self.head(x).mean()


def net_and_input():
    torch.manual_seed(0)
    return Net(), torch.randn(4, 8)


#: (dtype, backend) -> the problems found, in order, and the suggested fp32_modules.
EXPECTED = {
    (F16, 'native'): ([('scatter', 'dtype-error'), ('blowup.fc', 'nonfinite'),
                       ('offset', 'drift')], ['scatter', 'blowup.fc', 'offset']),
    # The legacy backend casts a kept module's output back to float16: blowup.fc's
    # 4e5 overflows there, so the module around it is kept instead.
    (F16, 'legacy'): ([('table', 'dtype-error'), ('scatter', 'dtype-error'),
                       ('blowup.fc', 'nonfinite'), ('blowup', 'nonfinite'),
                       ('offset', 'drift')], ['table', 'scatter', 'blowup', 'offset']),
    (BF16, 'native'): ([('scatter', 'dtype-error'), ('offset', 'drift')],
                       ['scatter', 'offset']),
    (BF16, 'legacy'): ([('table', 'dtype-error'), ('scatter', 'dtype-error'),
                        ('offset', 'drift')], ['table', 'scatter', 'offset']),
}
CASES = [pytest.param(d, b, id=f'{_caps.NAMES[d]}-{b}') for d, b in EXPECTED]


def _require(dtype, backend):
    _caps.require(dtype, backend, scaled=False)


@pytest.mark.parametrize('dtype, backend', CASES)
def test_finds_the_modules_says_why_and_verifies_the_fix(dtype, backend):
    _require(dtype, backend)
    model, x = net_and_input()
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    report = diagnose_precision(model, x, dtype=dtype, backend=backend)
    problems, fix = EXPECTED[(dtype, backend)]
    assert [(p.name, p.kind) for p in report.problems] == problems
    assert report.fp32_modules == fix
    assert report.verified and not report.ok and report.unfixable == []
    assert report.backward == 'ran'
    assert report.max_error is not None and report.max_error <= report.tolerance == 0.05
    # The caller's model and random state are as they were: weights, dtypes, no hooks.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(not m._forward_hooks and not m._forward_pre_hooks and 'forward' not in vars(m)
               for m in model.modules())
    assert kept_fp32(model) == [] and torch.equal(torch.get_rng_state(), rng)


def test_the_reasons_are_torchs_own_errors_and_the_numbers():
    _require(torch.float16, 'native')
    model, x = net_and_input()
    report = diagnose_precision(model, x, dtype='float16', backend='native')
    scatter, blowup, offset = report.problems
    assert scatter.module_type == 'ScatterSum' and scatter.detail == (
        'RuntimeError: index_add_(): self (Float) and source (Half) must have the same '
        'scalar type')
    assert scatter.fp32_entry == 'scatter' and scatter.found_in_run == 1
    assert blowup.module_type == 'Linear' and blowup.detail.startswith(
        '64 inf of 64 in its float16 output from finite inputs; largest |float32 output| ')
    assert blowup.detail.endswith('(float16 holds at most 65504)') and blowup.found_in_run == 2
    assert offset.kind == 'drift' and offset.found_in_run == 3
    assert offset.error > 0.05 and offset.error > 4 * offset.input_error
    assert report.runs == 4  # three that each found one more, then the verification


def test_the_legacy_backend_names_torchs_mm_error():
    model, x = net_and_input()
    report = diagnose_precision(model, x, dtype='bfloat16', backend='legacy')
    with pytest.raises(RuntimeError) as raised:  # what this torch says, word for word
        torch.mm(torch.ones(1, 1, dtype=torch.bfloat16), torch.ones(1, 1))
    assert report.problems[0].detail == f'RuntimeError: {raised.value}'


def test_the_table_the_fix_and_the_verdict_as_printed():
    model, x = net_and_input()
    text = str(diagnose_precision(model, x, dtype='bfloat16', backend='native'))
    lines = text.splitlines()
    assert lines[0] == ('precision doctor: bfloat16, native backend, tolerance 0.05 (relative '
                        'error against float32)')
    assert lines[1].split() == ['module', 'class', 'problem', 'detail']
    assert lines[3].startswith('scatter  ScatterSum  dtype error  RuntimeError: index_add_()')
    assert lines[4].startswith('offset   Offset      drift        relative error ')
    assert lines[5] == "fix: keep these modules in float32: fp32_modules = ['scatter', 'offset']"
    assert lines[6] == ("  1.x config: optim_wrapper = dict(type='AmpOptimWrapper', "
                        "dtype='bfloat16', fp32_modules=['scatter', 'offset'], optimizer=...)")
    assert lines[7] == ("  0.x script: keep_fp32(model, ['scatter', 'offset'])  # after building "
                        'the model')
    assert lines[8].startswith('verified: the model runs clean in bfloat16 with these modules '
                               'in float32 (forward and backward ran; output error ')
    assert len(lines) == 9


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_a_training_step_works_with_the_suggested_fp32_modules(dtype):
    _require(dtype, 'native')
    model, x = net_and_input()
    fix = diagnose_precision(model, x, dtype=dtype).fp32_modules
    bare = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=1e-3), dtype=dtype)
    with pytest.raises(RuntimeError, match='must have the same scalar type'):
        with bare.optim_context(model):
            model(x)
    # A small initial scale: the scaled float16 backward of the 2e4 weights fits.
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=1e-3), dtype=dtype,
                              loss_scale=dict(init_scale=16.), model=model, fp32_modules=fix)
    head = model.head.weight.detach().clone()
    for _ in range(3):
        with wrapper.optim_context(model):
            loss = model(x)
        result = wrapper.update_params(loss)
        assert result.stepped and torch.isfinite(loss)
    assert wrapper.skipped_steps == 0 and not torch.equal(head, model.head.weight)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_clean_model_needs_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    report = diagnose_precision(model, torch.randn(4, 8), dtype='bfloat16',
                                loss_fn=lambda out: out.float().pow(2).mean())
    assert report.ok and report.problems == [] and report.fp32_modules == []
    assert report.runs == 1 and report.backward == 'ran'
    text = str(report)
    assert 'no module fails, overflows or drifts in bfloat16.' in text and 'fix:' not in text
    assert report.to_dict()['config_1x'] is None


def test_modules_of_one_class_are_named_by_the_class():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Offset(16), nn.ReLU(), Offset(16), nn.Linear(16, 1))
    report = diagnose_precision(model, torch.randn(4, 8), dtype='bfloat16',
                                loss_fn=lambda out: out.float().sum())
    assert [(p.name, p.kind) for p in report.problems] == [('1', 'drift'), ('3', 'drift')]
    assert report.fp32_modules == ['Offset'] and report.verified


def test_given_fp32_modules_are_kept_from_the_start():
    model, x = net_and_input()
    report = diagnose_precision(model, x, dtype='bfloat16', fp32_modules=[ScatterSum])
    assert [(p.name, p.kind) for p in report.problems] == [('offset', 'drift')]
    assert report.fp32_modules == ['ScatterSum', 'offset'] and report.verified


class OwnScatter(nn.Module):
    """The failing op in the model's own forward, outside any submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.zeros(2, 4).index_add_(0, torch.arange(2), self.fc(x)).sum()


def test_an_op_outside_any_submodule_cannot_be_fixed_and_says_so():
    report = diagnose_precision(OwnScatter(), torch.randn(2, 4), dtype='bfloat16')
    assert [(p.name, p.kind, p.fp32_entry) for p in report.problems] == [
        ('<root>', 'dtype-error', None)]
    assert report.fp32_modules == [] and not report.verified
    line = 'return torch.zeros(2, 4).index_add_(0, torch.arange(2), self.fc(x)).sum()'
    at = f' (at test_doctor.py:{OwnScatter.forward.__code__.co_firstlineno + 1}: {line})'
    assert report.problems[0].detail.endswith(at)
    assert report.unfixable == [
        f"dtype error in the model's own forward, outside any submodule{at}; run that op in "
        'float32: wrap the function with fp16utils.fp32_function, put it in a submodule, or '
        'decorate the method with @force_fp32']
    assert 'cannot fix: dtype error in the model' in str(report)


class Detector(nn.Module):
    """Returns a dict of losses, as OpenMMLab models do in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Linear(4, 3)
        self.reg = nn.Linear(4, 2)

    def forward(self, x, scale=1.0):
        return dict(loss_cls=self.cls(x).pow(2).mean() * scale,
                    loss_bbox=[self.reg(x).abs().mean(), self.reg(x).abs().sum()],
                    acc=torch.tensor(0.5))


def test_a_dict_of_losses_is_summed_and_backward_runs_with_keyword_inputs():
    torch.manual_seed(0)
    report = diagnose_precision(Detector(), torch.randn(2, 4), scale=2.0, dtype='bfloat16')
    assert report.ok and report.backward == 'ran'


def test_an_output_that_is_no_loss_skips_the_backward_and_says_why():
    torch.manual_seed(0)
    report = diagnose_precision(nn.Linear(4, 3), torch.randn(2, 4), dtype='bfloat16')
    assert report.verified and report.backward.startswith(
        'not run: the output is neither a scalar nor a dict of losses; pass loss_fn=')


def test_a_model_that_fails_in_float32_is_reported_and_nothing_more_is_run():
    model, _ = net_and_input()
    report = diagnose_precision(model, torch.randn(4, 5), dtype='bfloat16')  # stem: 8 in
    assert report.float32_error.startswith('RuntimeError: mat1 and mat2 shapes cannot be')
    assert report.runs == 0 and report.problems == [] and not report.verified and not report.ok
    assert str(report).splitlines()[1].startswith('the model fails in float32: RuntimeError')


def test_a_model_with_inf_in_float32_is_reported_as_failing_in_float32():
    class Inf(nn.Linear):
        def forward(self, x):
            return super().forward(x) / 0

    report = diagnose_precision(nn.Sequential(nn.Linear(2, 2), Inf(2, 2)), torch.ones(1, 2),
                                dtype='bfloat16')
    assert report.float32_error == "'1' (Inf) outputs inf or nan in float32 already"


@pytest.mark.parametrize('call, error, match', [
    (lambda: diagnose_precision(lambda x: x, torch.ones(2)), TypeError, 'examines an nn.Module'),
    (lambda: diagnose_precision(nn.ReLU(), torch.ones(2)), ValueError,
     'ReLU has no floating-point parameters'),
    (lambda: diagnose_precision(nn.Linear(2, 2), torch.ones(2), backend='apex'), ValueError,
     r"backend='apex'"),
    (lambda: diagnose_precision(nn.Linear(2, 2), torch.ones(2), tolerance=0), ValueError,
     'tolerance=0'),
    (lambda: diagnose_precision(nn.Linear(2, 2), torch.ones(2), dtype='float64'), ValueError,
     'Unsupported low-precision dtype'),
    (lambda: diagnose_precision(nn.Linear(2, 2), torch.ones(2), loss_fn=3), TypeError, 'loss_fn'),
    (lambda: diagnose_precision(nn.Linear(2, 2), torch.ones(2), fp32_modules=['nope']),
     ValueError, "'nope' matches no module"),
])
def test_what_cannot_be_diagnosed_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_an_integer_only_model_has_no_floating_parameters():
    model = nn.Module()
    model.register_buffer('table', torch.arange(4))
    with pytest.raises(ValueError, match='no floating-point parameters'):
        diagnose_precision(model, torch.ones(2))


def test_the_report_is_json_and_the_public_paths_hold():
    model, x = net_and_input()
    data = json.loads(json.dumps(diagnose_precision(model, x, dtype='bfloat16').to_dict()))
    assert data['fp32_modules'] == ['scatter', 'offset'] and data['verified'] is True
    assert [p['kind'] for p in data['problems']] == ['dtype-error', 'drift']
    assert data['code_0x'] == "keep_fp32(model, ['scatter', 'offset'])"
    assert fp16utils.find_overflow is fp16utils.debug.find_overflow
    assert fp16utils.debug.find_overflow is fp16utils.debug.overflow.find_overflow
    assert fp16utils.PrecisionReport is PrecisionReport is fp16utils.debug.PrecisionReport
    assert fp16utils.diagnose_precision is fp16utils.debug.doctor.diagnose_precision


# ---------------------------------------------------------------- fp16utils doctor


def _factory(tmp_path, monkeypatch, body='from test_doctor import Net\n\n\ndef build():\n'
             '    import torch\n    torch.manual_seed(0)\n    return Net()\n'):
    (tmp_path / 'doctor_models.py').write_text(body)
    monkeypatch.delitem(sys.modules, 'doctor_models', raising=False)  # another test's
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _main(*args):
    out = io.StringIO()
    return cli.main(list(args), out=out), out.getvalue()


def test_the_command_prints_the_table_and_exits_1_on_problems(tmp_path, monkeypatch):
    _factory(tmp_path, monkeypatch)
    code, text = _main('doctor', 'doctor_models:build', '--input-shape', '4,8',
                       '--dtype', 'bfloat16')
    assert code == 1
    lines = text.splitlines()
    assert lines[0] == ('input: torch.randn(4, 8) (float32, seed 0) to doctor_models:build()')
    assert "fp32_modules = ['scatter', 'offset']" in text and 'verified: ' in text
    code, text = _main('doctor', 'doctor_models.py:build', '--input-shape', '4,8', '--json',
                       '--backend', 'legacy', '--dtype', 'bfloat16')
    data = json.loads(text)
    assert code == 1 and data['fp32_modules'] == ['table', 'scatter', 'offset']
    assert data['backend'] == 'legacy' and data['input'].startswith('torch.randn(4, 8)')


def test_the_command_exits_0_on_a_clean_model(tmp_path, monkeypatch):
    _factory(tmp_path, monkeypatch, 'import torch\n\n\ndef build():\n'
             '    return torch.nn.Sequential(torch.nn.Linear(8, 2))\n')
    code, text = _main('doctor', 'doctor_models:build', '--input-shape', '3,8', '--tolerance',
                       '0.1', '--dtype', 'bfloat16')
    assert code == 0 and 'no module fails, overflows or drifts in bfloat16.' in text
    assert 'tolerance 0.1 ' in text


@pytest.mark.parametrize('args, code, message', [
    (['doctor_models:build'], 2, '--input-shape is required with MODULE:FACTORY'),
    (['doctor_models:build', '--input-shape', '4,x'], 2, 'give positive integers'),
    (['nowhere:build', '--input-shape', '4'], 2, 'nowhere: no such module'),
    (['doctor_models:nope', '--input-shape', '4'], 2, 'has no function'),
    (['doctor_models:thing', '--input-shape', '4'], 1,
     'the factory returned int, not an nn.Module'),
    (['model.txt'], 2, 'give MODULE:FACTORY or a config file ending in .py'),
    (['missing.py'], 2, 'missing.py: no such file'),
])
def test_the_command_refuses_in_one_line(tmp_path, monkeypatch, capsys, args, code, message):
    _factory(tmp_path, monkeypatch, 'def build():\n    pass\n\n\ndef thing():\n    return 3\n')
    assert _main('doctor', *args)[0] == code
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


class Decorated(nn.Module):
    """A 0.x module: ``@auto_fp16`` on its forward, then a float32 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16_enabled = False
        self.fc = nn.Linear(4, 4)

    @fp16utils.auto_fp16()
    def project(self, x):
        return self.fc(x)

    def forward(self, x):
        return torch.zeros(2, 4).index_add_(0, torch.arange(2), self.project(x))


def test_auto_fp16_inside_a_kept_module_stays_off_and_the_fix_verifies():
    # wrap_fp16_model leaves fp16_enabled alone inside a kept island (the hooks' call
    # included), so the island's @auto_fp16 methods do not cast back to half.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Decorated())
    native = diagnose_precision(model, torch.randn(2, 4), dtype='bfloat16')
    assert native.fp32_modules == ['1'] and native.verified and native.notes == []
    legacy = diagnose_precision(model, torch.randn(2, 4), dtype='bfloat16', backend='legacy')
    assert [(p.name, p.kind) for p in legacy.problems] == [('1', 'dtype-error')]
    assert legacy.fp32_modules == ['1'] and legacy.verified and legacy.unfixable == []


class SharedHead(nn.Module):
    """One head applied to three feature levels; the second level's values are large."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 8)

    def forward(self, x):
        levels = (x, x * 3e4, x * 0.5)
        return torch.stack([self.head(level) for level in levels]).float().mean()


def test_a_module_called_more_than_once_names_the_calls_that_fail():
    _caps.require(torch.float16, 'native')
    torch.manual_seed(0)
    model = SharedHead()
    with torch.no_grad():
        model.head.weight.fill_(1.0)
    report = diagnose_precision(model, torch.rand(2, 8) + 1.0, dtype='float16')
    problem = report.problems[0]
    assert (problem.name, problem.kind) == ('head', 'nonfinite')
    assert problem.calls == (2,) and problem.call_count == 3
    assert problem.detail.endswith('(call 2 of 3)')
    assert report.to_dict()['problems'][0]['calls'] == [2]
    assert report.fp32_modules == ['head'] and report.verified
    assert '(call 2 of 3)' in str(report)
