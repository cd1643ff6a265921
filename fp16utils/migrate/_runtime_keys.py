"""0.x runtime keys (``runner``, ``evaluation``, hooks' configs, ...) -> their 1.x keys.

:func:`convert_runtime` runs last in :func:`~fp16utils.migrate.migrate_config`. This
module writes the loops (``runner``/``total_epochs``/``total_iters``/``evaluation`` ->
``train_cfg``/``val_cfg``/``test_cfg``) and moves model settings out of the way;
``_runtime_hooks`` writes ``default_hooks`` and the logging keys, ``_runtime_env`` the
environment, resume, randomness and the keys 1.x has no place for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ._runtime_common import RuntimeState, short
from ._runtime_env import convert_env
from ._runtime_hooks import convert_hooks

__all__ = ['convert_runtime']

_MISSING: Any = object()

#: What a 1.x loop config may hold: a ``train_cfg``/``test_cfg`` with other keys only is
#: a 0.x model setting (``build_model(cfg.model, train_cfg=cfg.train_cfg, ...)``).
_LOOP_KEYS = frozenset({'type', 'by_epoch', 'max_epochs', 'max_iters', 'val_begin',
                        'val_interval', 'dynamic_intervals', 'fp16'})
_RUNNERS = {
    'EpochBasedRunner': ('EpochBasedTrainLoop', 'max_epochs'),
    'IterBasedRunner': ('IterBasedTrainLoop', 'max_iters'),
    'DynamicIterBasedRunner': ('IterBasedTrainLoop', 'max_iters'),
}
#: DynamicIterBasedRunner arguments with no 1.x loop argument.
_DYNAMIC_ARGS = ('is_dynamic_ddp', 'pass_training_status')
#: ``evaluation`` arguments that the 1.x CheckpointHook takes, same names.
_BEST_ARGS = ('save_best', 'rule', 'greater_keys', 'less_keys')
#: ``evaluation`` arguments the loop or the runner decides in 1.x, dropped as exact.
_EVAL_DROPPED = {'by_epoch': _MISSING, 'type': _MISSING, 'priority': 'LOW',
                 'save_image': False}
#: The evaluation loops each codebase's 1.x release writes (the others: MMEngine's).
#: mmagic's multi-loops run one or several dataloaders and take ``fp16`` as well.
_EVAL_LOOPS = {'mmedit': ('MultiValLoop', 'MultiTestLoop'),
               'mmgen': ('MultiValLoop', 'MultiTestLoop')}
#: Codebases whose 0.x training validated only when the config had ``evaluation``.
_EVAL_KEY_ONLY = ('mmedit', 'mmgen')
#: Codebases whose 1.x release writes ``train_cfg=dict(by_epoch=..., ...)``, no type.
_BY_EPOCH_FORM = ('mmcls', 'mmgen')
#: An example evaluator per codebase, for the problem line.
_EVALUATORS = {
    'mmdet': "dict(type='CocoMetric', metric='bbox')",
    'mmseg': "dict(type='IoUMetric', iou_metrics=['mIoU'])",
    'mmcls': "dict(type='Accuracy', topk=(1, 5))",
    'mmedit': "[dict(type='PSNR'), dict(type='SSIM')]",
    'mmgen': "dict(type='Evaluator', metrics=[dict(type='FrechetInceptionDistance', ...)])",
}
_ANY = "dict(type='CocoMetric', metric='bbox') for mmdet"
#: Keys whose presence makes a config one this pass converts.
RUNTIME_KEYS = ('runner', 'total_epochs', 'total_iters', 'evaluation', 'checkpoint_config',
                'log_config', 'workflow', 'dist_params', 'cudnn_benchmark', 'mp_start_method',
                'opencv_num_threads', 'resume_from', 'auto_resume', 'seed', 'deterministic',
                'gpu_ids', 'gpus', 'device', 'data', 'exp_name', 'visual_config', 'use_ddp_wrapper',
                'is_dynamic_ddp', 'apex_amp', 'ipu_replicas', 'sampler', 'empty_cache')


def convert_runtime(out: dict[str, Any], problems: list[str], notes: list[str], *,
                    test_fp16: bool, codebase: Optional[str]) -> None:
    """Replace the 0.x runtime keys in ``out`` by their 1.x keys (in place).

    Each key the 0.x runner or the codebase's training and test scripts read is either
    converted exactly (``runner`` -> ``train_cfg``, ``checkpoint_config`` ->
    ``default_hooks.checkpoint``, ...) or left out of ``out`` with one line in
    ``problems``; new keys take the place of the first 0.x key they replace.

    Args:
        out: the config being converted (the optimizer and schedule passes have run).
        problems: receives one line per key not converted exactly.
        notes: receives one line per value converted as upstream does whose meaning
            changes on the way.
        test_fp16: the codebase's test script ran the model in half precision: the
            ``val_cfg``/``test_cfg`` loops get ``fp16=True``.
        codebase: ``'mmdet'``, ``'mmseg'``, ``'mmcls'``, ``'mmedit'``, ``'mmgen'`` or
            ``None`` (unknown).

    Example:
        >>> cfg = dict(runner=dict(type='EpochBasedRunner', max_epochs=12),
        ...            evaluation=dict(interval=2))
        >>> problems = []
        >>> convert_runtime(cfg, problems, [], test_fp16=False, codebase=None)
        >>> cfg['train_cfg']
        {'type': 'EpochBasedTrainLoop', 'max_epochs': 12, 'val_interval': 2}
        >>> list(cfg), len(problems)
        (['train_cfg', 'val_cfg', 'test_cfg'], 1)
    """
    state = RuntimeState(out, problems, notes, test_fp16, codebase)
    state.legacy = any(k in out for k in RUNTIME_KEYS)
    _model_settings(state)
    save_best = _loops(state)
    convert_hooks(state, save_best)
    convert_env(state)
    result = state.result()
    out.clear()
    out.update(result)


def _is_model_setting(value: Any, key: str) -> bool:
    """Whether a top-level ``train_cfg``/``test_cfg`` is a 0.x model setting."""
    if value is None:
        return True
    if not isinstance(value, Mapping) or not value:
        return False
    return not any(k in _LOOP_KEYS for k in value) and key in ('train_cfg', 'test_cfg')


def _model_settings(state: RuntimeState) -> None:
    """Move 0.x top-level ``train_cfg``/``test_cfg`` model settings into ``model``."""
    for key in ('train_cfg', 'test_cfg'):
        value = state.out.get(key, _MISSING)
        if value is _MISSING or not _is_model_setting(value, key):
            continue
        if value is None and key == 'test_cfg' and state.has('val_cfg'):
            continue  # a 1.x config's "no test loop" (0.x configs have no val_cfg)
        state.leave_out(key)
        if value is None:
            continue
        model = state.out.get('model', _MISSING)
        if model is _MISSING:
            model = {}
            state.put('model', model, (key,))
            if '_base_' not in state.out:
                state.problem(
                    f'{key}: {short(value)} is a model setting but the config has no model; it '
                    f'was written as model.{key}; fine when the model comes from a _base_ '
                    'config, otherwise add the model', 'model-settings')
        elif not isinstance(model, dict):
            state.problem(
                f'{key}: {short(value)} is a model setting (0.x passed it to build_model) but '
                f'model is not a dict; left out; set model.{key} by hand', 'model-settings')
            continue
        if key in model and model[key] != value:
            state.problem(
                f'{key}: {short(value)} is a model setting (0.x passed it to build_model) but '
                f'model.{key} is already {short(model[key])}; the top-level one was left out; '
                f'merge it into model.{key} by hand', 'model-settings')
            continue
        model[key] = value


def _max_count(state: RuntimeState, runner: Mapping[str, Any], unit: str) -> Any:
    """The loop length: ``runner``'s, ``total_epochs``/``total_iters`` when it has none."""
    total_key = 'total_epochs' if unit == 'max_epochs' else 'total_iters'
    own = runner.get(unit, _MISSING)
    total = state.out.get(total_key, _MISSING)
    if own is _MISSING:
        return total
    if total is not _MISSING and total != own:
        # mmedit/mmgen pass total_iters to runner.run(), which overrides max_iters;
        # mmdet/mmcls/mmseg read total_epochs/total_iters only when there is no runner.
        chosen, other = (total, own) if total_key == 'total_iters' else (own, total)
        state.problem(
            f'{total_key}: {total!r} differs from runner.{unit}={own!r}; {chosen!r} (what the '
            f'0.x training script used) became train_cfg.{unit}, {other!r} was dropped; check '
            'the length of training', 'runner-and-loops')
        return chosen
    return own


def _train_loop(state: RuntimeState) -> Optional[dict[str, Any]]:
    """``runner``/``total_epochs``/``total_iters`` -> the ``train_cfg`` loop (or None)."""
    runner = state.out.get('runner', _MISSING)
    state.leave_out('runner', 'total_epochs', 'total_iters')
    if runner is _MISSING or runner is None:
        if 'total_iters' in state.out:
            return dict(type='IterBasedTrainLoop', max_iters=state.out['total_iters'])
        if 'total_epochs' in state.out:
            return dict(type='EpochBasedTrainLoop', max_epochs=state.out['total_epochs'])
        return None
    if not isinstance(runner, Mapping):
        state.problem(f'runner: {short(runner)} is not a runner dict; left out; write '
                      'train_cfg=dict(type=..., max_epochs/max_iters=...) by hand',
                      'runner-and-loops')
        return None
    kind = runner.get('type', _MISSING)
    if kind is _MISSING:  # a child config: its base gives the type
        unit = 'max_iters' if 'max_iters' in runner else 'max_epochs'
        loop: dict[str, Any] = {}
    elif kind in _RUNNERS:
        loop_type, unit = _RUNNERS[kind]
        loop = {'type': loop_type}
    else:
        state.problem(
            f'runner.type: {kind!r} has no 1.x train loop this tool knows; runner={short(runner)} '
            'was left out; write train_cfg=dict(type=<your loop>, ...) by hand',
            'runner-and-loops')
        return None
    count = _max_count(state, runner, unit)
    if count is not _MISSING:  # none: a fragment; 0.x could not run it either
        loop[unit] = count
    for key, val in runner.items():
        if key in ('type', unit, 'use_apex_amp'):  # use_apex_amp: the optimizer pass lists it
            continue
        if key in _DYNAMIC_ARGS:
            if val:
                state.problem(
                    f'runner.{key}: {val!r} (DynamicIterBasedRunner) has no 1.x loop argument; '
                    "left out; the 1.x model and model_wrapper_cfg=dict(type='MMSeparateDistribu"
                    "tedDataParallel') take over dynamic DDP; check the model's train_step",
                    'runner-and-loops')
            continue
        state.problem(f'runner.{key}: {short(val)} is not a 1.x loop argument; left out; port '
                      'it by hand', 'runner-and-loops')
    return loop


def _loops(state: RuntimeState) -> dict[str, Any]:
    """Write ``train_cfg``/``val_cfg``/``test_cfg``; return the best-checkpoint args."""
    loop = _train_loop(state)
    evaluation = state.out.get('evaluation', _MISSING)
    best: dict[str, Any] = {}
    # mmedit/mmgen validated only with an evaluation key; the others always did.
    validates = evaluation is not _MISSING or state.codebase not in _EVAL_KEY_ONLY
    if evaluation is not _MISSING:
        state.leave_out('evaluation')
        if loop is None and _test_only(state):
            _evaluation(state, evaluation, {}, 'nothing is trained: see the note')
            return {}
        if loop is None:
            loop = {}
        best = _evaluation(state, evaluation, loop)
    elif loop is not None and validates and loop.get('type'):
        loop['val_interval'] = 1  # mmcv's EvalHook interval, as the 0.x scripts build it
    if loop is None:
        return best
    if loop.get('type') == 'IterBasedTrainLoop' or 'max_iters' in loop:
        state.iter_based = True
    sources = ('runner', 'total_epochs', 'total_iters', 'evaluation')
    if not loop.get('type'):  # a child config's partial loop
        if loop:
            state.put('train_cfg', loop, sources)
        return best
    extra = {'fp16': True} if state.test_fp16 else {}
    val, test = _EVAL_LOOPS.get(state.codebase or '', ('ValLoop', 'TestLoop'))
    if state.codebase in _BY_EPOCH_FORM:  # mmpretrain, mmagic's GAN configs
        by_epoch = loop.pop('type') == 'EpochBasedTrainLoop'
        items = list(loop.items())
        loop.clear()
        loop.update([('by_epoch', by_epoch)] + items)
    state.put('train_cfg', loop, sources)
    _last_validation_note(state, loop)
    if not validates:
        state.put('val_cfg', None, sources)  # 0.x trained without validating
    elif state.codebase == 'mmcls':  # mmpretrain's untyped loops
        state.put('val_cfg', dict(extra), sources)
    else:
        state.put('val_cfg', {'type': val, **extra}, sources)
    if state.codebase == 'mmgen' and not state.out.get('metrics') and evaluation is _MISSING:
        state.put('test_cfg', None, sources)
        state.note('test_cfg: None (no test loop): the config has no metrics and no evaluation, '
                   "so mmgen 0.x's tools/evaluation.py had nothing to compute; mmagic 1.x "
                   'writes test_cfg=None for these models too (SinGAN)', 'evaluation')
    elif state.codebase == 'mmcls':
        state.put('test_cfg', dict(extra), sources)
    else:
        state.put('test_cfg', {'type': test, **extra}, sources)
    return best


def _test_only(state: RuntimeState) -> bool:
    """A config that trains nothing: ``evaluation`` but no runner, optimizer or ``_base_``.

    Its test loop is written (what 0.x ``tools/test.py`` ran); ``evaluation``, read only
    by training, is dropped with a note. A child config (``_base_``) keeps a partial
    ``train_cfg``, merged onto its base's.
    """
    train = state.out.get('train_cfg')
    if any(state.has(k) for k in ('_base_', 'optimizer', 'optimizers', 'optim_wrapper')) or (
            isinstance(train, Mapping) and not _is_model_setting(train, 'train_cfg')):
        return False
    extra = {'fp16': True} if state.test_fp16 else {}
    test = _EVAL_LOOPS.get(state.codebase or '', ('ValLoop', 'TestLoop'))[1]
    loop = dict(extra) if state.codebase == 'mmcls' else {'type': test, **extra}
    state.put('test_cfg', loop, ('evaluation',))
    evaluation = state.out['evaluation']
    interval = evaluation.get('interval', 1) if isinstance(evaluation, Mapping) else None
    state.note(
        f'evaluation.interval: {short(interval)} dropped: the config has no runner, optimizer '
        'or _base_, so it trains nothing and 0.x never ran this validation (it is tested with '
        f'tools/test.py only); no train_cfg or val_cfg was written, and test_cfg='
        f'{short(loop)} for that test', 'evaluation')
    return True


def _evaluation(state: RuntimeState, evaluation: Any, loop: dict[str, Any],
                done: str = 'interval and save_best were converted') -> dict[str, Any]:
    """Read ``evaluation`` into ``loop``; return the args that go to the CheckpointHook."""
    if not isinstance(evaluation, Mapping):
        state.problem(f'evaluation: {short(evaluation)} is not a dict; left out; set '
                      'train_cfg.val_interval and val_evaluator by hand', 'evaluation')
        return {}
    best: dict[str, Any] = {}
    evaluator: dict[str, Any] = {}
    interval = evaluation.get('interval', 1)
    if _is_count(interval):
        loop['val_interval'] = interval
    elif _dynamic(interval):  # mmgen: dict(milestones=[m, ...], interval=[i0, i1, ...])
        loop['val_interval'] = interval['interval'][0]
        loop['dynamic_intervals'] = [
            (m, i) for m, i in zip(interval['milestones'], interval['interval'][1:])]
        interval = loop['val_interval']
    else:
        state.problem(f'evaluation.interval: {interval!r} is not an int >= 1; left out; set '
                      'train_cfg.val_interval by hand', 'evaluation')
    for key, val in evaluation.items():
        if key == 'interval':
            continue
        if key in _BEST_ARGS:
            if val is not None:
                best[key] = val
        elif key == 'start':
            _start(state, val, interval, loop)
        elif key == 'dynamic_intervals':
            loop['dynamic_intervals'] = val
        elif key in _EVAL_DROPPED:
            default = _EVAL_DROPPED[key]
            if default is not _MISSING and val != default:
                evaluator[key] = val
        else:
            evaluator[key] = val
    kind = evaluation.get('type')
    where = f' ({kind})' if kind else ''
    settings = ', '.join(f'{k}={short(v, 40)}' for k, v in evaluator.items())
    state.problem(
        f'evaluation: {settings or "no evaluator settings"}{where} was left out ({done}); '
        '1.x evaluates with val_evaluator/test_evaluator, which are '
        f'dataset-specific: write them (e.g. val_evaluator='
        f'{_EVALUATORS.get(state.codebase or "", _ANY)}) with the metrics above', 'evaluation')
    return best


def _is_count(value: Any) -> bool:
    """Whether ``value`` is an int >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _dynamic(value: Any) -> bool:
    """Whether ``value`` is mmgen's ``dict(milestones=[...], interval=[...])``."""
    if not isinstance(value, Mapping) or set(value) != {'milestones', 'interval'}:
        return False
    marks, counts = value['milestones'], value['interval']
    return (isinstance(marks, (list, tuple)) and isinstance(counts, (list, tuple))
            and len(counts) == len(marks) + 1 and all(map(_is_count, counts))
            and all(map(_is_count, marks)))


def _start(state: RuntimeState, start: Any, interval: Any, loop: dict[str, Any]) -> None:
    """``evaluation.start`` -> ``train_cfg.val_begin`` where the two count alike."""
    if start is None:
        return
    if (isinstance(start, int) and isinstance(interval, int) and start >= 1
            and (interval == 1 or start % interval == 0)):
        loop['val_begin'] = start
        return
    state.problem(
        f'evaluation.start: {start!r} with interval={interval!r} evaluated at epochs/iterations '
        'start, start+interval, ...; 1.x evaluates at multiples of val_interval from val_begin; '
        'left out; set train_cfg.val_begin by hand', 'evaluation')


def _last_validation_note(state: RuntimeState, loop: Mapping[str, Any]) -> None:
    """Note that 1.x also validates after the last epoch/iteration."""
    count = loop.get('max_epochs', loop.get('max_iters'))
    interval = loop.get('val_interval')
    if isinstance(count, int) and isinstance(interval, int) and interval > 0 and count % interval:
        state.note(
            f'train_cfg.val_interval: {interval} does not divide {count}; the 1.x loop also '
            'validates at the end of training, which 0.x did not', 'evaluation')
