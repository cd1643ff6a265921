"""``Fp16utilsValLoop`` / ``Fp16utilsTestLoop`` in a real ``mmengine.runner.Runner`` on the CPU.

``fp16=True`` runs the dtype the optimizer wrapper was configured with (MMEngine's
own loops run bfloat16 on the CPU whatever it was), keeps its ``fp32_modules`` and
the loop's own in float32, evaluates a model that the legacy backend made half, and
reads the wrapper's config when nothing is trained (``runner.test()``). The
predictions stay within ``TOL`` of a float32 evaluation of the same weights.
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch
from torch import nn

_spec = find_spec('mmengine')
if _spec is None or _spec.origin is None:  # absent, or only this folder (a namespace package)
    pytest.skip('mmengine is not installed: run .ci/mmengine for this tier',
                allow_module_level=True)
from mmengine.config import Config  # noqa: E402
from mmengine.evaluator import BaseMetric  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.registry import DATASETS, METRICS, MODELS  # noqa: E402
from mmengine.runner import Runner, ValLoop  # noqa: E402

import fp16utils.mmengine as loops  # noqa: E402  (registers the loops in LOOPS)
from fp16utils import kept_fp32  # noqa: E402

#: Largest |half - float32| / largest |float32| of the toy model's predictions under
#: autocast, measured over the initial weights of seeds 0-9: float16 9.7e-4, bfloat16
#: 6.5e-3 (float16 keeps 3 more bits); the tolerances leave a factor of about 3.
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


@MODELS.register_module(force=True)
class Fp16utilsEvalToy(BaseModel):
    """Records, per predict-mode forward, the dtype each layer computed in."""

    seen: list = []
    fail = False  # raise in the predict-mode forward

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, inputs, target, mode='tensor'):
        hidden = torch.relu(self.fc1(inputs))
        out = self.fc2(hidden)
        if mode == 'loss':
            return dict(loss=(out.float() - target).pow(2).mean())
        if Fp16utilsEvalToy.fail:
            raise RuntimeError('the forward failed')
        Fp16utilsEvalToy.seen.append(dict(
            input=inputs.dtype, fc1=hidden.dtype, fc2=out.dtype, weight=self.fc1.weight.dtype,
            autocast=torch.is_autocast_enabled('cpu'),
            autocast_dtype=torch.get_autocast_dtype('cpu')))
        return [dict(pred=o.float(), target=t) for o, t in zip(out, target)]


@DATASETS.register_module(force=True)
class Fp16utilsEvalToyData(torch.utils.data.Dataset):
    metainfo = dict()

    def __init__(self, n=8):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g) * 3
        self.y = torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return dict(inputs=self.x[i], target=self.y[i])


@METRICS.register_module(force=True)
class Fp16utilsEvalToyMetric(BaseMetric):
    """The mean squared error; keeps every prediction in ``preds``."""

    preds: list = []

    def process(self, data_batch, data_samples):
        for s in data_samples:
            Fp16utilsEvalToyMetric.preds.append(s['pred'].clone())
            self.results.append(float((s['pred'] - s['target']).pow(2).mean()))

    def compute_metrics(self, results):
        return dict(mse=sum(results) / len(results))


def loader(n=8):
    return dict(dataset=dict(type='Fp16utilsEvalToyData', n=n), batch_size=4, num_workers=0,
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='default_collate'))


_names: list = []


def make_runner(tmp_path, optim_wrapper, val_cfg=None, test_cfg=None, load_from=None):
    cfg = dict(
        model=dict(type='Fp16utilsEvalToy'), work_dir=str(tmp_path / 'work'),
        train_dataloader=loader(), train_cfg=dict(by_epoch=False, max_iters=2, val_interval=2),
        optim_wrapper=optim_wrapper, load_from=load_from,
        default_hooks=dict(checkpoint=None, logger=dict(type='LoggerHook', interval=1)),
        log_processor=dict(by_epoch=False), randomness=dict(seed=0), default_scope=None)
    if val_cfg is not None:
        cfg.update(val_dataloader=loader(), val_evaluator=dict(type='Fp16utilsEvalToyMetric'),
                   val_cfg=val_cfg)
    if test_cfg is not None:
        cfg.update(test_dataloader=loader(), test_evaluator=dict(type='Fp16utilsEvalToyMetric'),
                   test_cfg=test_cfg)
    _names.append(1)  # a new name each time: a Runner named as one of the same second
    path = tmp_path / f'eval_loops_{len(_names)}.py'  # shares its logger
    path.write_text(''.join(f'{key} = {value!r}\n' for key, value in cfg.items()))
    return Runner.from_cfg(Config.fromfile(str(path)))


def amp(dtype='float16', **extra):
    return dict(type='Fp16utilsAmpOptimWrapper', dtype=dtype,
                optimizer=dict(type='SGD', lr=0.05), **extra)


@pytest.fixture(autouse=True)
def _clear():
    Fp16utilsEvalToy.seen.clear()
    Fp16utilsEvalToyMetric.preds.clear()
    yield
    Fp16utilsEvalToy.fail = False


def float32_predictions(runner):
    """The predictions of a float32 evaluation of the runner's model (MMEngine's loop)."""
    Fp16utilsEvalToyMetric.preds.clear()
    ValLoop(runner, loader(), dict(type='Fp16utilsEvalToyMetric'), fp16=False).run()
    assert {s['fc1'] for s in Fp16utilsEvalToy.seen[-2:]} == {torch.float32}
    return torch.stack(Fp16utilsEvalToyMetric.preds)


def within(preds, reference, dtype):
    err = float((preds - reference).abs().max() / reference.abs().max())
    return err <= TOL[dtype], err


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_val_loop_runs_the_wrappers_dtype_within_tolerance_of_float32(tmp_path, dtype):
    name = str(dtype).replace('torch.', '')
    runner = make_runner(tmp_path, amp(name), val_cfg=dict(type='Fp16utilsValLoop', fp16=True))
    runner.train()  # two steps, then the validation
    seen = Fp16utilsEvalToy.seen
    assert len(seen) == 2  # two batches
    assert {s['fc1'] for s in seen} == {s['fc2'] for s in seen} == {dtype}
    assert {s['autocast_dtype'] for s in seen} == {dtype} and all(s['autocast'] for s in seen)
    assert {s['weight'] for s in seen} == {torch.float32}  # native: float32 weights
    assert runner.val_loop.precision.dtype == dtype
    half = torch.stack(Fp16utilsEvalToyMetric.preds)
    assert half.dtype == torch.float32  # the model returns them as float
    ok, err = within(half, float32_predictions(runner), dtype)
    assert ok, f'{name}: relative error {err:.3g} > {TOL[dtype]}'
    assert 'Fp16utilsValLoop: evaluating in ' + name in _log_text(runner)


def test_mmengines_own_loop_runs_bfloat16_on_the_cpu_whatever_the_wrapper(tmp_path):
    """Why the loops exist: ValLoop(fp16=True) ignores the float16 the run trained in."""
    runner = make_runner(tmp_path, amp('float16'), val_cfg=dict(type='ValLoop', fp16=True))
    runner.train()
    assert {s['fc1'] for s in Fp16utilsEvalToy.seen} == {torch.bfloat16}
    # The same run with this package's loop: float16.
    Fp16utilsEvalToy.seen.clear()
    runner = make_runner(tmp_path, amp('float16'), val_cfg=dict(type='Fp16utilsValLoop',
                                                                fp16=True))
    runner.train()
    assert {s['fc1'] for s in Fp16utilsEvalToy.seen} == {torch.float16}


def test_wrapper_fp32_modules_and_the_loops_own_hold_and_the_loops_are_put_back(tmp_path):
    runner = make_runner(tmp_path, amp('float16', fp32_modules=['fc2']),
                         val_cfg=dict(type='Fp16utilsValLoop', fp16=True))
    runner.train()
    assert {(s['fc1'], s['fc2']) for s in Fp16utilsEvalToy.seen} == {
        (torch.float16, torch.float32)}
    assert runner.val_loop.precision.fp32_modules == ['fc2']

    # The loop's own fp32_modules: fc1 too, during the loop only.
    Fp16utilsEvalToy.seen.clear()
    runner = make_runner(tmp_path, amp('float16'),
                         val_cfg=dict(type='Fp16utilsValLoop', fp16=True, fp32_modules=['fc1']))
    runner.train()
    assert {(s['fc1'], s['fc2']) for s in Fp16utilsEvalToy.seen} == {
        (torch.float32, torch.float16)}
    model = runner.model
    assert kept_fp32(model) == []  # put back: training goes on in float16
    assert 'val_step' not in model.__dict__
    with runner.optim_wrapper.optim_context(model):
        assert model.fc1(torch.ones(1, 8)).dtype == torch.float16


def test_the_loops_dtype_comes_first_and_fp16_false_is_float32(tmp_path):
    runner = make_runner(tmp_path, amp('float16'),
                         val_cfg=dict(type='Fp16utilsValLoop', fp16=True, dtype='bfloat16'))
    runner.train()
    assert {s['fc1'] for s in Fp16utilsEvalToy.seen} == {torch.bfloat16}

    Fp16utilsEvalToy.seen.clear()
    runner = make_runner(tmp_path, amp('float16'), val_cfg=dict(type='Fp16utilsValLoop'))
    runner.train()
    assert {(s['fc1'], s['autocast']) for s in Fp16utilsEvalToy.seen} == {(torch.float32, False)}
    assert runner.val_loop.precision is None


def test_legacy_wrapper_half_model_evaluates_with_cast_inputs(tmp_path):
    wrapper = amp('float16', backend='legacy', fp32_modules=['fc2'],
                  constructor='Fp16utilsOptimWrapperConstructor')  # it gives the model
    runner = make_runner(tmp_path, wrapper, val_cfg=dict(type='Fp16utilsValLoop', fp16=True))
    runner.train()
    seen = Fp16utilsEvalToy.seen
    assert {(s['input'], s['weight'], s['fc1'], s['fc2'], s['autocast']) for s in seen} == {
        (torch.float16, torch.float16, torch.float16, torch.float16, False)}
    assert runner.model.fc2.weight.dtype == torch.float32  # kept when it was converted
    precision = runner.val_loop.precision
    assert (precision.backend, precision.dtype) == ('legacy', torch.float16)
    half = torch.stack(Fp16utilsEvalToyMetric.preds)
    # The float32 reference: the same (half-rounded) weights in a float32 copy.
    reference = Fp16utilsEvalToy()
    reference.load_state_dict({k: v.float() for k, v in runner.model.state_dict().items()})
    with torch.no_grad():
        ref = torch.cat([reference.fc2(torch.relu(reference.fc1(b['inputs'])))
                         for b in [Fp16utilsEvalToyData()[0:4], Fp16utilsEvalToyData()[4:8]]])
    ok, err = within(half, ref, torch.float16)
    assert ok, err


def test_test_only_run_reads_the_wrappers_config(tmp_path):
    model = Fp16utilsEvalToy()
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), tmp_path / 'float32.pth')
    runner = make_runner(tmp_path, amp('bfloat16', fp32_modules=['fc2']),
                         test_cfg=dict(type='Fp16utilsTestLoop', fp16=True),
                         load_from=str(tmp_path / 'float32.pth'))
    metrics = runner.test()
    assert {(s['fc1'], s['fc2']) for s in Fp16utilsEvalToy.seen} == {
        (torch.bfloat16, torch.float32)}
    assert kept_fp32(runner.model) == []  # the wrapper was never built: kept for the loop only
    half = torch.stack(Fp16utilsEvalToyMetric.preds)
    with torch.no_grad():
        ref = model.fc2(torch.relu(model.fc1(Fp16utilsEvalToyData().x)))
    ok, err = within(half, ref, torch.bfloat16)
    assert ok, err
    assert metrics['mse'] == pytest.approx(float((ref - Fp16utilsEvalToyData().y).pow(2).mean()),
                                           rel=TOL[torch.bfloat16])


def test_bad_loop_settings_are_refused_naming_them(tmp_path):
    runner = make_runner(tmp_path, amp('float16'))
    evaluator = dict(type='Fp16utilsEvalToyMetric')
    with pytest.raises(ValueError, match=r'Fp16utilsValLoop: dtype and fp32_modules .* add '
                                         r'fp16=True'):
        loops.Fp16utilsValLoop(runner, loader(), evaluator, dtype='bfloat16')
    with pytest.raises(ValueError, match=r"unknown dtype 'float8'"):
        loops.Fp16utilsTestLoop(runner, loader(), evaluator, fp16=True, dtype='float8')
    with pytest.raises(TypeError, match='fp32_modules'):
        loops.Fp16utilsValLoop(runner, loader(), evaluator, fp16=True, fp32_modules=[3])
    # Two wrappers of different dtypes and no dtype for the loop: said when it is built.
    runner.optim_wrapper = dict(
        constructor='Fp16utilsMultiOptimWrapperConstructor',
        fc1=amp('float16'), fc2=amp('bfloat16'))
    with pytest.raises(ValueError, match=r"different dtypes \(\{'fc1': torch.float16, 'fc2': "
                                         r'torch.bfloat16\}\).*give the loop its own \(val_cfg '
                                         r'or test_cfg=dict\(\.\.\., dtype=\.\.\.\)\)'):
        loops.Fp16utilsValLoop(runner, loader(), evaluator, fp16=True)
    loop = loops.Fp16utilsValLoop(runner, loader(), evaluator, fp16=True, dtype='float16')
    # A module name that matches nothing: refused when the loop runs, before any step.
    loop.fp32_modules = ['fc3']
    with pytest.raises(ValueError, match="'fc3' matches no module"):
        loop.run()
    assert Fp16utilsEvalToy.seen == [] and 'val_step' not in runner.model.__dict__
    # A step that raises: the loop's fp32_modules and the step are put back all the same.
    loop.fp32_modules = ['fc2']
    Fp16utilsEvalToy.fail = True
    with pytest.raises(RuntimeError, match='the forward failed'):
        loop.run()
    assert kept_fp32(runner.model) == [] and 'val_step' not in runner.model.__dict__
    assert not torch.is_autocast_enabled('cpu')


def _log_text(runner):
    import logging

    for handler in runner.logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.flush()
            with open(handler.baseFilename) as f:
                return f.read()
    raise AssertionError('the runner logs to no file')
