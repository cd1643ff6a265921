"""0.x ``checkpoint_config``/``log_config``/``custom_hooks`` -> 1.x ``default_hooks``,
``log_processor``, ``visualizer`` and ``custom_hooks``."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Optional

from ._runtime_common import RuntimeState, short

__all__ = ['convert_hooks']

_MISSING: Any = object()

#: mmcv CheckpointHook arguments MMEngine's CheckpointHook takes with the same meaning
#: (not ``meta``: MMEngine's hook passes its own to ``save_checkpoint``: a TypeError).
_CKPT_ARGS = frozenset({'interval', 'by_epoch', 'save_optimizer', 'out_dir', 'max_keep_ckpts',
                        'save_last', 'file_client_args', 'filename_tmpl'})
#: mmcv CheckpointHook arguments with no 1.x counterpart, and their harmless value.
_CKPT_DROPPED = {'sync_buffer': False, 'create_symlink': True}
#: mmcv TextLoggerHook arguments that MMEngine's LoggerHook takes as they are.
_TEXT_ARGS = ('ignore_last', 'interval_exp_name', 'out_dir', 'out_suffix', 'keep_local',
              'file_client_args')
#: mmcv logger hook -> (MMEngine vis backend, arguments kept, arguments dropped when
#: they have this value and a problem otherwise).
_BACKENDS: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    'TensorboardLoggerHook': ('TensorboardVisBackend', (), {'log_dir': None}),
    'WandbLoggerHook': ('WandbVisBackend', ('init_kwargs', 'commit', 'define_metric_cfg'),
                        {'with_step': True, 'log_artifact': False, 'out_suffix': _MISSING}),
    'MlflowLoggerHook': ('MLflowVisBackend', ('exp_name', 'tags', 'params'), {'log_model': False}),
    'ClearMLLoggerHook': ('ClearMLVisBackend', ('init_kwargs',), {}),
    'NeptuneLoggerHook': ('NeptuneVisBackend', ('init_kwargs',), {'with_step': True}),
}
#: mmcv's defaults for a hook argument left unset, where it matters here.
_HOOK_DEFAULTS = {'log_artifact': True, 'log_model': True}
#: Arguments every mmcv logger hook takes: the LoggerHook's in 1.x.
_COMMON_ARGS = ('interval', 'ignore_last', 'reset_flag', 'by_epoch')
#: Hooks of MMEngine 0.10 and mmcv 2.x (any 1.x codebase has them).
_MMENGINE_HOOKS = frozenset({
    'CheckpointHook', 'DistSamplerSeedHook', 'EMAHook', 'EarlyStoppingHook', 'EmptyCacheHook',
    'IterTimerHook', 'LoggerHook', 'NPUProfilerHook', 'NaiveVisualizationHook',
    'ParamSchedulerHook', 'PrepareTTAHook', 'ProfilerHook', 'RuntimeInfoHook', 'SyncBuffersHook',
    'RFSearchHook',  # mmcv 2.x registers it in MMEngine's registry, same arguments
})
#: Hooks of each 0.x codebase's 1.x successor (mmdet 3.3, mmseg 1.2, mmpretrain 1.2, mmagic 1.2).
_CODEBASE_HOOKS = {
    'mmdet': frozenset({'CheckInvalidLossHook', 'DetVisualizationHook', 'FastStopTrainingHook',
                        'MeanTeacherHook', 'MemoryProfilerHook', 'NumClassCheckHook',
                        'PipelineSwitchHook', 'SetEpochInfoHook', 'SyncNormHook',
                        'TrackVisualizationHook', 'YOLOXModeSwitchHook'}),
    'mmseg': frozenset({'SegVisualizationHook'}),
    'mmcls': frozenset({'ClassNumCheckHook', 'DenseCLHook', 'EMAHook', 'ParamRecordHook',
                        'PreciseBNHook', 'SetAdaptiveMarginsHook', 'SimSiamHook', 'SwAVHook',
                        'SwitchRecipeHook', 'VisualizationHook', 'WarmupParamHook'}),
    'mmedit': frozenset({'BasicVisualizationHook', 'ExponentialMovingAverageHook',
                         'PGGANFetchDataHook', 'PickleDataHook', 'ReduceLRSchedulerHook'}),
}
_CODEBASE_HOOKS['mmgen'] = _CODEBASE_HOOKS['mmedit']
#: Arguments only MMEngine's EMAHook takes: a hook with one is in 1.x form already.
_ENGINE_EMA_ARGS = frozenset({'ema_type', 'update_buffers', 'strict_load', 'begin_iter',
                              'begin_epoch'})
#: mmcv's EMAHook arguments MMEngine's EMAHook reads alike.
_EMA_ARGS = ('momentum', 'interval', 'priority')


def convert_hooks(state: RuntimeState, best: Mapping[str, Any]) -> None:
    """Write ``default_hooks`` (and the logging keys) from the 0.x hook configs."""
    hooks: dict[str, Any] = {}
    ckpt = _checkpoint(state, best)
    if ckpt is not _MISSING:
        hooks['checkpoint'] = ckpt
    logger = _logging(state)
    if logger is not _MISSING:
        hooks['logger'] = logger
    if hooks:
        if state.has('checkpoint_config') and state.has('log_config'):  # a whole runtime
            hooks = _full(hooks)
        state.put('default_hooks', hooks, ('checkpoint_config', 'log_config', 'evaluation'))
    _custom_hooks(state)


def _full(hooks: dict[str, Any]) -> dict[str, Any]:
    """The default hooks in upstream's order, with the 0.x runner's always-on ones."""
    return {
        'timer': dict(type='IterTimerHook'),
        'logger': hooks.get('logger', dict(type='LoggerHook')),
        'param_scheduler': dict(type='ParamSchedulerHook'),
        'checkpoint': hooks.get('checkpoint'),
        'sampler_seed': dict(type='DistSamplerSeedHook'),
    }


def _checkpoint(state: RuntimeState, best: Mapping[str, Any]) -> Any:
    """``checkpoint_config`` + ``evaluation.save_best`` -> ``default_hooks.checkpoint``."""
    cfg = state.out.get('checkpoint_config', _MISSING)
    state.leave_out('checkpoint_config')
    if cfg is _MISSING:
        if best:
            state.problem(
                f'evaluation.save_best: {short(best.get("save_best"))} saved the best checkpoint '
                'from the eval hook; 1.x saves it from default_hooks.checkpoint, which this '
                f'config does not set; write default_hooks=dict(checkpoint=dict(type='
                f"'CheckpointHook', interval=..., {_args(best)}))",
                'checkpoints')
        return _MISSING
    if cfg is None:
        if best:
            state.problem(
                'checkpoint_config: None switched periodic checkpoints off, but evaluation.'
                'save_best still saved the best one; default_hooks.checkpoint=None saves none; '
                'write a CheckpointHook with interval=-1, save_last=False and save_best',
                'checkpoints')
        return None
    if not isinstance(cfg, Mapping):
        state.problem(f'checkpoint_config: {short(cfg)} is not a dict; left out; write '
                      "default_hooks.checkpoint=dict(type='CheckpointHook', ...) by hand",
                      'checkpoints')
        return _MISSING
    hook: dict[str, Any] = {'type': 'CheckpointHook'}
    if state.iter_based and 'by_epoch' not in cfg:
        hook['by_epoch'] = False
    kind = cfg.get('type', 'CheckpointHook')
    if kind != 'CheckpointHook':
        state.problem(f'checkpoint_config.type: {kind!r} is not mmcv\'s CheckpointHook; left '
                      'out; port it to a 1.x hook in default_hooks.checkpoint', 'checkpoints')
        return _MISSING
    for key, val in cfg.items():
        if key == 'type':
            continue
        if key in _CKPT_ARGS:
            hook[key] = val
        elif key in _CKPT_DROPPED and val == _CKPT_DROPPED[key]:
            continue
        else:
            state.problem(f'checkpoint_config.{key}: {short(val)} has no argument in '
                          "default_hooks.checkpoint (MMEngine's CheckpointHook); left out; "
                          'drop it from the 0.x config if you can do without it', 'checkpoints')
    hook.update(best)
    if state.codebase == 'mmgen':
        state.note(f'checkpoint_config.out_dir: mmgen 0.x saved to work_dir/'
                   f'{hook.get("out_dir", "ckpt")}/<work_dir name>; MMEngine saves to '
                   f'{"out_dir/<work_dir name>" if "out_dir" in hook else "work_dir"}',
                   'checkpoints')
    return hook


def _args(args: Mapping[str, Any]) -> str:
    """``k=v, ...`` as a call writes them."""
    return ', '.join(f'{k}={v!r}' for k, v in args.items())


def _logging(state: RuntimeState) -> Any:
    """``log_config`` -> ``default_hooks.logger``, ``log_processor`` and ``visualizer``."""
    cfg = state.out.get('log_config', _MISSING)
    state.leave_out('log_config')
    if cfg is _MISSING:
        return _MISSING
    if cfg is None:
        return None
    if not isinstance(cfg, Mapping) or not isinstance(cfg.get('hooks', []), (list, tuple)):
        state.problem(f'log_config: {short(cfg)} is not dict(interval=..., hooks=[...]); left '
                      'out; write default_hooks.logger and visualizer by hand', 'logging')
        return _MISSING
    default_interval = cfg.get('interval', 10)
    for key in cfg:
        if key not in ('interval', 'hooks'):
            state.problem(f'log_config.{key}: {short(cfg[key])} is not read by the 0.x runner; '
                          'left out', 'logging')
    hooks = [h for h in cfg.get('hooks', []) if isinstance(h, Mapping)]
    if not hooks:
        return None  # 0.x logged nothing
    texts = [h for h in hooks if h.get('type') == 'TextLoggerHook']
    lead = dict(texts[0]) if texts else {}
    defaults = (default_interval, True, False, not state.iter_based)
    common = {k: lead.get(k, d) for k, d in zip(_COMMON_ARGS, defaults)}
    logger: dict[str, Any] = {'type': 'LoggerHook', 'interval': common['interval']}
    for key in _TEXT_ARGS:
        if key in lead:
            logger[key] = lead[key]
    if not common['by_epoch']:
        logger['log_metric_by_epoch'] = False
    backends: list[dict[str, Any]] = [dict(type='LocalVisBackend')] if texts else []
    for index, hook in enumerate(hooks):
        where = f'log_config.hooks[{index}]'
        if texts and hook is texts[0]:
            if common['reset_flag']:
                state.problem(f'{where}.reset_flag: True has no argument in default_hooks.logger '
                              "(MMEngine's LoggerHook), which never resets the log buffer; "
                              'left out', 'logging')
            continue
        backend = _backend(state, where, hook, common, defaults)
        if backend is not None:
            backends.append(backend)
    state.put('log_processor', dict(type='LogProcessor', window_size=common['interval'],
                                    by_epoch=common['by_epoch']), ('log_config',))
    if len(backends) > (1 if texts else 0):
        state.put('visualizer', dict(type='Visualizer', vis_backends=backends, name='visualizer'),
                  ('log_config',))
    return logger


def _backend(state: RuntimeState, where: str, hook: Mapping[str, Any], common: Mapping[str, Any],
             defaults: tuple[Any, ...]) -> Optional[dict[str, Any]]:
    """One mmcv logger hook -> an MMEngine vis backend (None: listed as a problem)."""
    kind = hook.get('type')
    if kind not in _BACKENDS:
        state.problem(
            f'{where}: {short(dict(hook))} has no 1.x vis backend this tool knows; left out; '
            'add the matching backend to visualizer.vis_backends (LocalVisBackend, '
            'TensorboardVisBackend, WandbVisBackend, MLflowVisBackend, ...) by hand', 'logging')
        return None
    name, kept, dropped = _BACKENDS[kind]
    backend: dict[str, Any] = {'type': name}
    for key, default in zip(_COMMON_ARGS, defaults):
        val = hook.get(key, default)
        if val != common[key]:
            state.problem(
                f'{where}.{key}: {val!r} differs from the text logger\'s {common[key]!r}; 1.x '
                f'writes every backend at default_hooks.logger\'s {key}; left out', 'logging')
    for key, val in hook.items():
        if key in ('type',) + _COMMON_ARGS:
            continue
        if key in kept:
            backend[key] = val
        elif key not in dropped:
            state.problem(f'{where}.{key}: {short(val)} has no argument in the '
                          f'visualizer.vis_backends {name}; left out', 'logging')
    for key, harmless in dropped.items():
        val = hook.get(key, _HOOK_DEFAULTS.get(key, harmless))
        if harmless is not _MISSING and val != harmless:
            state.problem(
                f'{where}.{key}: {val!r} ({kind}) has no {name} argument; left out; '
                f'{name} does without it (set {key}={harmless!r} in the 0.x config to accept '
                'that)', 'logging')
    return backend


def _custom_hooks(state: RuntimeState) -> None:
    """Keep ``custom_hooks``; list the hooks 1.x does not have."""
    hooks = state.out.get('custom_hooks')
    if not isinstance(hooks, list) or not state.legacy:
        return
    ours = state.codebase in _CODEBASE_HOOKS  # other codebases: any 1.x hook name passes
    known = _MMENGINE_HOOKS.union(*(
        v for k, v in _CODEBASE_HOOKS.items() if not ours or state.codebase == k))
    kept: list[Any] = []
    changed = False
    for index, hook in enumerate(hooks):
        where = f'custom_hooks[{index}]'
        kind = hook.get('type') if isinstance(hook, Mapping) else None
        if kind == 'EMAHook' and not _ENGINE_EMA_ARGS.intersection(hook):
            hook = _mmcv_ema(state, where, hook)
            changed = True
        elif kind == 'ExpMomentumEMAHook':
            hook = _exp_momentum_ema(state, where, hook)
            changed = True
        elif kind == 'ExponentialMovingAverageHook':
            hook = _agan_ema(state, where, hook)
            changed = True
        if hook is None:  # listed by its converter
            continue
        if isinstance(hook, Mapping) and hook.get('type') in known:
            kept.append(hook)
            continue
        changed = True
        state.problem(
            f'{where}: {short(hook)} has no hook of that name in MMEngine or the codebase\'s 1.x '
            'release; left out; port it to a 1.x hook (custom_hooks keeps the rest)',
            'custom-hooks')
    if changed:
        state.out['custom_hooks'] = kept


def _mmcv_ema(state: RuntimeState, where: str, hook: Mapping[str, Any]) -> dict[str, Any]:
    """mmcv's EMAHook -> MMEngine's (as mmpretrain writes it)."""
    new = {k: v for k, v in hook.items() if k == 'type' or k in _EMA_ARGS}
    for key, val in hook.items():
        if key in new:
            continue
        if key == 'resume_from' and val is None:
            continue
        state.problem(f'{where}.{key}: {short(val)} (mmcv EMAHook) has no MMEngine EMAHook '
                      'argument; left out', 'custom-hooks')
    if 'warm_up' not in hook:
        state.note(f'{where}: mmcv\'s EMAHook warmed the momentum up over 100 iterations '
                   '(warm_up=100); MMEngine\'s EMAHook does not', 'custom-hooks')
    return new


def _exp_momentum_ema(state: RuntimeState, where: str, hook: Mapping[str, Any]) -> dict[str, Any]:
    """mmdet 2.x ExpMomentumEMAHook -> EMAHook(ema_type='ExpMomentumEMA'), as mmdet 3 writes it."""
    new: dict[str, Any] = {'type': 'EMAHook', 'ema_type': 'ExpMomentumEMA'}
    for key, val in hook.items():
        if key == 'type' or (key == 'resume_from' and val is None):
            continue
        if key in ('momentum', 'interval', 'priority'):
            new[key] = val
        elif key == 'total_iter':
            new['gamma'] = val
        elif key == 'skip_buffers':
            new['update_buffers'] = not val
        else:
            state.problem(f'{where}.{key}: {short(val)} (ExpMomentumEMAHook) has no EMAHook '
                          'argument; left out', 'custom-hooks')
    new.setdefault('update_buffers', True)  # 0.x skip_buffers=False
    return new


def _agan_ema(state: RuntimeState, where: str, hook: Mapping[str, Any]) -> Any:
    """mmedit/mmgen ExponentialMovingAverageHook -> mmagic's: the momentum is 1 - it.

    0.x's ``lerp`` kept ``momentum`` of the average (``orig + (ema - orig) * m``);
    mmagic's takes ``momentum`` of the new weights (``ema + (orig - ema) * m``).
    """
    new = {k: v for k, v in hook.items() if k not in ('momentum_policy', 'momentum_cfg')}
    policy = hook.get('momentum_policy', 'fixed')
    if policy != 'fixed' or hook.get('momentum_cfg'):
        state.problem(f'{where}.momentum_policy: {policy!r} (momentum_cfg='
                      f'{short(hook.get("momentum_cfg"))}) has no argument in mmagic\'s '
                      'ExponentialMovingAverageHook; left out; the momentum stays fixed',
                      'custom-hooks')
    if hook.get('interp_mode', 'lerp') != 'lerp':
        state.problem(f'{where}.interp_mode: {hook["interp_mode"]!r} has no mmagic '
                      'counterpart (only lerp); the hook was left out', 'custom-hooks')
        return None
    interp = hook.get('interp_cfg')
    if isinstance(interp, Mapping):
        interp = dict(interp)
        for key in ('momentum', 'momentum_nontrainable'):
            if isinstance(interp.get(key), (int, float)):
                interp[key] = float(Decimal(1) - Decimal(repr(interp[key])))
        new['interp_cfg'] = interp
    return new
