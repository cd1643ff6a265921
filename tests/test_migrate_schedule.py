"""lr_config/momentum_config -> param_scheduler (fp16utils/migrate/_lr_schedule.py).

The exact forms each mmcv policy becomes, the problem and note lines, key order and
idempotence. That each form gives mmcv's curve is checked against mmcv and MMEngine
themselves in tests/migration/test_lr_curves.py (the migration tier).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from fp16utils.migrate import migrate_config
from fp16utils.migrate._lr_schedule import convert_lr_schedule

EPOCHS = dict(type='EpochBasedRunner', max_epochs=12)
ITERS = dict(type='IterBasedRunner', max_iters=1000)
OPTIMIZER = dict(type='SGD', lr=0.1, momentum=0.9)
PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'migration' / 'schedule.md'


def _convert(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    out = copy.deepcopy(cfg)
    problems: list[str] = []
    notes: list[str] = []
    convert_lr_schedule(out, problems, notes)
    return out, problems, notes


def _schedule(runner: dict[str, Any], lr_config: Any, **extra: Any) -> list[dict[str, Any]]:
    out, problems, notes = _convert(dict(optimizer=OPTIMIZER, runner=runner,
                                         lr_config=lr_config, **extra))
    assert problems == [] and notes == [], (problems, notes)
    assert 'lr_config' not in out and 'momentum_config' not in out
    assert out['runner'] == runner  # read, never changed
    return out['param_scheduler']


EXACT = [
    ('fixed', EPOCHS, dict(policy='Fixed'), []),
    ('step-list', EPOCHS, dict(policy='step', step=[8, 11]),
     [dict(type='MultiStepLR', milestones=[8, 11], gamma=0.1, begin=0, end=12, by_epoch=True)]),
    ('step-int-iter', ITERS, dict(policy='step', step=300, gamma=0.5),
     [dict(type='StepLR', step_size=300, gamma=0.5, begin=0, end=1000, by_epoch=False)]),
    ('exp', EPOCHS, dict(policy='Exp', gamma=0.9),
     [dict(type='ExponentialLR', gamma=0.9, begin=0, end=12, by_epoch=True)]),
    ('poly', ITERS, dict(policy='poly', power=0.9, min_lr=1e-4, by_epoch=False),
     [dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, end=1001, by_epoch=False)]),
    ('cosine', EPOCHS, dict(policy='CosineAnnealing', min_lr_ratio=0.01),
     [dict(type='CosineAnnealingLR', T_max=12, eta_min_ratio=0.01, begin=0, end=12,
           by_epoch=True)]),
    ('cosine-iterations-of-epochs', EPOCHS,
     dict(policy='CosineAnnealing', min_lr=0, by_epoch=False),
     [dict(type='CosineAnnealingLR', T_max=12, eta_min=0, begin=0, end=12, by_epoch=True,
           convert_to_iter_based=True)]),
    ('flat-cosine', EPOCHS, dict(policy='FlatCosineAnnealing', start_percent=0.5, min_lr=0.),
     [dict(type='CosineAnnealingLR', T_max=6, eta_min=0., begin=6, end=12, by_epoch=True)]),
    ('cosine-restart', ITERS,
     dict(policy='CosineRestart', periods=[400, 600], restart_weights=[1, 0.5],
          min_lr_ratio=0.1, by_epoch=False),
     [dict(type='CosineRestartLR', periods=[400, 600], restart_weights=[1., 0.55],
           eta_min_ratio=0.1, begin=0, end=1000, by_epoch=False)]),
    ('cosine-restart-one-period', ITERS,
     dict(policy='CosineRestart', periods=[1000], min_lr=1e-7, by_epoch=False),
     [dict(type='CosineAnnealingLR', T_max=1000, eta_min=1e-7, begin=0, end=1000,
           by_epoch=False)]),
    ('cyclic', ITERS, dict(policy='cyclic', target_ratio=(10, 1e-4), step_ratio_up=0.4),
     [dict(type='CosineRestartLR', periods=[400], restart_weights=[1], eta_min_ratio=10,
           begin=0, end=400, by_epoch=False),
      dict(type='CosineRestartLR', periods=[600], restart_weights=[10], eta_min_ratio=1e-4,
           begin=400, end=1000, by_epoch=False)]),
    ('one-cycle', ITERS, dict(policy='OneCycle', max_lr=0.1, pct_start=0.25),
     [dict(type='OneCycleLR', eta_max=0.1, total_steps=1000, pct_start=0.25, begin=0,
           end=1000, by_epoch=False)]),
    ('linear-annealing', EPOCHS, dict(policy='LinearAnnealing', min_lr_ratio=0.1),
     [dict(type='LinearLR', start_factor=1.0, end_factor=0.1, begin=0, end=13,
           by_epoch=True)]),
    ('warmup-linear', EPOCHS,
     dict(policy='step', step=[8, 11], warmup='linear', warmup_iters=500, warmup_ratio=0.001),
     [dict(type='LinearLR', start_factor=0.001, begin=0, end=501, by_epoch=False),
      dict(type='MultiStepLR', milestones=[8, 11], gamma=0.1, begin=0, end=12, by_epoch=True)]),
    ('warmup-constant', EPOCHS,
     dict(policy='Fixed', warmup='constant', warmup_iters=100, warmup_ratio=0.25),
     [dict(type='ConstantLR', factor=0.25, begin=0, end=101, by_epoch=False)]),
    ('warmup-exp', ITERS, dict(policy='Fixed', warmup='exp', warmup_iters=2, warmup_ratio=0.01),
     [dict(type='LinearLR', start_factor=0.01, end_factor=0.01, begin=0, end=1, by_epoch=False),
      dict(type='ExponentialLR', gamma=10.0, begin=0, end=3, by_epoch=False)]),
    ('warmup-constant-epochs', EPOCHS,
     dict(policy='Fixed', warmup='constant', warmup_iters=2, warmup_by_epoch=True),
     [dict(type='ConstantLR', factor=0.1, begin=0, end=3, by_epoch=True)]),
    ('poly-under-iterations-defaults-to-by-iteration', ITERS,
     dict(policy='poly', power=1.0, min_lr=0.),
     [dict(type='PolyLR', eta_min=0., power=1.0, begin=0, end=1001, by_epoch=False)]),
]


def _close(got: Any, want: Any) -> bool:
    """Equal, floats to a relative 1e-12, through lists and dicts (any pytest)."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        return got == pytest.approx(want, rel=1e-12, abs=1e-300)
    if isinstance(want, dict):
        return (isinstance(got, dict) and list(got) == list(want)
                and all(_close(got[k], want[k]) for k in want))
    if isinstance(want, (list, tuple)):
        return (type(got) is type(want) and len(got) == len(want)
                and all(_close(g, w) for g, w in zip(got, want)))
    return type(got) is type(want) and got == want


@pytest.mark.parametrize('runner, lr_config, expected', [c[1:] for c in EXACT],
                         ids=[c[0] for c in EXACT])
def test_each_policy_becomes_its_exact_schedulers(runner: dict[str, Any], lr_config: Any,
                                                  expected: list[dict[str, Any]]) -> None:
    got = _schedule(runner, lr_config)
    assert _close(got, expected), (got, expected)
    assert [list(g) for g in got] == [list(e) for e in expected]  # key order too


def test_momentum_policies_follow_the_lr_schedulers() -> None:
    out, problems, notes = _convert(dict(
        optimizer=OPTIMIZER, runner=ITERS,
        lr_config=dict(policy='cyclic', target_ratio=(10, 1e-4), step_ratio_up=0.4),
        momentum_config=dict(policy='cyclic', target_ratio=(0.85 / 0.95, 1),
                             step_ratio_up=0.4)))
    assert problems == [] and notes == []
    assert [s['type'] for s in out['param_scheduler']] == ['CosineRestartLR'] * 2 + [
        'CosineRestartMomentum'] * 2
    assert out['param_scheduler'][3] == dict(
        type='CosineRestartMomentum', periods=[600], restart_weights=[0.85 / 0.95],
        eta_min_ratio=1, begin=400, end=1000, by_epoch=False)
    got = _schedule(EPOCHS, None, momentum_config=dict(policy='step', step=[4], gamma=0.8))
    assert got == [dict(type='MultiStepMomentum', milestones=[4], gamma=0.8, begin=0, end=12,
                        by_epoch=True)]


def test_step_floor_becomes_the_last_decay_with_a_note() -> None:
    out, problems, notes = _convert(dict(optimizer=OPTIMIZER, runner=EPOCHS, lr_config=dict(
        policy='step', step=[4, 8, 10], gamma=0.1, min_lr=0.005)))
    assert problems == []
    assert out['param_scheduler'] == [
        dict(type='MultiStepLR', milestones=[4], gamma=0.1, begin=0, end=12, by_epoch=True),
        dict(type='MultiStepLR', milestones=[8], gamma=pytest.approx(0.5), begin=0, end=12,
             by_epoch=True)]
    assert len(notes) == 1 and notes[0].startswith('lr_config.min_lr: 0.005 ')
    assert 'the optimizer value 0.1' in notes[0] and notes[0].endswith('#approximations')


def test_an_approximate_schedule_gets_a_note_with_the_largest_difference() -> None:
    out, problems, notes = _convert(dict(optimizer=OPTIMIZER, runner=ITERS, lr_config=dict(
        policy='poly', power=0.9, min_lr=1e-3, by_epoch=False, warmup='linear',
        warmup_iters=100, warmup_ratio=0.01)))
    assert problems == []
    assert [s['type'] for s in out['param_scheduler']] == ['LinearLR', 'PolyLR']
    assert len(notes) == 1
    found = re.fullmatch(
        r'lr_config: the param_scheduler is approximate: largest relative difference '
        r'(\S+) at iteration (\d+) of 1000: lr (\S+) in mmcv, (\S+) in MMEngine; '
        r'see docs/migration/schedule.md#approximations', notes[0])
    assert found, notes[0]
    rel, _, want, got = (float(found[i]) for i in (1, 2, 3, 4))
    assert 1e-4 < rel < 0.1 and int(found[2]) < 100  # only while the warmup lasts
    assert rel == pytest.approx(abs(got - want) / want, rel=1e-9)


def test_an_epoch_based_figure_says_which_epoch_length() -> None:
    _, problems, notes = _convert(dict(optimizer=OPTIMIZER, runner=EPOCHS, lr_config=dict(
        policy='step', step=[8], warmup='linear', warmup_iters=2, warmup_by_epoch=True)))
    assert problems == [] and len(notes) == 1
    assert ' of 1200 with 100 iterations per epoch (the figure depends on it)' in notes[0]


PROBLEMS = [
    ('inv', ITERS, dict(policy='Inv', gamma=0.1, by_epoch=False), 'lr_config: the Inv policy',
     'no-1x-form'),
    ('unknown-policy', EPOCHS, dict(policy='YOLOX', num_last_epochs=15),
     "lr_config.policy: 'YOLOX' is not an mmcv 1.7.2 policy", 'unknown-policies'),
    ('bad-warmup-type', EPOCHS, dict(policy='step', step=[8], warmup='cosine', warmup_iters=5),
     "lr_config.warmup: 'cosine' is not", 'warmup'),
    ('negative-warmup-iters', EPOCHS,
     dict(policy='step', step=[8], warmup='linear', warmup_iters=-5),
     'lr_config.warmup_iters: -5 is not a positive int', 'warmup'),
    ('warmup-ratio', EPOCHS,
     dict(policy='step', step=[8], warmup='linear', warmup_iters=5, warmup_ratio=1.5),
     'lr_config.warmup_ratio: 1.5 is not in (0, 1]', 'warmup'),
    ('exp-warmup-by-epoch', EPOCHS,
     dict(policy='step', step=[8], warmup='exp', warmup_iters=1, warmup_by_epoch=True),
     "lr_config.warmup: 'exp' with warmup_by_epoch=True", 'warmup'),
    ('no-horizon', None, dict(policy='CosineAnnealing', min_lr=0.),
     'lr_config: the policy reads runner.max_epochs', 'horizons'),
    ('epochs-under-iterations', ITERS, dict(policy='step', step=[8], by_epoch=True),
     'lr_config: by_epoch=True under an iteration-based runner', 'horizons'),
    ('cyclic-linear', ITERS, dict(policy='cyclic', anneal_strategy='linear'),
     "lr_config.anneal_strategy: 'linear'", 'no-1x-form'),
    ('both-floors', EPOCHS, dict(policy='CosineAnnealing', min_lr=0., min_lr_ratio=0.1),
     'lr_config: give exactly one of min_lr and min_lr_ratio', 'policies'),
    ('not-a-dict', EPOCHS, 'step', 'lr_config: not a dict with a policy', 'policies'),
    ('far-from-mmcv', ITERS,
     dict(policy='OneCycle', max_lr=0.1, warmup='linear', warmup_iters=10),
     'lr_config: MMEngine has no form of this schedule; the closest, param_scheduler=',
     'no-1x-form'),
]


@pytest.mark.parametrize('runner, lr_config, start, section', [c[1:] for c in PROBLEMS],
                         ids=[c[0] for c in PROBLEMS])
def test_what_has_no_exact_form_is_left_out_with_one_problem(
        runner: Any, lr_config: Any, start: str, section: str) -> None:
    cfg = dict(optimizer=OPTIMIZER, lr_config=lr_config, checkpoint_config=dict(interval=1))
    if runner is not None:
        cfg['runner'] = runner
    out, problems, notes = _convert(cfg)
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(start), line
    assert f'lr_config={lr_config!r} was left out' in line  # the full 0.x value
    assert 'param_scheduler' in line and line.endswith(f'docs/migration/schedule.md#{section}')
    assert '\n' not in line
    assert 'lr_config' not in out and 'param_scheduler' not in out
    assert list(out) == [k for k in cfg if k != 'lr_config']


def test_momentum_warmup_and_one_cycle_momentum_are_problems() -> None:
    for mom, start in ((dict(policy='OneCycle'), 'momentum_config: the OneCycle momentum'),
                       (dict(policy='step', step=[2], warmup='linear', warmup_iters=10),
                        'momentum_config.warmup: mmcv divided')):
        out, problems, _ = _convert(dict(optimizer=OPTIMIZER, runner=EPOCHS,
                                         lr_config=dict(policy='step', step=[8]),
                                         momentum_config=mom))
        assert len(problems) == 1 and problems[0].startswith(start), problems
        assert [s['type'] for s in out['param_scheduler']] == ['MultiStepLR']


def test_mmcv_accepts_a_negative_warmup_length_without_a_warmup() -> None:
    got = _schedule(EPOCHS, dict(policy='step', step=[8], warmup=None, warmup_iters=-1))
    assert [s['type'] for s in got] == ['MultiStepLR']


def test_none_means_no_schedule_and_the_key_goes() -> None:
    out, problems, notes = _convert(dict(optimizer=OPTIMIZER, lr_config=None,
                                         momentum_config=None, runner=EPOCHS))
    assert out == dict(optimizer=OPTIMIZER, runner=EPOCHS) and problems == notes == []


def test_param_scheduler_takes_lr_configs_place_in_the_key_order() -> None:
    cfg = dict(optimizer=OPTIMIZER, momentum_config=dict(policy='step', step=[4]),
               lr_config=dict(policy='step', step=[8]), runner=EPOCHS, seed=0)
    out, _, _ = _convert(cfg)
    assert list(out) == ['optimizer', 'param_scheduler', 'runner', 'seed']
    assert [s['type'] for s in out['param_scheduler']] == ['MultiStepLR', 'MultiStepMomentum']
    out, _, _ = _convert(dict(a=1, momentum_config=dict(policy='step', step=[4]), runner=EPOCHS))
    assert list(out) == ['a', 'param_scheduler', 'runner']


def test_converting_the_result_again_changes_nothing() -> None:
    for _, runner, lr_config, _ in EXACT:
        once, _, _ = _convert(dict(optimizer=OPTIMIZER, runner=runner, lr_config=lr_config))
        twice, problems, notes = _convert(once)
        assert twice == once and problems == notes == []


def test_a_config_without_a_schedule_is_untouched() -> None:
    cfg = dict(optimizer=OPTIMIZER, runner=EPOCHS, param_scheduler=[dict(type='ConstantLR')])
    out, problems, notes = _convert(cfg)
    assert out == cfg and list(out) == list(cfg) and problems == notes == []


def test_a_config_with_both_keeps_param_scheduler_and_says_so() -> None:
    cfg = dict(lr_config=dict(policy='step', step=[8]), param_scheduler=[dict(type='ConstantLR')],
               runner=EPOCHS)
    out, problems, _ = _convert(cfg)
    assert out == dict(param_scheduler=[dict(type='ConstantLR')], runner=EPOCHS)
    assert len(problems) == 1 and problems[0].startswith('lr_config: ')


def test_migrate_config_runs_the_schedule_pass_between_the_other_two() -> None:
    report = migrate_config(dict(
        optimizer=dict(type='SGD', lr=0.02, momentum=0.9), optimizer_config=dict(grad_clip=None),
        lr_config=dict(policy='step', warmup='linear', warmup_iters=500, warmup_ratio=0.001,
                       step=[8, 11]),
        runner=EPOCHS))
    assert list(report.config)[:3] == ['optim_wrapper', 'param_scheduler', 'train_cfg']
    assert report.config['param_scheduler'][0] == dict(
        type='LinearLR', start_factor=0.001, begin=0, end=501, by_epoch=False)
    assert report.config['train_cfg'] == dict(type='EpochBasedTrainLoop', max_epochs=12,
                                              val_interval=1)


def test_every_section_a_message_points_to_exists() -> None:
    text = PAGE.read_text(encoding='utf-8')
    anchors = set()
    for heading in re.findall(r'^#+ (.+)$', text, re.M):
        anchors.add(re.sub(r'[^a-z0-9 -]', '', heading.lower()).strip().replace(' ', '-'))
    source = ''.join(p.read_text(encoding='utf-8') for p in
                     (PAGE.parents[2] / 'fp16utils' / 'migrate').glob('_lr_*.py'))
    used = set(re.findall(r"schedule\.md#([a-z0-9-]+)", source))
    used |= set(re.findall(r"'(no-1x-form|policies|horizons|warmup|unknown-policies)'", source))
    assert used and used <= anchors, used - anchors
