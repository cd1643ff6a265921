"""lr_config/momentum_config -> param_scheduler, checked against mmcv and MMEngine themselves.

For every mmcv 1.7.2 policy (each warmup, by_epoch True/False, epoch- and iteration-based
runners) and for every distinct schedule of the 0.x OpenMMLab configs, mmcv's own
LrUpdaterHook/MomentumUpdaterHook run in a real mmcv runner (a one-parameter model, a
list as the data loader) and record the lr and momentum of every iteration; the converted
``param_scheduler`` is built through MMEngine's PARAM_SCHEDULERS registry as MMEngine's
Runner builds it (default ``end``, ``epoch_length`` for ``convert_to_iter_based``) and
stepped as its ParamSchedulerHook steps it. Every iteration must agree (relative 1e-6),
or, where the conversion wrote a note, differ by exactly what the note says.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('mmcv', reason='mmcv 1.7.2 is not installed (the migration tier has it)')
pytest.importorskip('mmengine', reason='mmengine is not installed (the migration tier has it)')

try:  # mmcv.runner imports torchvision; a CPU-only torch may have none that loads
    import torchvision  # noqa: F401
except Exception:  # noqa: BLE001 - any failure to load: an empty stand-in is enough here
    _tv = types.ModuleType('torchvision')
    _tv.models = types.ModuleType('torchvision.models')  # type: ignore[attr-defined]
    sys.modules['torchvision'] = _tv
    sys.modules['torchvision.models'] = _tv.models  # type: ignore[attr-defined]

with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    import mmcv.runner.epoch_based_runner as _epoch_runner
    import mmcv.runner.iter_based_runner as _iter_runner
    import mmengine.optim  # noqa: F401 - registers the schedulers
    from mmcv.runner import EpochBasedRunner, Hook, IterBasedRunner
    from mmengine.registry import PARAM_SCHEDULERS

from fp16utils.migrate._lr_context import read_horizon  # noqa: E402
from fp16utils.migrate._lr_curves import EPOCH_LENGTH  # noqa: E402
from fp16utils.migrate._lr_schedule import convert_lr_schedule  # noqa: E402

LR, MOMENTUM = 0.1, 0.9
EPOCHS, ITERS, ITER_LOADER = 5, 300, 7
_NOTE = re.compile(r'^(?P<key>\w+): .*largest relative difference (?P<rel>\S+) at iteration '
                   r'(?P<it>\d+) ')


class _Model(torch.nn.Module):
    """One parameter; ``train_step`` returns what mmcv's runners expect."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def train_step(self, data: Any, optimizer: Any, **kwargs: Any) -> Dict[str, Any]:
        return dict(loss=self.w.sum(), log_vars={}, num_samples=1)


class _Loader(list):
    """A data loader of ``n`` items (mmcv's IterLoader looks for ``sampler``)."""

    sampler = None

    def __init__(self, n: int) -> None:
        super().__init__(range(n))


class _Record(Hook):
    """Records lr and momentum after the updater hooks set them (before each iteration)."""

    def __init__(self) -> None:
        self.lr: List[float] = []
        self.momentum: List[float] = []

    def before_train_iter(self, runner: Any) -> None:
        group = runner.optimizer.param_groups[0]
        self.lr.append(group['lr'])
        self.momentum.append(group['momentum'])


def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmcv's runners sleep 2 s per epoch / loader cycle: not here."""
    monkeypatch.setattr(_epoch_runner.time, 'sleep', lambda s: None)
    monkeypatch.setattr(_iter_runner.time, 'sleep', lambda s: None)


def _mmcv_curves(kind: str, count: int, length: int, lr_config: Any,
                 momentum_config: Any) -> Tuple[List[float], List[float]]:
    """mmcv's lr and momentum at every iteration, from its own hooks in its own runner."""
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    runner_cls = EpochBasedRunner if kind == 'epoch' else IterBasedRunner
    size = {'max_epochs': count} if kind == 'epoch' else {'max_iters': count}
    runner = runner_cls(model, optimizer=opt, logger=logging.getLogger('lr-curves'), **size)
    runner.register_training_hooks(lr_config=copy.deepcopy(lr_config),
                                   momentum_config=copy.deepcopy(momentum_config))
    record = _Record()
    runner.register_hook(record, priority='VERY_LOW')
    runner.run([_Loader(length)], [('train', 1)])
    return record.lr, record.momentum


def _engine_curves(kind: str, count: int, length: int,
                   schedulers: List[Dict[str, Any]]) -> Tuple[List[float], List[float]]:
    """MMEngine's lr and momentum at every iteration, built and stepped as its Runner does."""
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    max_epochs, max_iters = (count, count * length) if kind == 'epoch' else (1, count)
    built = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for cfg in schedulers:
            cfg = copy.deepcopy(cfg)
            cfg.setdefault('end', max_epochs if cfg.get('by_epoch', True) else max_iters)
            built.append(PARAM_SCHEDULERS.build(
                cfg, default_args=dict(optimizer=opt, epoch_length=length)))
    lrs, moms = [], []
    for it in range(max_iters):
        lrs.append(opt.param_groups[0]['lr'])
        moms.append(opt.param_groups[0]['momentum'])
        opt.step()
        for sched in built:  # ParamSchedulerHook.after_train_iter
            if not sched.by_epoch:
                sched.step()
        if kind == 'epoch' and (it + 1) % length == 0:  # .after_train_epoch
            for sched in built:
                if sched.by_epoch:
                    sched.step()
    return lrs, moms


def _worst(want: List[float], got: List[float]) -> Tuple[float, int]:
    """The largest relative difference and its (first) iteration."""
    worst, where = 0., 0
    for it, (a, b) in enumerate(zip(want, got)):
        rel = abs(b - a) / abs(a) if a else abs(b)
        if rel > worst:
            worst, where = rel, it
    return worst, where


def _config(kind: str, lr_config: Any, momentum_config: Any = None,
            count: Optional[int] = None) -> Dict[str, Any]:
    """A 0.x config around the schedule."""
    cfg: Dict[str, Any] = {'optimizer': dict(type='SGD', lr=LR, momentum=MOMENTUM)}
    if kind == 'epoch':
        cfg['runner'] = dict(type='EpochBasedRunner', max_epochs=count or EPOCHS)
    else:
        cfg['runner'] = dict(type='IterBasedRunner', max_iters=count or ITERS)
    cfg['lr_config'] = lr_config
    if momentum_config is not None:
        cfg['momentum_config'] = momentum_config
    return cfg


def _check(cfg: Dict[str, Any]) -> str:
    """Convert ``cfg``, run both sides, compare; returns what was found (for messages)."""
    old = copy.deepcopy(cfg)
    problems: List[str] = []
    notes: List[str] = []
    convert_lr_schedule(cfg, problems, notes)
    horizon = read_horizon(old)
    kind = horizon.kind
    assert kind is not None
    count = horizon.epochs if kind == 'epoch' else horizon.iters
    length = EPOCH_LENGTH if kind == 'epoch' else ITER_LOADER
    if problems:
        assert all(p.split(':')[0].split('.')[0] in ('lr_config', 'momentum_config')
                   for p in problems), problems
        return 'problem'
    lr_want, mom_want = _mmcv_curves(kind, count, length, old.get('lr_config'),
                                     old.get('momentum_config'))
    lr_got, mom_got = _engine_curves(kind, count, length, cfg.get('param_scheduler', []))
    assert len(lr_want) == len(lr_got)
    stated = {m['key']: (float(m['rel']), int(m['it']))
              for m in (_NOTE.match(n) for n in notes) if m}
    for key, want, got in (('lr_config', lr_want, lr_got),
                           ('momentum_config', mom_want, mom_got)):
        rel, it = _worst(want, got)
        if key in stated:
            assert abs(rel - stated[key][0]) <= 1e-9 and it == stated[key][1], (
                key, rel, it, stated[key], old, cfg.get('param_scheduler'))
        else:
            assert rel <= 1e-6, (key, rel, it, want[it], got[it], old,
                                 cfg.get('param_scheduler'))
    return 'note' if stated else 'exact'


# -- every policy --------------------------------------------------------------------------

_FLOORS = [dict(min_lr=1e-4), dict(min_lr_ratio=0.01), dict(min_lr=0.)]


def _policies(kind: str, by_epoch: bool) -> List[Dict[str, Any]]:
    """mmcv's lr policies with arguments that fit the runner (steps in the policy's unit)."""
    epochs = by_epoch and kind == 'epoch'
    total = EPOCHS if epochs else (ITERS if kind == 'iter' else EPOCHS * EPOCH_LENGTH)
    cut = [total * 2 // 5, total * 4 // 5]
    out: List[Dict[str, Any]] = [
        dict(policy='Fixed'),
        dict(policy='step', step=cut, gamma=0.5),
        dict(policy='Step', step=cut[0], min_lr=LR * 0.3),
        dict(policy='Exp', gamma=0.9 if epochs else 0.995),
        dict(policy='poly', power=0.9, min_lr=1e-4),
        dict(policy='poly', power=2.0),
        dict(policy='Inv', gamma=0.1, power=0.5),
        dict(policy='FlatCosineAnnealing', start_percent=0.4, min_lr_ratio=0.05),
        dict(policy='CosineRestart', periods=[cut[0], total - cut[0]],
             restart_weights=[1, 0.5], min_lr=1e-3),
        dict(policy='CosineRestart', periods=[cut[0], total - cut[0]],
             restart_weights=[1, 0.5], min_lr_ratio=0.1),
        dict(policy='LinearAnnealing', min_lr_ratio=0.1),
        dict(policy='LinearAnnealing', min_lr=1e-3),
    ]
    out += [dict(policy='CosineAnnealing', **floor) for floor in _FLOORS]
    if not by_epoch:
        out += [dict(policy='cyclic', target_ratio=(10, 1e-4), cyclic_times=2,
                     step_ratio_up=0.4, gamma=0.8),
                dict(policy='OneCycle', max_lr=0.3, pct_start=0.25, three_phase=True),
                dict(policy='OneCycle', max_lr=0.3, anneal_strategy='linear')]
    for cfg in out:
        cfg['by_epoch'] = by_epoch
    return out


_WARMUPS = [{}] + [dict(warmup=w, warmup_iters=n, warmup_ratio=0.01)
                   for w in ('constant', 'linear', 'exp') for n in (30, 150)]
_EPOCH_WARMUPS = [dict(warmup=w, warmup_iters=2, warmup_ratio=0.01, warmup_by_epoch=True)
                  for w in ('constant', 'linear', 'exp')]


def _grid() -> List[Tuple[str, Dict[str, Any]]]:
    cases = []
    for kind in ('epoch', 'iter'):
        for by_epoch in (True, False):
            warmups = _WARMUPS + (_EPOCH_WARMUPS if kind == 'epoch' else [])
            for policy in _policies(kind, by_epoch):
                for warm in warmups:
                    cases.append((kind, {**policy, **warm}))
    return cases


_MOMENTUM = [
    dict(policy='step', step=[2, 4], gamma=0.8),
    dict(policy='CosineAnnealing', min_momentum_ratio=0.5),
    dict(policy='CosineAnnealing', min_momentum=0.8),
    dict(policy='LinearAnnealing', min_momentum_ratio=0.9),
    dict(policy='LinearAnnealing', min_momentum=0.8),
]


def test_every_policy_warmup_and_runner_matches_mmcv(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_sleep(monkeypatch)
    seen: Dict[str, int] = {}
    for kind, lr_config in _grid():
        found = _check(_config(kind, lr_config))
        seen[found] = seen.get(found, 0) + 1
    # the grid covers all three outcomes, most of it exactly
    assert seen['exact'] > seen['note'] > 0 and seen['problem'] > 0, seen


def test_every_momentum_policy_matches_mmcv(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_sleep(monkeypatch)
    for kind in ('epoch', 'iter'):
        for mom in _MOMENTUM:
            mom = {**mom, 'by_epoch': kind == 'epoch'}
            if kind == 'iter':
                mom['step'] = [100, 200] if 'step' in mom else None
                mom = {k: v for k, v in mom.items() if v is not None}
            assert _check(_config(kind, dict(policy='Fixed'), mom)) == 'exact', mom
        cyclic = [dict(policy='cyclic', target_ratio=(0.85 / 0.95, 1), cyclic_times=3,
                       step_ratio_up=0.4)]
    for mom in cyclic:
        lr = dict(policy='cyclic', target_ratio=(10, 1e-4), cyclic_times=3, step_ratio_up=0.4)
        assert _check(_config('iter', lr, mom)) == 'exact'


def test_no_approximation_note_without_a_figure() -> None:
    """A schedule said to be approximate names its largest difference (``_check`` tests it).

    The other notes that link the approximations section are about param groups with
    another base value (``lr_mult``): for the base value the curve is exact, and
    ``_check`` holds them to 1e-6.
    """
    approximate = 0
    for kind, lr_config in _grid():
        notes: List[str] = []
        convert_lr_schedule(_config(kind, lr_config), [], notes)
        for note in notes:
            if 'approximate' in note:
                approximate += 1
                assert _NOTE.match(note), note
            elif '#approximations' in note:
                assert 'another base' in note, note
    assert approximate > 0


def test_one_cycle_momentum_and_momentum_warmup_are_problems() -> None:
    for mom in (dict(policy='OneCycle'), dict(policy='step', step=[2], warmup='linear',
                                              warmup_iters=10)):
        cfg = _config('epoch', None, mom)
        problems: List[str] = []
        convert_lr_schedule(cfg, problems, [])
        assert len(problems) == 1 and problems[0].startswith('momentum_config')
        assert 'param_scheduler' not in cfg and 'momentum_config' not in cfg


# -- the real configs ------------------------------------------------------------------------

_RELEASES = ('mmdet-2.28.2', 'mmsegmentation-0.30.0', 'mmcls-0.25.0', 'mmedit-0.16.1',
             'mmgen-0.7.3')


def _wheels() -> Path:
    base = Path(os.environ.get('FP16UTILS_WHEELS_DIR', '/root/.cache/fp16utils/wheels/x'))
    if not base.is_dir():
        pytest.skip(f'{base} (FP16UTILS_WHEELS_DIR) is absent: the OpenMMLab releases are '
                    'not unpacked here')
    return base


def _schedules(base: Path) -> Dict[str, Dict[str, Any]]:
    """Each distinct (lr_config, momentum_config, runner) of the 0.x configs, by key."""
    from fp16utils.migrate import load_config

    found: Dict[str, Dict[str, Any]] = {}
    for release in _RELEASES:
        roots = sorted(base.glob(f'{release}*'))
        if not roots:
            continue
        for path in sorted(roots[0].rglob('configs/**/*.py')):
            if '_base_' in path.parts or 'lr_config' not in path.read_text(errors='ignore'):
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter('ignore')
                    cfg = load_config(path)
            except Exception:  # noqa: BLE001 - a config its release cannot load: not ours
                continue
            if not isinstance(cfg.get('lr_config'), dict):
                continue
            part = {k: cfg[k] for k in ('lr_config', 'momentum_config', 'runner',
                                        'total_epochs', 'total_iters') if k in cfg}
            found.setdefault(repr(sorted(part.items())), part)
    return found


def _scale(value: Any, k: float) -> Any:
    """An iteration/epoch count (or a list of them) divided by ``k``, kept >= 1."""
    if isinstance(value, list):
        return [_scale(v, k) for v in value]
    return max(1, int(round(value / k)))


def _shrink(part: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The same schedule over a short run (counts scaled together); None: no runner."""
    horizon = read_horizon(part)
    if horizon.kind is None:
        return None
    cfg = _config(horizon.kind, copy.deepcopy(part['lr_config']),
                  copy.deepcopy(part.get('momentum_config')))
    if horizon.kind == 'epoch':
        epochs = horizon.epochs or EPOCHS
        short = min(epochs, 8)
        cfg['runner']['max_epochs'] = short
        k_epoch, k_iter = epochs / short, epochs / short
    else:
        iters = horizon.iters or ITERS
        short = min(iters, 400)
        cfg['runner']['max_iters'] = short
        k_epoch, k_iter = 1., iters / short
    for key in ('lr_config', 'momentum_config'):
        sched = cfg.get(key)
        if not isinstance(sched, dict):
            continue
        default = sched.get('policy') not in ('cyclic', 'OneCycle') and (
            key == 'momentum_config' or horizon.kind == 'epoch')
        by_epoch = sched.get('by_epoch', default)
        k = k_epoch if by_epoch and horizon.kind == 'epoch' else k_iter
        for name in ('step', 'periods', 'total_steps'):
            if name in sched:
                sched[name] = _scale(sched[name], k)
        if 'warmup_iters' in sched and not sched.get('warmup_by_epoch'):
            sched['warmup_iters'] = _scale(sched['warmup_iters'], k_iter)
        if sched.get('policy') == 'OneCycle' and 'total_steps' in sched:
            sched['total_steps'] = max(sched['total_steps'], short)
    return cfg


def test_every_schedule_of_the_0x_configs_matches_mmcv(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _wheels()
    _no_sleep(monkeypatch)
    schedules = _schedules(base)
    assert len(schedules) >= 20, len(schedules)
    seen: Dict[str, int] = {}
    for part in schedules.values():
        cfg = _shrink(part)
        if cfg is None:
            seen['no runner'] = seen.get('no runner', 0) + 1
            continue
        found = _check(cfg)
        seen[found] = seen.get(found, 0) + 1
    # 124 distinct schedules today: most exact, a few noted, the codebases' own policies
    # (YOLOX, CosineAnnealingCooldown, Reduce, mmgen's Linear) problems
    assert seen.get('exact', 0) >= 0.75 * len(schedules) and seen.get('note', 0) >= 1, seen


def test_shrinking_keeps_the_schedule_shape() -> None:
    part = dict(runner=dict(type='IterBasedRunner', max_iters=160000),
                lr_config=dict(policy='step', by_epoch=False, step=[80000, 120000],
                               warmup='linear', warmup_iters=1600))
    cfg = _shrink(part)
    assert cfg is not None
    assert cfg['runner']['max_iters'] == 400
    assert cfg['lr_config']['step'] == [200, 300] and cfg['lr_config']['warmup_iters'] == 4
    assert math.isclose(read_horizon(cfg).iters or 0, 400)
