"""The runtime-keys pass of ``migrate_config``: runner, evaluation, hooks, environment.

Every 0.x key that mmcv's runner or the 0.x training/test scripts read is either
converted exactly or left out with one problem line; these tests pin both, the key
order, ``test_fp16``, idempotence, and (with mmengine installed) that the converted
keys build and train in MMEngine's Runner.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from fp16utils.migrate import migrate_config
from fp16utils.migrate._runtime_keys import convert_runtime

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'migration' / 'runtime.md'

RUNTIME_KEYS = ('runner', 'total_epochs', 'total_iters', 'evaluation', 'checkpoint_config',
                'log_config', 'workflow', 'dist_params', 'cudnn_benchmark', 'mp_start_method',
                'opencv_num_threads', 'resume_from', 'auto_resume', 'seed', 'deterministic',
                'gpu_ids', 'device', 'data', 'exp_name', 'use_ddp_wrapper')


#: Why the MMEngine parts skip in the main suite.
NO_MMENGINE = 'mmengine is not installed here (.ci/mmengine runs this test)'

def run(cfg, test_fp16=False, codebase=None):
    """Run the pass on a copy: (config, problems, notes)."""
    out = copy.deepcopy(cfg)
    problems: list = []
    notes: list = []
    convert_runtime(out, problems, notes, test_fp16=test_fp16, codebase=codebase)
    return out, problems, notes


def mmdet_runtime():
    """mmdet 2.x's schedule_1x + default_runtime, as merged."""
    return dict(
        model=dict(type='FasterRCNN', train_cfg=dict(rpn=None), test_cfg=dict(rcnn=None)),
        evaluation=dict(interval=1, metric='bbox'),
        runner=dict(type='EpochBasedRunner', max_epochs=12),
        checkpoint_config=dict(interval=1),
        log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook')]),
        custom_hooks=[dict(type='NumClassCheckHook')],
        dist_params=dict(backend='nccl'),
        log_level='INFO',
        load_from=None,
        resume_from=None,
        workflow=[('train', 1)],
        opencv_num_threads=0,
        mp_start_method='fork',
        auto_scale_lr=dict(enable=False, base_batch_size=16),
    )


# -- whole configs ---------------------------------------------------------------


def test_mmdet_default_runtime_becomes_upstreams_1x_keys():
    out, problems, notes = run(mmdet_runtime(), codebase='mmdet')
    assert out == dict(
        model=dict(type='FasterRCNN', train_cfg=dict(rpn=None), test_cfg=dict(rcnn=None)),
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1),
        val_cfg=dict(type='ValLoop'),
        test_cfg=dict(type='TestLoop'),
        default_hooks=dict(
            timer=dict(type='IterTimerHook'),
            logger=dict(type='LoggerHook', interval=50),
            param_scheduler=dict(type='ParamSchedulerHook'),
            checkpoint=dict(type='CheckpointHook', interval=1),
            sampler_seed=dict(type='DistSamplerSeedHook'),
        ),
        log_processor=dict(type='LogProcessor', window_size=50, by_epoch=True),
        custom_hooks=[dict(type='NumClassCheckHook')],
        env_cfg=dict(mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
                     dist_cfg=dict(backend='nccl')),
        log_level='INFO',
        load_from=None,
        resume=False,
        auto_scale_lr=dict(enable=False, base_batch_size=16),
    )
    # New keys take the place of the first 0.x key they replace.
    assert list(out) == ['model', 'train_cfg', 'val_cfg', 'test_cfg', 'default_hooks',
                         'log_processor', 'custom_hooks', 'env_cfg', 'log_level', 'load_from',
                         'resume', 'auto_scale_lr']
    assert len(problems) == 1 and problems[0].startswith("evaluation: metric='bbox' was left out")
    assert problems[0].endswith('see docs/migration/runtime.md#evaluation')
    assert "val_evaluator=dict(type='CocoMetric', metric='bbox')" in problems[0]
    assert notes == []


def test_mmseg_iter_based_schedule_matches_upstream():
    cfg = dict(
        log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook', by_epoch=False)]),
        dist_params=dict(backend='nccl'), log_level='INFO', load_from=None, resume_from=None,
        workflow=[('train', 1)], cudnn_benchmark=True,
        runner=dict(type='IterBasedRunner', max_iters=40000),
        checkpoint_config=dict(by_epoch=False, interval=4000),
        evaluation=dict(interval=4000, metric='mIoU', pre_eval=True),
    )
    out, problems, _ = run(cfg, codebase='mmseg')
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', max_iters=40000,
                                    val_interval=4000)
    assert out['default_hooks']['logger'] == dict(type='LoggerHook', interval=50,
                                                  log_metric_by_epoch=False)
    assert out['default_hooks']['checkpoint'] == dict(type='CheckpointHook', by_epoch=False,
                                                      interval=4000)
    assert out['log_processor'] == dict(type='LogProcessor', window_size=50, by_epoch=False)
    assert out['env_cfg'] == dict(cudnn_benchmark=True, dist_cfg=dict(backend='nccl'))
    assert list(out) == ['default_hooks', 'log_processor', 'env_cfg', 'log_level', 'load_from',
                         'resume', 'train_cfg', 'val_cfg', 'test_cfg']
    assert [p.split(':')[0] for p in problems] == ['evaluation']
    assert "metric='mIoU', pre_eval=True" in problems[0]


def test_iter_based_runner_makes_hooks_count_iterations_as_mmcv_did():
    # mmcv's IterBasedRunner.register_training_hooks: setdefault('by_epoch', False).
    out, _, _ = run(dict(runner=dict(type='IterBasedRunner', max_iters=900),
                         checkpoint_config=dict(interval=300),
                         log_config=dict(interval=10, hooks=[dict(type='TextLoggerHook')])))
    assert out['default_hooks']['checkpoint'] == dict(type='CheckpointHook', by_epoch=False,
                                                      interval=300)
    assert out['default_hooks']['logger'] == dict(type='LoggerHook', interval=10,
                                                  log_metric_by_epoch=False)
    assert out['log_processor']['by_epoch'] is False
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', max_iters=900, val_interval=1)


def test_a_config_without_runtime_keys_is_untouched():
    cfg = dict(model=dict(type='X'), img_norm_cfg=dict(mean=[1, 2, 3]), train_pipeline=[],
               dataset_type='CocoDataset', data_root='data/', custom_imports=dict(imports=['a']),
               work_dir='./w', find_unused_parameters=True, log_level='INFO')
    out, problems, notes = run(cfg)
    assert out == cfg and list(out) == list(cfg)
    assert problems == notes == []
    assert migrate_config(dict(optimizer=dict(type='SGD', lr=0.1))).config == dict(
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)))


CONFIGS = {
    'mmdet': mmdet_runtime(),
    'gan': dict(
        model=dict(type='StaticUnconditionalGAN'),
        train_cfg=dict(use_ema=True), test_cfg=None,
        runner=dict(type='DynamicIterBasedRunner', is_dynamic_ddp=True,
                    pass_training_status=True),
        total_iters=800002, use_ddp_wrapper=True, find_unused_parameters=False,
        checkpoint_config=dict(interval=10000, by_epoch=False, max_keep_ckpts=20),
        log_config=dict(interval=100, hooks=[dict(type='TextLoggerHook'),
                                             dict(type='TensorboardLoggerHook')]),
        custom_hooks=[dict(type='ExponentialMovingAverageHook', module_keys=('g_ema',)),
                      dict(type='MMGenVisualizationHook')],
        evaluation=dict(type='GenerativeEvalHook', interval=10000, metrics=dict(type='FID'),
                        best_metric='fid'),
        workflow=[('train', 1)], resume_from='w/iter_10.pth', auto_resume=False, seed=3,
    ),
    'yolox': dict(
        runner=dict(type='EpochBasedRunner', max_epochs=300),
        evaluation=dict(save_best='auto', interval=10, dynamic_intervals=[(285, 1)],
                        metric='bbox'),
        checkpoint_config=dict(interval=10),
        log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook')]),
        custom_hooks=[dict(type='YOLOXModeSwitchHook', num_last_epochs=15, priority=48),
                      dict(type='ExpMomentumEMAHook', resume_from=None, momentum=0.0001,
                           priority=49)],
    ),
}


@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('test_fp16', [False, True])
def test_converting_twice_changes_nothing(name, test_fp16):
    once, problems, _ = run(CONFIGS[name], test_fp16=test_fp16)
    again, problems_again, notes_again = run(once, test_fp16=test_fp16)
    assert again == once and list(again) == list(once)
    assert problems and problems_again == [] and notes_again == []
    assert not set(RUNTIME_KEYS) & set(once)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_problem_line_names_a_section_of_the_page(name):
    _, problems, notes = run(CONFIGS[name])
    anchors = _anchors()
    for line in problems + notes:
        found = re.search(r'see docs/migration/runtime\.md#([\w-]+)$', line)
        assert found, line
        assert found.group(1) in anchors, line
        assert '\n' not in line


def _anchors():
    """The heading anchors of the page, as MkDocs' toc writes them."""
    heads = re.findall(r'^#{2,4} (.+)$', PAGE.read_text(), re.M)
    return {re.sub(r'[^\w\- ]', '', h).strip().lower().replace(' ', '-') for h in heads}


# -- runner and loops --------------------------------------------------------------


def test_test_fp16_switches_the_evaluation_loops_to_half():
    out, _, _ = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=2)), test_fp16=True)
    assert out == dict(train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=1),
                       val_cfg=dict(type='ValLoop', fp16=True),
                       test_cfg=dict(type='TestLoop', fp16=True))


@pytest.mark.parametrize('codebase, train, val, test', [
    ('mmcls', dict(by_epoch=True, max_epochs=100, val_interval=1), {}, {}),
    # mmedit/mmgen validated only with an evaluation key: no validation loop here.
    ('mmedit', dict(type='EpochBasedTrainLoop', max_epochs=100), None,
     dict(type='MultiTestLoop')),
    # mmgen: no metrics, so its tools/evaluation.py computed nothing: no test loop either
    ('mmgen', dict(by_epoch=True, max_epochs=100), None, None),
    ('mmdet', dict(type='EpochBasedTrainLoop', max_epochs=100, val_interval=1),
     dict(type='ValLoop'), dict(type='TestLoop')),
])
@pytest.mark.parametrize('test_fp16', [False, True])
def test_loops_take_the_form_of_the_codebases_1x_release(codebase, train, val, test,
                                                         test_fp16):
    out, _, _ = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=100)),
                    test_fp16=test_fp16, codebase=codebase)
    half = {'fp16': True} if test_fp16 else {}
    assert out == dict(train_cfg=train, val_cfg=None if val is None else {**val, **half},
                       test_cfg=None if test is None else {**test, **half})
    assert list(out['train_cfg']) == list(train)
    assert run(out, test_fp16=test_fp16, codebase=codebase)[0] == out


def test_mmagic_validation_loop_when_0x_validated():
    out, _, _ = run(dict(total_iters=10, evaluation=dict(interval=5)), codebase='mmedit')
    assert out == dict(train_cfg=dict(type='IterBasedTrainLoop', max_iters=10, val_interval=5),
                       val_cfg=dict(type='MultiValLoop'), test_cfg=dict(type='MultiTestLoop'))
    out, _, _ = run(dict(total_iters=10, evaluation=dict(interval=5)), codebase='mmgen')
    assert out['train_cfg'] == dict(by_epoch=False, max_iters=10, val_interval=5)


@pytest.mark.parametrize('cfg, loop', [
    (dict(total_epochs=24), dict(type='EpochBasedTrainLoop', max_epochs=24, val_interval=1)),
    (dict(runner=None, total_iters=80000),
     dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=1)),
    (dict(runner=dict(max_epochs=24)), dict(max_epochs=24)),  # a child config
])
def test_total_epochs_total_iters_and_child_runners(cfg, loop):
    out, problems, _ = run(cfg)
    assert out['train_cfg'] == loop and problems == []
    assert ('val_cfg' in out) is ('type' in loop)


def test_total_iters_overrides_the_runner_as_runner_run_did():
    out, problems, _ = run(dict(runner=dict(type='IterBasedRunner', max_iters=10),
                                total_iters=20), codebase='mmedit')
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', max_iters=20)
    assert len(problems) == 1 and problems[0].startswith('total_iters: 20 differs from '
                                                         'runner.max_iters=10; 20')


def test_dynamic_runner_arguments_are_listed():
    out, problems, _ = run(dict(runner=dict(type='DynamicIterBasedRunner', max_iters=5,
                                            is_dynamic_ddp=True, pass_training_status=True)))
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', max_iters=5, val_interval=1)
    assert [p.split(':')[0] for p in problems] == ['runner.is_dynamic_ddp',
                                                   'runner.pass_training_status']
    assert all(p.endswith('#runner-and-loops') for p in problems)


def test_a_runner_without_a_length_gives_a_loop_without_one():
    # A fragment: 0.x could not run it either (no max_iters, no total_iters).
    out, problems, _ = run(dict(runner=dict(type='DynamicIterBasedRunner')))
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', val_interval=1)
    assert problems == []


def test_unknown_runner_type_is_left_out_and_listed():
    out, problems, _ = run(dict(runner=dict(type='IPUEpochBasedRunner', max_epochs=3)))
    assert out == {} and problems[0].startswith("runner.type: 'IPUEpochBasedRunner'")


# -- evaluation --------------------------------------------------------------------


def test_evaluation_best_checkpoint_start_and_dynamic_intervals():
    out, problems, notes = run(CONFIGS['yolox'], codebase='mmdet')
    assert out['train_cfg'] == dict(type='EpochBasedTrainLoop', max_epochs=300, val_interval=10,
                                    dynamic_intervals=[(285, 1)])
    assert out['default_hooks']['checkpoint'] == dict(type='CheckpointHook', interval=10,
                                                      save_best='auto')
    assert out['custom_hooks'] == [
        dict(type='YOLOXModeSwitchHook', num_last_epochs=15, priority=48),
        dict(type='EMAHook', ema_type='ExpMomentumEMA', momentum=0.0001, priority=49,
             update_buffers=True),
    ]
    assert [p.split(':')[0] for p in problems] == ['evaluation'] and notes == []

    out, problems, _ = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=12),
                                evaluation=dict(interval=2, start=4, rule='greater',
                                                save_best='acc')))
    assert out['train_cfg'] == dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=2,
                                    val_begin=4)
    assert 'default_hooks' not in out  # no checkpoint_config to carry save_best: listed
    assert [p.split(':')[0] for p in problems] == ['evaluation', 'evaluation.save_best']


def test_mmgen_dynamic_interval_becomes_dynamic_intervals():
    # mmgen's GenerativeEvalHook: bisect_right(milestones, iter + 1) picks the interval,
    # as MMEngine's loops do with dynamic_intervals.
    out, problems, _ = run(dict(total_iters=900000, evaluation=dict(
        type='GenerativeEvalHook', interval=dict(milestones=[800000], interval=[10000, 4000]),
        metrics=dict(type='FID'))), codebase='mmgen')
    assert out['train_cfg'] == dict(by_epoch=False, max_iters=900000,
                                    val_interval=10000, dynamic_intervals=[(800000, 4000)])
    assert [p.split(':')[0] for p in problems] == ['evaluation']
    assert "metrics={'type': 'FID'} (GenerativeEvalHook)" in problems[0]


def test_evaluation_start_that_counts_differently_is_listed():
    out, problems, _ = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=12),
                                evaluation=dict(interval=2, start=3)))
    assert 'val_begin' not in out['train_cfg']
    assert problems[0].startswith('evaluation.start: 3 with interval=2')


def test_a_last_validation_1x_adds_is_a_note():
    _, _, notes = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=5),
                           evaluation=dict(interval=2)))
    assert notes == ['train_cfg.val_interval: 2 does not divide 5; the 1.x loop also validates '
                     'at the end of training, which 0.x did not; see '
                     'docs/migration/runtime.md#evaluation']


def test_evaluation_alone_gives_a_partial_train_cfg():
    out, problems, _ = run(dict(_base_='x.py', evaluation=dict(interval=3, metric='acc')))
    assert out == dict(_base_='x.py', train_cfg=dict(val_interval=3))
    assert "metric='acc'" in problems[0]


# -- hooks --------------------------------------------------------------------------


def test_checkpoint_and_logger_none_switch_the_hooks_off():
    out, problems, _ = run(dict(checkpoint_config=None, log_config=None))
    assert out['default_hooks'] == dict(timer=dict(type='IterTimerHook'), logger=None,
                                        param_scheduler=dict(type='ParamSchedulerHook'),
                                        checkpoint=None,
                                        sampler_seed=dict(type='DistSamplerSeedHook'))
    assert problems == []


def test_checkpoint_arguments_without_a_1x_counterpart_are_listed():
    out, problems, _ = run(dict(checkpoint_config=dict(interval=2, max_keep_ckpts=3,
                                                       sync_buffer=True, out_dir='s3://b',
                                                       create_symlink=True, meta={})))
    assert out == dict(default_hooks=dict(checkpoint=dict(
        type='CheckpointHook', interval=2, max_keep_ckpts=3, out_dir='s3://b')))
    assert [p.split(':')[0] for p in problems] == ['checkpoint_config.sync_buffer',
                                                   'checkpoint_config.meta']


def test_logger_hooks_become_vis_backends():
    out, problems, _ = run(dict(log_config=dict(interval=20, hooks=[
        dict(type='TextLoggerHook', ignore_last=False),
        dict(type='TensorboardLoggerHook'),
        dict(type='WandbLoggerHook', init_kwargs=dict(project='p'), log_artifact=False),
        dict(type='PaviLoggerHook'),
    ])))
    assert out['default_hooks'] == dict(logger=dict(type='LoggerHook', interval=20,
                                                    ignore_last=False))
    assert out['visualizer'] == dict(type='Visualizer', name='visualizer', vis_backends=[
        dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend'),
        dict(type='WandbVisBackend', init_kwargs=dict(project='p'))])
    assert list(out) == ['default_hooks', 'log_processor', 'visualizer']
    # ignore_last differs from the text logger's for both backends; Pavi has no backend.
    assert [p.split(':')[0] for p in problems] == [
        'log_config.hooks[1].ignore_last', 'log_config.hooks[2].ignore_last',
        'log_config.hooks[3]']


def test_wandb_artifacts_are_listed_since_mmcv_uploaded_them_by_default():
    _, problems, _ = run(dict(log_config=dict(interval=5, hooks=[dict(type='WandbLoggerHook')])))
    assert [p.split(':')[0] for p in problems] == ['log_config.hooks[0].log_artifact']


def test_custom_hooks_1x_lacks_are_listed_and_left_out():
    out, problems, notes = run(dict(
        runner=dict(type='EpochBasedRunner', max_epochs=1),
        custom_hooks=[dict(type='NumClassCheckHook'), dict(type='MMDetWandbHook'),
                      dict(type='EMAHook', momentum=4e-5, priority='ABOVE_NORMAL')]),
        codebase='mmdet')
    assert out['custom_hooks'] == [dict(type='NumClassCheckHook'),
                                   dict(type='EMAHook', momentum=4e-5, priority='ABOVE_NORMAL')]
    assert [p.split(':')[0] for p in problems] == ['custom_hooks[1]']
    assert [n.split(':')[0] for n in notes] == ['custom_hooks[2]']
    _, problems, _ = run(dict(runner=dict(type='EpochBasedRunner', max_epochs=1),
                              custom_hooks=[dict(type='NumClassCheckHook')]), codebase='mmseg')
    assert problems[0].startswith("custom_hooks[0]: {'type': 'NumClassCheckHook'}")


def test_0x_ema_momentum_becomes_mmagics():
    # 0.x: orig + (ema - orig) * m; mmagic: ema + (orig - ema) * m.
    out, problems, _ = run(dict(total_iters=10, custom_hooks=[
        dict(type='ExponentialMovingAverageHook', module_keys=('generator_ema',), interval=1,
             interp_cfg=dict(momentum=0.999, momentum_nontrainable=0.0), priority='VERY_HIGH'),
        dict(type='ExponentialMovingAverageHook', module_keys='g', momentum_policy='rampup',
             momentum_cfg=dict(ema_kimg=10)),
        dict(type='ExponentialMovingAverageHook', module_keys='g', interp_mode='copy'),
    ]), codebase='mmgen')
    assert out['custom_hooks'] == [
        dict(type='ExponentialMovingAverageHook', module_keys=('generator_ema',), interval=1,
             interp_cfg=dict(momentum=0.001, momentum_nontrainable=1.0), priority='VERY_HIGH'),
        dict(type='ExponentialMovingAverageHook', module_keys='g'),
    ]
    assert [p.split(':')[0] for p in problems] == ['custom_hooks[1].momentum_policy',
                                                   'custom_hooks[2].interp_mode']
    assert run(out, codebase='mmgen')[0] == out  # a converted config is left alone


def test_existing_1x_keys_win_and_clashes_are_listed():
    out, problems, _ = run(dict(
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=5)),
        checkpoint_config=dict(interval=1), env_cfg=dict(cudnn_benchmark=False),
        dist_params=dict(backend='gloo')))
    assert out == dict(default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=5)),
                       env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')))
    assert [p.split(':')[0] for p in problems] == ['default_hooks.checkpoint']
    assert problems[0].endswith('#keys-already-in-1x-form')


# -- environment, resume, randomness, the rest ------------------------------------


def test_environment_keys_become_env_cfg():
    out, problems, _ = run(dict(cudnn_benchmark=True, mp_start_method='spawn',
                                opencv_num_threads=2, dist_params=dict(backend='gloo', port=1)))
    assert out == dict(env_cfg=dict(cudnn_benchmark=True,
                                    mp_cfg=dict(mp_start_method='spawn', opencv_num_threads=2),
                                    dist_cfg=dict(backend='gloo', port=1)))
    assert problems == []


@pytest.mark.parametrize('cfg, expected, n_problems', [
    (dict(load_from='a.pth', resume_from='b.pth'), dict(load_from='b.pth', resume=True), 0),
    (dict(load_from='a.pth', resume_from=None), dict(load_from='a.pth', resume=False), 0),
    (dict(auto_resume=True, resume_from=None), dict(resume=True), 0),
    (dict(load_from='a.pth', auto_resume=True), dict(load_from='a.pth', resume=False), 1),
])
def test_resume_from_and_auto_resume(cfg, expected, n_problems):
    out, problems, _ = run(cfg)
    assert out == expected and list(out) == list(expected)
    assert len(problems) == n_problems


def test_seed_and_deterministic_become_randomness():
    out, _, notes = run(dict(seed=0, deterministic=True, exp_name='e'))
    assert out == dict(randomness=dict(seed=0, deterministic=True), experiment_name='e')
    assert notes == []
    _, _, notes = run(dict(seed=0), codebase='mmdet')
    assert [n.split(':')[0] for n in notes] == ['seed']


def test_workflow_train_only_is_dropped_and_a_val_phase_listed():
    assert run(dict(workflow=[('train', 2)]))[:2] == ({}, [])
    out, problems, _ = run(dict(workflow=[('train', 1), ('val', 1)]))
    assert out == {} and problems[0].startswith("workflow: [('train', 1), ('val', 1)] was left")
    assert 'val_interval' in problems[0] and 'val_cfg' in problems[0]


def test_data_is_left_out_with_one_line_naming_the_loader_keys():
    out, problems, _ = run(dict(data=dict(samples_per_gpu=4, workers_per_gpu=2,
                                          train=dict(type='A'), val=dict(type='A'))))
    assert out == {}
    assert problems == [
        'data: left out of the converted config (the 0.x file still has it; MMEngine ignores '
        '`data`): samples_per_gpu=4 -> batch_size; workers_per_gpu=2 -> num_workers; train -> '
        'train_dataloader.dataset; val -> val_dataloader.dataset; write train_dataloader, '
        'val_dataloader and test_dataloader with the 1.x datasets and pipelines (their names '
        'and transforms changed); see docs/migration/runtime.md#data']


@pytest.mark.parametrize('key, value, section', [
    ('gpu_ids', [0, 1], 'devices'), ('device', 'cuda', 'devices'),
    ('visual_config', dict(type='X'), 'other-keys'), ('sampler', dict(type='R'), 'data'),
])
def test_keys_mmengine_ignores_are_left_out_and_listed(key, value, section):
    out, problems, _ = run({key: value})
    assert out == {} and len(problems) == 1
    assert problems[0].startswith(f'{key}: {value!r} was left out (MMEngine ignores it)')
    assert problems[0].endswith(f'#{section}')


def test_ddp_wrapper_becomes_model_wrapper_cfg():
    out, _, _ = run(dict(use_ddp_wrapper=True, find_unused_parameters=True))
    assert out == dict(model_wrapper_cfg=dict(type='MMSeparateDistributedDataParallel',
                                              broadcast_buffers=False,
                                              find_unused_parameters=True))
    assert run(dict(use_ddp_wrapper=False, find_unused_parameters=True))[0] == dict(
        find_unused_parameters=True)  # MMEngine reads it itself


# -- model settings -----------------------------------------------------------------


def test_model_settings_move_into_the_model():
    out, problems, _ = run(CONFIGS['gan'])
    assert out['model'] == dict(type='StaticUnconditionalGAN', train_cfg=dict(use_ema=True))
    assert out['train_cfg'] == dict(type='IterBasedTrainLoop', max_iters=800002,
                                    val_interval=10000)
    assert out['test_cfg'] == dict(type='TestLoop')
    assert out['load_from'] == 'w/iter_10.pth' and out['resume'] is True
    assert out['model_wrapper_cfg']['find_unused_parameters'] is False
    keys = [p.split(':')[0] for p in problems]
    assert keys == ['runner.is_dynamic_ddp', 'runner.pass_training_status', 'evaluation',
                    'custom_hooks[1]']


def test_a_model_setting_the_model_already_has_is_listed():
    out, problems, _ = run(dict(model=dict(type='M', test_cfg=dict(a=1)), test_cfg=dict(a=2),
                                total_epochs=1))
    assert out['model'] == dict(type='M', test_cfg=dict(a=1))
    assert out['test_cfg'] == dict(type='TestLoop')
    assert problems[0].startswith('test_cfg: {\'a\': 2} is a model setting')
    assert problems[0].endswith('#model-settings')


def test_train_cfg_none_is_dropped():
    out, problems, _ = run(dict(model=dict(type='M'), train_cfg=None, test_cfg=None))
    assert out == dict(model=dict(type='M')) and problems == []


# -- through MMEngine -------------------------------------------------------------


def test_converted_keys_train_in_mmengines_runner(tmp_path):
    """The converted loops, hooks, env and randomness build and run as they say."""
    mmengine = pytest.importorskip('mmengine.runner', reason=NO_MMENGINE)
    import multiprocessing

    import torch
    from mmengine.evaluator import BaseMetric, Evaluator
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    cfg = mmdet_runtime()
    cfg.update(runner=dict(type='EpochBasedRunner', max_epochs=4),
               evaluation=dict(interval=2, save_best='acc', rule='greater'),
               checkpoint_config=dict(interval=2, max_keep_ckpts=1),
               log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook')]),
               seed=7, deterministic=False, custom_hooks=[])
    del cfg['model']
    new, problems, _ = run(cfg, test_fp16=False)
    assert [p.split(':')[0] for p in problems] == ['evaluation']

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def forward(self, inputs, mode='tensor'):
            out = self.w(torch.stack(inputs))
            if mode == 'loss':
                return {'loss': out.pow(2).mean()}
            return [dict(value=float(v)) for v in out]

    class Acc(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.extend(s['value'] for s in data_samples)

        def compute_metrics(self, results):
            return {'acc': float(len(results))}

    data = [dict(inputs=torch.ones(2))] * 4
    loader = dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=False),
                  batch_size=2, num_workers=0)
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        runner = Runner(
            model=Toy(), work_dir=str(tmp_path), train_dataloader=loader,
            val_dataloader=loader, val_evaluator=Evaluator(Acc()),
            optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
            train_cfg=new['train_cfg'], val_cfg=new['val_cfg'],
            default_hooks=new['default_hooks'], env_cfg=new['env_cfg'],
            log_processor=new['log_processor'], randomness=new['randomness'],
            load_from=new['load_from'], resume=new['resume'], log_level=new['log_level'],
        )
        runner.train()
    finally:
        multiprocessing.set_start_method(method, force=True)
    loop = runner.train_loop
    assert type(loop).__name__ == 'EpochBasedTrainLoop'
    assert (loop.max_epochs, loop.val_interval, loop.val_begin) == (4, 2, 1)
    assert type(runner.val_loop).__name__ == 'ValLoop' and runner.val_loop.fp16 is False
    hooks = {type(h).__name__: h for h in runner.hooks}
    assert {'IterTimerHook', 'LoggerHook', 'ParamSchedulerHook', 'CheckpointHook',
            'DistSamplerSeedHook'} <= set(hooks)
    ckpt = hooks['CheckpointHook']
    assert (ckpt.interval, ckpt.max_keep_ckpts, ckpt.save_best, ckpt.rules) == (
        2, 1, ['acc'], ['greater'])
    assert hooks['LoggerHook'].interval == 1
    assert runner.seed == 7
    saved = sorted(p.name for p in tmp_path.glob('*.pth'))
    assert saved == ['best_acc_epoch_2.pth', 'epoch_4.pth']  # max_keep_ckpts=1
    assert mmengine.Runner is Runner


def test_fp16_evaluation_loops_build_in_mmengine(tmp_path):
    pytest.importorskip('mmengine.registry', reason=NO_MMENGINE)
    from mmengine.registry import LOOPS

    new, _, _ = run(dict(total_epochs=1), test_fp16=True)
    assert LOOPS.get(new['val_cfg']['type']).__name__ == 'ValLoop'
    assert LOOPS.get(new['test_cfg']['type']).__name__ == 'TestLoop'
    import inspect
    for key in ('val_cfg', 'test_cfg'):
        params = inspect.signature(LOOPS.get(new[key]['type'])).parameters
        assert params['fp16'].default is False and new[key]['fp16'] is True


def test_mmgen_config_without_metrics_or_evaluation_tests_nothing() -> None:
    cfg = dict(runner=dict(type='DynamicIterBasedRunner'), total_iters=22000, test_cfg=None)
    report = migrate_config(cfg, codebase='mmgen')
    assert report.config['test_cfg'] is None and report.config['val_cfg'] is None
    assert report.config['train_cfg'] == {'by_epoch': False, 'max_iters': 22000}
    assert [n.split(':')[0] for n in report.notes if 'tools/evaluation.py' in n] == ['test_cfg']
    with_metrics = migrate_config({**cfg, 'metrics': dict(fid=dict(type='FID'))},
                                  codebase='mmgen')
    assert with_metrics.config['test_cfg'] == {'type': 'MultiTestLoop'}


def test_config_with_evaluation_and_nothing_to_train_gets_a_test_loop_only() -> None:
    cfg = dict(model=dict(type='EDVR'), train_cfg=None, test_cfg=dict(metrics=['PSNR']),
               evaluation=dict(interval=5000, save_image=False))
    report = migrate_config(cfg, codebase='mmedit')
    new = report.config
    assert new['test_cfg'] == {'type': 'MultiTestLoop'}
    assert 'train_cfg' not in new and 'val_cfg' not in new
    assert new['model']['test_cfg'] == dict(metrics=['PSNR'])
    said = [n for n in report.notes if n.startswith('evaluation.interval: 5000 dropped')]
    assert len(said) == 1 and 'trains nothing' in said[0]
    # a child config: its base gives the runner; the interval goes to a partial train_cfg
    child = migrate_config({**cfg, '_base_': ['./base.py']}, codebase='mmedit')
    assert child.config['train_cfg'] == {'val_interval': 5000}
    assert 'test_cfg' not in child.config or child.config['test_cfg'] != {'type': 'MultiTestLoop'}


@pytest.mark.parametrize('codebase', ['mmdet', 'mmcls'])  # mmcls: mmpretrain's untyped loops
def test_plugin_half_precision_loops_are_the_plugins(codebase):
    cfg = dict(optimizer=dict(type='SGD', lr=0.01), fp16=dict(loss_scale=512.),
               runner=dict(type='EpochBasedRunner', max_epochs=2), evaluation=dict(interval=1))
    plain = migrate_config(cfg, codebase=codebase).config
    assert plain['val_cfg'].get('type', 'ValLoop') == 'ValLoop' and plain['val_cfg']['fp16']
    report = migrate_config(cfg, codebase=codebase, plugin=True)
    assert report.config['val_cfg'] == dict(type='Fp16utilsValLoop', fp16=True)
    assert report.config['test_cfg'] == dict(type='Fp16utilsTestLoop', fp16=True)


def test_plugin_keeps_other_loops_and_float32_loops():
    from fp16utils.migrate.convert import _use_plugin

    cfg = dict(optim_wrapper=dict(type='AmpOptimWrapper', optimizer=dict(type='SGD')),
               val_cfg=dict(type='MultiValLoop', fp16=True), test_cfg=dict(type='TestLoop'))
    _use_plugin(cfg)
    assert cfg['val_cfg'] == dict(type='MultiValLoop', fp16=True)  # mmagic's own stays
    assert cfg['test_cfg'] == dict(type='TestLoop')  # float32 evaluation: MMEngine's
