"""0.x environment, resume, randomness, ``workflow``, ``data`` and the keys 1.x has no
place for -> ``env_cfg``, ``load_from``/``resume``, ``randomness`` or a problem line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._runtime_common import RuntimeState, short

__all__ = ['convert_env']

_MISSING: Any = object()

#: Keys the 0.x scripts read that MMEngine ignores, with what the user should do.
_NO_PLACE = {
    'gpu_ids': ('the launcher and CUDA_VISIBLE_DEVICES', 'choose the GPUs with the launcher '
                '(tools/dist_train.sh) or CUDA_VISIBLE_DEVICES', 'devices'),
    'gpus': ('the launcher and CUDA_VISIBLE_DEVICES', 'choose the GPUs with the launcher '
             '(tools/dist_train.sh) or CUDA_VISIBLE_DEVICES', 'devices'),
    'device': ('the device MMEngine picks (get_device())', 'MMEngine picks cuda, npu, mlu, '
               'mps or cpu by itself; hide the others with CUDA_VISIBLE_DEVICES', 'devices'),
    'ipu_replicas': ('no 1.x key (MMEngine has no IPU runner)', 'train on another device',
                     'devices'),
    'apex_amp': ("optim_wrapper=dict(type='AmpOptimWrapper', ...) (native AMP)",
                 'call enable_amp() on the converted config instead', 'other-keys'),
    'visual_config': ('custom_hooks=[dict(type=\'BasicVisualizationHook\', ...)] and visualizer',
                      'write the mmagic visualization hook and visualizer by hand', 'other-keys'),
    'sampler': ("train_dataloader.sampler (e.g. dict(type='RepeatAugSampler'))",
                'set it in the train_dataloader you write', 'data'),
    'empty_cache': ("custom_hooks=[dict(type='EmptyCacheHook', after_iter=True)]",
                    'add that hook if memory runs short', 'other-keys'),
    'is_dynamic_ddp': ("model_wrapper_cfg=dict(type='MMSeparateDistributedDataParallel')",
                       'check that the 1.x model does without it', 'other-keys'),
}


def convert_env(state: RuntimeState) -> None:
    """The environment, resume, randomness, workflow, data and the keys with no place."""
    _env_cfg(state)
    _resume(state)
    _randomness(state)
    _workflow(state)
    _data(state)
    _ddp_wrapper(state)
    if 'exp_name' in state.out:
        state.leave_out('exp_name')
        state.put('experiment_name', state.out['exp_name'], ('exp_name',))
    for key, (target, todo, section) in _NO_PLACE.items():
        if key in state.out:
            state.leave_out(key)
            state.problem(f'{key}: {short(state.out[key])} was left out (MMEngine ignores it); in '
                          f'1.x this is {target}: {todo}', section)


def _env_cfg(state: RuntimeState) -> None:
    """The environment keys (cudnn_benchmark, mp_start_method, ...) -> ``env_cfg``."""
    env: dict[str, Any] = {}
    if 'cudnn_benchmark' in state.out:
        env['cudnn_benchmark'] = state.out['cudnn_benchmark']
    mp = {k: state.out[k] for k in ('mp_start_method', 'opencv_num_threads') if k in state.out}
    if mp:
        env['mp_cfg'] = mp
    dist = state.out.get('dist_params', _MISSING)
    if dist is not _MISSING:
        if isinstance(dist, Mapping):
            env['dist_cfg'] = dict(dist)
        elif dist is not None:
            state.problem(f'dist_params: {short(dist)} is not a dict; left out; set '
                          'env_cfg.dist_cfg by hand', 'environment')
    sources = ('cudnn_benchmark', 'mp_start_method', 'opencv_num_threads', 'dist_params')
    state.leave_out(*sources)
    if env:
        state.put('env_cfg', env, sources)


def _resume(state: RuntimeState) -> None:
    """``resume_from``/``auto_resume`` -> ``load_from`` + ``resume``."""
    if 'resume_from' not in state.out and 'auto_resume' not in state.out:
        return
    resume_from = state.out.get('resume_from')
    auto = state.out.get('auto_resume', False)
    load_from = state.out.get('load_from')
    sources = ('load_from', 'resume_from', 'auto_resume')
    state.leave_out('resume_from', 'auto_resume')
    if resume_from:
        if load_from:
            state.note(f'load_from: {short(load_from)} was replaced by resume_from; 0.x ignored '
                       'load_from when resume_from was set', 'resume')
        state.leave_out('load_from')
        state.put('load_from', resume_from, sources)
        state.put('resume', True, ('resume_from', 'auto_resume'))
        return
    if auto and load_from:
        state.problem(
            f'auto_resume: True with load_from={short(load_from)} resumed from the latest '
            'checkpoint in work_dir, else loaded load_from; 1.x resume=True with a load_from '
            'resumes from load_from; left out: set resume=True and load_from=None to resume '
            'from the latest checkpoint', 'resume')
        auto = False
    state.put('resume', bool(auto), ('resume_from', 'auto_resume'))


def _randomness(state: RuntimeState) -> None:
    """``seed``/``deterministic`` -> ``randomness``."""
    found = {k: state.out[k] for k in ('seed', 'deterministic') if k in state.out}
    if found:
        state.leave_out('seed', 'deterministic')
        state.put('randomness', found, ('seed', 'deterministic'))
        if 'seed' in found and state.codebase is not None:
            state.note(f'seed: {short(found["seed"])} is now used; the 0.x tools/train.py '
                       'replaced it with --seed (a random one without it)', 'randomness')


def _workflow(state: RuntimeState) -> None:
    """``workflow``: only training phases are 1.x's default; others are listed."""
    flow = state.out.get('workflow', _MISSING)
    if flow is _MISSING:
        return
    state.leave_out('workflow')
    try:
        modes = [mode for mode, _ in flow]
    except (TypeError, ValueError):
        modes = None
    if modes is not None and all(m == 'train' for m in modes):
        return
    state.problem(
        f'workflow: {short(flow)} was left out; 1.x has no val phase computing losses: '
        'validation runs the val_evaluator every train_cfg.val_interval with val_cfg=dict('
        "type='ValLoop'); write those", 'workflow')


def _data(state: RuntimeState) -> None:
    """``data``: left out, one problem line naming what the user must write."""
    data = state.out.get('data', _MISSING)
    if data is _MISSING:
        return
    state.leave_out('data')
    parts = []
    if isinstance(data, Mapping):
        loader = {'samples_per_gpu': 'batch_size', 'workers_per_gpu': 'num_workers',
                  'persistent_workers': 'persistent_workers'}
        parts = [f'{k}={data[k]!r} -> {v}' for k, v in loader.items() if k in data]
        splits = [k for k in ('train', 'val', 'test') if k in data]
        parts += [f'{k} -> {k}_dataloader.dataset' for k in splits]
        rest = [k for k in data if k not in loader and k not in splits]
        if rest:
            parts.append(f'also {", ".join(rest)}')
    state.problem(
        f'data: left out of the converted config (the 0.x file still has it; MMEngine ignores '
        f'`data`): {"; ".join(parts) or short(data)}; write train_dataloader, val_dataloader and '
        'test_dataloader with the 1.x datasets and pipelines (their names and transforms '
        'changed)', 'data')


def _ddp_wrapper(state: RuntimeState) -> None:
    """mmgen's ``use_ddp_wrapper`` -> ``model_wrapper_cfg`` (``find_unused_parameters`` stays)."""
    if 'use_ddp_wrapper' not in state.out:
        return
    state.leave_out('use_ddp_wrapper')
    if not state.out['use_ddp_wrapper']:
        return  # MMDistributedDataParallel(broadcast_buffers=False): MMEngine's default
    wrapper: dict[str, Any] = dict(type='MMSeparateDistributedDataParallel',
                                   broadcast_buffers=False)
    if 'find_unused_parameters' in state.out:
        wrapper['find_unused_parameters'] = state.out['find_unused_parameters']
        state.leave_out('find_unused_parameters')
    state.put('model_wrapper_cfg', wrapper, ('use_ddp_wrapper', 'find_unused_parameters'))
