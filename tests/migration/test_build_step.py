"""Each converted ``optim_wrapper`` builds in MMEngine and takes a step; its schedulers step.

For every config :mod:`test_convert_all` converted (``plugin=True``): the modules its
``custom_imports`` names that are this package's (``fp16utils.mmengine``) are imported
(the codebase's own, ``mmdet.models`` and the like, are not installed here); then
``mmengine.optim.build_optim_wrapper`` builds its ``optim_wrapper`` on the CPU for a stand-in
model (``_standins.StandInModel``: parameter names that ``custom_keys`` and the layer-decay
constructors look for, a backbone class named after the config's backbone type, one
sub-model per optimizer of a multi-optimizer config), ``update_params`` takes one training
step (float16 ``AmpOptimWrapper`` steps on the CPU with torch 2.x) that changes the
parameters and leaves them finite, and every ``param_scheduler`` entry builds through
MMEngine's ``PARAM_SCHEDULERS`` on that wrapper and steps.

Stood in, and why: the codebases' own 1.x classes (``LearningRateDecayOptimizerConstructor``,
``LayerDecayOptimizerConstructor``, ``Lamb``, ...) live in mmdet 3.x, mmsegmentation 1.x and
mmpretrain 1.x, which need mmcv 2 and cannot be imported beside mmcv 1.7.2: their source
files are run from the downloaded 1.x release with only their ``PKG.registry`` import
stood in for, and registered into MMEngine's registries while that codebase's configs are
built (``_standins.codebase_classes``). The model is a stand-in because the codebases'
models cannot be built without their packages; what is checked is the optimizer side.
"""

from __future__ import annotations

import copy
import importlib
import math
from typing import Any, Dict, List, Optional, Tuple

import pytest
from _converted import Converted, converted
from _wheels import OLD, require

BASE = require()

import torch  # noqa: E402
from _standins import StandInModel, codebase_classes  # noqa: E402
from mmengine.optim import OptimWrapperDict, build_optim_wrapper  # noqa: E402
from mmengine.registry import PARAM_SCHEDULERS  # noqa: E402

from fp16utils._args.spec import PLUGIN_MODULE  # noqa: E402

#: The stand-in number of iterations per epoch (epoch-based schedulers converted to iters).
EPOCH_LENGTH = 10
#: Configs whose Adam ``betas`` have an int (written as floats, with a note), per release.
INT_BETAS = {'mmdet': 0, 'mmseg': 0, 'mmcls': 0, 'mmedit': 0, 'mmgen': 31}
#: Configs with ``optimizer=None``, whose model builds its optimizers (SinGAN 11, PGGAN 3,
#: StyleGAN-v1 2): no optim_wrapper, one problem line naming mmagic's constructors.
MODEL_BUILT = {'mmdet': 0, 'mmseg': 0, 'mmcls': 0, 'mmedit': 0, 'mmgen': 16}
#: The 0.x keys that hold optimizer configs.
OPTIMIZER_KEYS = ('optimizer', 'optimizers')


def _parts(wrapper: Dict[str, Any]) -> Optional[List[str]]:
    """The sub-model names of a multi-optimizer wrapper config, else None."""
    if 'optimizer' in wrapper:
        return None
    return [k for k, v in wrapper.items() if isinstance(v, dict) and 'optimizer' in v]


def _backbone_type(cfg: Dict[str, Any]) -> Optional[str]:
    model = cfg.get('model')
    backbone = model.get('backbone') if isinstance(model, dict) else None
    kind = backbone.get('type') if isinstance(backbone, dict) else None
    # 'mmcls.ConvNeXt' (a type from another codebase's registry): the class is ConvNeXt.
    return kind.rsplit('.', 1)[-1] if isinstance(kind, str) else None


def _step(model: StandInModel, wrapper: Any) -> None:
    """One training step per wrapper (as many calls as its gradient accumulation needs)."""
    pairs = (list(wrapper.items()) if isinstance(wrapper, OptimWrapperDict)
             else [(None, wrapper)])
    for name, one in pairs:
        module = getattr(model, name) if name else model
        for _ in range(max(1, getattr(one, '_accumulative_counts', 1))):
            with one.optim_context(module):
                loss = model(module)
            one.update_params(loss)


def _scheduler_entries(cfg: Dict[str, Any], wrapper: Any) -> List[Tuple[Any, Dict[str, Any]]]:
    """``(wrapper, scheduler config)`` pairs, as MMEngine's Runner pairs them."""
    scheds = cfg.get('param_scheduler')
    if scheds is None:
        return []
    train = cfg.get('train_cfg') if isinstance(cfg.get('train_cfg'), dict) else {}
    if isinstance(wrapper, OptimWrapperDict):
        if isinstance(scheds, dict) and 'type' not in scheds:
            per = {name: scheds.get(name, []) for name in wrapper.keys()}
        else:
            per = {name: scheds for name in wrapper.keys()}
        items = [(wrapper[name], s) for name, ss in per.items()
                 for s in (ss if isinstance(ss, list) else [ss])]
    else:
        items = [(wrapper, s) for s in (scheds if isinstance(scheds, list) else [scheds])]
    out = []
    for one, sched in items:
        sched = copy.deepcopy(sched)
        by_epoch = sched.get('by_epoch', True)
        end = train.get('max_epochs' if by_epoch else 'max_iters')
        sched.setdefault('end', end if end is not None else 100)
        out.append((one, sched))
    return out


def _finite(model: StandInModel) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _build_and_step(record: Converted) -> Tuple[str, str]:
    """``('stepped' | 'built' | 'failed', why)`` for one converted config, as written.

    mmgen's int ``betas=(0, 0.99)`` (which torch's Adam refuses) come out of the
    conversion as floats, with a note; nothing is changed here.
    """
    cfg = record.report.config
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    if PLUGIN_MODULE not in imports:
        return 'failed', f'custom_imports does not name {PLUGIN_MODULE}: {imports}'
    for name in imports:
        if name.split('.')[0] == 'fp16utils':
            importlib.import_module(name)
    wrapper_cfg = copy.deepcopy(cfg['optim_wrapper'])
    torch.manual_seed(0)
    model = StandInModel(_backbone_type(cfg), _parts(wrapper_cfg))
    with codebase_classes(BASE, record.codebase):
        try:
            wrapper = build_optim_wrapper(model, wrapper_cfg)
        except Exception as err:  # noqa: BLE001 - reported with the config's name
            return 'failed', f'build_optim_wrapper: {type(err).__name__}: {err}'
        before = [p.detach().clone() for p in model.parameters()]
        try:
            _step(model, wrapper)
        except Exception as err:  # noqa: BLE001 - as above
            return 'built', f'update_params: {type(err).__name__}: {err}'
        changed = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
        if not changed or not _finite(model):
            return 'built', f'the step changed nothing or left non-finite values ({changed=})'
        try:
            for one, sched in _scheduler_entries(cfg, wrapper):
                built = PARAM_SCHEDULERS.build(
                    sched, default_args=dict(optimizer=one, epoch_length=EPOCH_LENGTH))
                built.step()
                lrs = [g['lr'] for g in one.param_groups]
                if not all(math.isfinite(lr) and lr >= 0 for lr in lrs):
                    return 'built', f'{sched["type"]}: lr {lrs} after a step'
        except Exception as err:  # noqa: BLE001 - as above
            return 'built', f'param_scheduler: {type(err).__name__}: {err}'
    return 'stepped', ''


@pytest.mark.parametrize('codebase', list(OLD))
def test_every_converted_optim_wrapper_builds_steps_and_schedules(codebase: str) -> None:
    records = [r for r in converted(BASE, codebase) if r.report is not None]
    with_wrapper = [r for r in records if isinstance(r.report.config.get('optim_wrapper'), dict)]
    outcome = {'stepped': 0, 'built': 0, 'failed': 0}
    failures = []
    for record in with_wrapper:
        kind, why = _build_and_step(record)
        outcome[kind] += 1
        if why:
            failures.append(f'{record.rel}: {why}')
    built = outcome['stepped'] + outcome['built']
    betas = sum(any('.betas: ' in n for n in r.report.notes) for r in with_wrapper)
    own = sorted(r.rel for r in records if _model_builds_optimizers(r))
    print(f'{OLD[codebase].name}: {len(records)} converted, {len(with_wrapper)} with an '
          f'optim_wrapper, {built} built, {outcome["stepped"]} stepped (schedulers too); '
          f'{betas} with int betas written as floats; {len(own)} whose model builds its '
          'own optimizers')
    assert not failures, f'{len(failures)} config(s):\n' + '\n'.join(failures[:20])
    assert betas == INT_BETAS[codebase], betas
    # optimizer=None: no optim_wrapper, and the one problem line that says why
    assert len(own) == MODEL_BUILT[codebase], own
    assert not [r.rel for r in records if r.rel in own and 'optim_wrapper' in r.report.config]


def _model_builds_optimizers(record: Converted) -> bool:
    """``optimizer=None`` (mmgen's SinGAN, PGGAN, StyleGAN-v1), said as such in a problem."""
    said = [p for p in record.report.problems
            if p.startswith('optimizer: None (left out): the mmgen 0.x model builds its own')]
    return 'optimizer' in record.old and record.old['optimizer'] is None and len(said) == 1


@pytest.mark.parametrize('codebase', list(OLD))
def test_every_optimizer_key_becomes_an_optim_wrapper(codebase: str) -> None:
    records = [r for r in converted(BASE, codebase) if r.report is not None]
    left = [r.rel for r in records
            if any(isinstance(r.old.get(k), dict) for k in OPTIMIZER_KEYS)
            and not isinstance(r.report.config.get('optim_wrapper'), dict)]
    kept = [f'{r.rel}: {k}' for r in records for k in OPTIMIZER_KEYS
            if isinstance(r.report.config.get(k), dict)]
    assert not left, f'{len(left)} config(s) with an optimizer and no optim_wrapper: {left[:10]}'
    assert not kept, f'{len(kept)} 0.x optimizer key(s) left in the output: {kept[:10]}'
