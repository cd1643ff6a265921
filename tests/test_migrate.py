"""Tests for fp16utils.migrate: config conversion, enable_amp, scan and fix_imports."""

from __future__ import annotations

import ast
import copy
import dataclasses
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp16utils._args.spec import MMCV_LOSS_SCALE
from fp16utils.migrate import (
    ConfigConversionError,
    FileChange,
    Finding,
    MigrationWarning,
    enable_amp,
    fix_imports,
    scan,
)
from fp16utils.migrate import convert_config as _convert_config
from fp16utils.migrate import convert_config_report as _convert_config_report

FIXTURE = Path(__file__).parent / 'fixtures' / 'legacy_codebase'


# The rule tests below follow mmdet 2.x's reading of ``fp16`` (as ``--codebase mmdet``);
# the codebase rules themselves are tested in tests/test_migrate_codebase.py.
def convert_config(cfg, strict=False, plugin=False, codebase='mmdet'):
    return _convert_config(cfg, strict=strict, plugin=plugin, codebase=codebase)


def convert_config_report(cfg, plugin=False, codebase='mmdet'):
    return _convert_config_report(cfg, plugin=plugin, codebase=codebase)


def convert_clean(cfg):
    """convert_config that also asserts the conversion had no problem."""
    new, problems = convert_config_report(cfg)
    assert problems == []
    return new


def optimizer_pass(cfg, codebase='mmdet'):
    """The optimizer pass alone (no schedule or runtime pass): (new config, problems)."""
    from fp16utils.migrate._config_converter import ConfigConverter

    converter = ConfigConverter(cfg, codebase=codebase)
    return converter.run(), converter.problems


def pass_clean(cfg):
    """The optimizer pass alone, asserting it had no problem."""
    new, problems = optimizer_pass(cfg)
    assert problems == []
    return new


# ======================================================================================
# convert_config: one test per rule
# ======================================================================================


def retinanet_fp16_cfg():
    return dict(
        _base_='./retinanet_r50_fpn_1x_coco.py',
        model=dict(type='RetinaNet', backbone=dict(type='ResNet', depth=50)),
        fp16=dict(loss_scale=512.0),
        optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001),
        optimizer_config=dict(type='Fp16OptimizerHook', grad_clip=dict(max_norm=35, norm_type=2)),
        lr_config=dict(policy='step', warmup='linear', warmup_iters=500, step=[8, 11]),
        total_epochs=12,
        log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook')]),
    )


def test_fp16_hook_and_sgd_become_one_amp_optim_wrapper():
    new = pass_clean(retinanet_fp16_cfg())
    assert new['optim_wrapper'] == dict(
        type='AmpOptimWrapper',
        optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001),
        loss_scale=512.0,
        clip_grad=dict(max_norm=35, norm_type=2),
    )
    for gone in ('fp16', 'optimizer', 'optimizer_config'):
        assert gone not in new
    # The wrapper takes the optimizer's place; the rest keeps its order.
    assert list(new) == [
        '_base_',
        'model',
        'optim_wrapper',
        'lr_config',
        'total_epochs',
        'log_config',
    ]


def test_non_fp16_matters_are_kept_untouched():
    cfg = retinanet_fp16_cfg()
    new = pass_clean(cfg)
    for key in ('_base_', 'model', 'lr_config', 'total_epochs', 'log_config'):
        assert new[key] == cfg[key]


def test_plain_optimizer_hook_gives_optim_wrapper_and_drops_grad_clip_none():
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.02, momentum=0.9),
            optimizer_config=dict(type='OptimizerHook', grad_clip=None),
        )
    )
    assert new == dict(
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.02, momentum=0.9))
    )


def test_fp16_optimizer_hook_alone_switches_amp_on_with_mmcv_default_scale():
    # No fp16 key: the hook type alone means fp16; mmcv's default loss_scale is a static 512.
    new = convert_clean(
        dict(optimizer=dict(type='Adam', lr=1e-3), optimizer_config=dict(type='Fp16OptimizerHook'))
    )
    assert new['optim_wrapper'] == dict(
        type='AmpOptimWrapper', optimizer=dict(type='Adam', lr=1e-3), loss_scale=512.0
    )


def test_gradient_cumulative_fp16_hook_gives_accumulative_counts():
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.02),
            optimizer_config=dict(
                type='GradientCumulativeFp16OptimizerHook',
                cumulative_iters=4,
                loss_scale='dynamic',
                grad_clip=dict(max_norm=10),
            ),
        )
    )
    assert new['optim_wrapper'] == dict(
        type='AmpOptimWrapper',
        optimizer=dict(type='SGD', lr=0.02),
        loss_scale='dynamic',
        clip_grad=dict(max_norm=10),
        accumulative_counts=4,
    )


def test_gradient_cumulative_hook_without_fp16_is_a_plain_wrapper():
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.02),
            optimizer_config=dict(type='GradientCumulativeOptimizerHook', cumulative_iters=2),
        )
    )
    assert new['optim_wrapper'] == dict(
        type='OptimWrapper', optimizer=dict(type='SGD', lr=0.02), accumulative_counts=2
    )


@pytest.mark.parametrize(
    'loss_scale, expected',
    [
        (512.0, 512.0),
        (512, 512.0),  # an int is the static scale the user meant
        ('dynamic', 'dynamic'),
        (dict(mode='static', init_scale=256), 256.0),
        (dict(init_scale=512), dict(init_scale=512)),
        (
            dict(mode='dynamic', init_scale=2.0**16, scale_factor=2.0, scale_window=500),
            dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=500),
        ),
        (dict(scale_factor=4.0), dict(growth_factor=4.0, backoff_factor=0.25)),
        (  # already torch GradScaler names: passed through
            dict(init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=10),
            dict(init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=10),
        ),
    ],
)
def test_loss_scale_forms(loss_scale, expected):
    new = convert_clean(dict(optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scale=loss_scale)))
    assert new['optim_wrapper']['loss_scale'] == expected
    assert type(new['optim_wrapper']['loss_scale']) is type(expected)


@given(st.floats(min_value=1.0 + 1e-6, max_value=1e3), st.integers(1, 10**6))
def test_mmcv_scaler_dict_maps_to_grad_scaler_names(scale_factor, scale_window):
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.1),
            fp16=dict(loss_scale=dict(scale_factor=scale_factor, scale_window=scale_window)),
        )
    )
    ls = new['optim_wrapper']['loss_scale']
    assert ls['growth_factor'] == scale_factor
    assert ls['backoff_factor'] == pytest.approx(1 / scale_factor)
    assert ls['growth_interval'] == scale_window
    assert set(ls) == {'growth_factor', 'backoff_factor', 'growth_interval'}


@pytest.mark.parametrize(
    'loss_scale, fragment',
    [
        ('auto', "'auto' is not understood"),
        (-1.0, 'not a usable scale'),
        (True, 'got bool'),
        (dict(mode='sometimes'), "'sometimes' is not 'static' or 'dynamic'"),
        (dict(init_scale=512, window=3), 'fp16.loss_scale.window: not an argument'),
        (dict(scale_factor=0.5), 'scale_factor: 0.5 is not a number > 1'),
        (dict(mode='static', init_scale=64, scale_window=3), "ignored with mode='static'"),
        (dict(mode='static'), 'without init_scale'),
    ],
)
def test_unusable_loss_scales_are_reported_by_key(loss_scale, fragment):
    new, problems = convert_config_report(
        dict(optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scale=loss_scale))
    )
    assert len(problems) == 1
    assert problems[0].startswith('fp16.loss_scale')
    assert fragment in problems[0]
    assert new['optim_wrapper']['type'] == 'AmpOptimWrapper'


def test_conflicting_loss_scales_are_reported_and_fp16_key_wins():
    new, problems = convert_config_report(
        dict(
            optimizer=dict(type='SGD', lr=0.1),
            fp16=dict(loss_scale=512.0),
            optimizer_config=dict(type='Fp16OptimizerHook', loss_scale='dynamic'),
        )
    )
    assert new['optim_wrapper']['loss_scale'] == 512.0
    assert len(problems) == 1 and problems[0].startswith('optimizer_config.loss_scale')


def test_equal_loss_scales_in_fp16_and_hook_are_not_a_problem():
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.1),
            fp16=dict(loss_scale=512.0),
            optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=512),
        )
    )
    assert new['optim_wrapper']['loss_scale'] == 512.0


def test_seed000_runner_fp16_loss_scaler_becomes_amp_wrappers():
    cfg = dict(
        optimizer=dict(
            generator=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-06),
            discriminator=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-06),
        ),
        runner=dict(fp16_loss_scaler=dict(init_scale=512)),
    )
    new = convert_clean(cfg)
    assert 'runner' not in new  # emptied, so removed
    assert new['optim_wrapper'] == dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(
            type='AmpOptimWrapper',
            optimizer=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-06),
            loss_scale=dict(init_scale=512),
        ),
        discriminator=dict(
            type='AmpOptimWrapper',
            optimizer=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-06),
            loss_scale=dict(init_scale=512),
        ),
    )


def test_runner_keeps_its_other_keys():
    new = pass_clean(
        dict(
            optimizer=dict(type='Adam', lr=1e-4),
            runner=dict(
                type='DynamicIterBasedRunner', is_dynamic_ddp=True, fp16_loss_scaler=dict()
            ),
        )
    )
    # An empty scaler dict is falsy: the 0.x runner did not enable fp16 for it.
    assert new['runner'] == dict(type='DynamicIterBasedRunner', is_dynamic_ddp=True)
    assert new['optim_wrapper']['type'] == 'OptimWrapper'


def test_seed003_gan_optimizer_dict_becomes_multi_optim_wrapper_constructor():
    # Seed 003, first table. (Its 1.x column shows lr=0.0002 for the generator; the
    # conversion keeps the user's lr, as the seed's BigGAN table does.)
    cfg = dict(
        optimizer=dict(
            generator=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-6),
            discriminator=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6),
        )
    )
    assert convert_clean(cfg) == dict(
        optim_wrapper=dict(
            constructor='MultiOptimWrapperConstructor',
            generator=dict(optimizer=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-6)),
            discriminator=dict(
                optimizer=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6)
            ),
        )
    )


def test_seed003_biggan_128_comes_out_as_the_seed_shows():
    # The 0.x column of seed 003's BigGAN-128 table, with the optimizer of its first table.
    cfg = dict(
        model=dict(
            type='BasiccGAN',
            generator=dict(
                type='BigGANGenerator',
                output_scale=128,
                noise_size=120,
                num_classes=1000,
                base_channels=96,
                shared_dim=128,
                with_shared_embedding=True,
                sn_eps=1e-6,
                init_type='ortho',
                act_cfg=dict(type='ReLU', inplace=True),
                split_noise=True,
                auto_sync_bn=False,
            ),
            discriminator=dict(
                type='BigGANDiscriminator',
                input_scale=128,
                num_classes=1000,
                base_channels=96,
                sn_eps=1e-6,
                init_type='ortho',
                act_cfg=dict(type='ReLU', inplace=True),
                with_spectral_norm=True,
            ),
            gan_loss=dict(type='GANLoss', gan_type='hinge'),
        ),
        train_cfg=dict(disc_steps=8, gen_steps=1, batch_accumulation_steps=8, use_ema=True),
        optimizer=dict(
            generator=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-6),
            discriminator=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6),
        ),
    )
    # The 1.x column of the same table.
    expected = dict(
        model=dict(
            type='BigGAN',
            num_classes=1000,
            data_preprocessor=dict(type='DataPreprocessor'),
            generator=dict(
                type='BigGANGenerator',
                output_scale=128,
                noise_size=120,
                num_classes=1000,
                base_channels=96,
                shared_dim=128,
                with_shared_embedding=True,
                sn_eps=1e-6,
                init_type='ortho',
                act_cfg=dict(type='ReLU', inplace=True),
                split_noise=True,
                auto_sync_bn=False,
            ),
            discriminator=dict(
                type='BigGANDiscriminator',
                input_scale=128,
                num_classes=1000,
                base_channels=96,
                sn_eps=1e-6,
                init_type='ortho',
                act_cfg=dict(type='ReLU', inplace=True),
                with_spectral_norm=True,
            ),
            generator_steps=1,
            discriminator_steps=1,
        ),
        optim_wrapper=dict(
            constructor='MultiOptimWrapperConstructor',
            generator=dict(
                accumulative_counts=8,
                optimizer=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-6),
            ),
            discriminator=dict(
                accumulative_counts=8,
                optimizer=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6),
            ),
        ),
    )
    # What the seed's 1.x column also changes in the model (type BasiccGAN -> BigGAN,
    # num_classes, data_preprocessor, the built-in loss) are model changes, not fp16
    # ones: convert_config leaves the model as it was apart from the step counts.
    expected['model']['type'] = 'BasiccGAN'
    del expected['model']['num_classes'], expected['model']['data_preprocessor']
    expected['model']['gan_loss'] = dict(type='GANLoss', gan_type='hinge')
    # train_cfg keys that are not the GAN step counts stay.
    expected['train_cfg'] = dict(use_ema=True)

    assert pass_clean(cfg) == expected


def test_gan_multi_optimizer_with_fp16_and_grad_clip_on_each_entry():
    new = convert_clean(
        dict(
            optimizer=dict(generator=dict(type='Adam', lr=1e-4), discriminator=dict(type='SGD')),
            optimizer_config=dict(grad_clip=dict(max_norm=5)),
            fp16=dict(loss_scale='dynamic'),
            train_cfg=dict(disc_steps=4, batch_accumulation_steps=2),
        )
    )
    for name, opt in (
        ('generator', dict(type='Adam', lr=1e-4)),
        ('discriminator', dict(type='SGD')),
    ):
        assert new['optim_wrapper'][name] == dict(
            type='AmpOptimWrapper',
            accumulative_counts=2,
            optimizer=opt,
            loss_scale='dynamic',
            clip_grad=dict(max_norm=5),
        )
    # train_cfg had only step keys: removed; the model receives the 1.x step counts.
    assert 'train_cfg' not in new
    assert new['model'] == dict(generator_steps=1, discriminator_steps=2)


def test_disc_steps_not_divisible_by_accumulation_is_reported_not_silently_floored():
    cfg = dict(
        model=dict(type='BasiccGAN'),
        optimizer=dict(generator=dict(type='Adam'), discriminator=dict(type='Adam')),
        train_cfg=dict(disc_steps=5, gen_steps=1, batch_accumulation_steps=2),
    )
    new, problems = convert_config_report(cfg)
    assert new['model']['discriminator_steps'] == 2
    assert len(problems) == 1
    assert problems[0].startswith('train_cfg.disc_steps')
    assert 'batch_accumulation_steps=2' in problems[0]
    with pytest.raises(ConfigConversionError, match='train_cfg.disc_steps'):
        convert_config(cfg, strict=True)


def test_accumulation_without_any_optimizer_stays_in_train_cfg_and_is_reported():
    new, problems = optimizer_pass(
        dict(_base_='gan.py', train_cfg=dict(disc_steps=2, batch_accumulation_steps=2))
    )
    assert new['train_cfg'] == dict(batch_accumulation_steps=2)
    assert new['model'] == dict(generator_steps=1, discriminator_steps=1)
    assert [p.split(':')[0] for p in problems] == ['train_cfg.batch_accumulation_steps']


def test_paramwise_cfg_moves_next_to_the_optimizer():
    new = convert_clean(
        dict(
            optimizer=dict(
                type='AdamW',
                lr=1e-4,
                paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}),
                constructor='DefaultOptimizerConstructor',
            )
        )
    )
    assert new['optim_wrapper'] == dict(
        type='OptimWrapper',
        optimizer=dict(type='AdamW', lr=1e-4),
        paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}),
    )


def test_unknown_keys_are_kept_untouched():
    cfg = retinanet_fp16_cfg()
    cfg.update(
        custom_imports=dict(imports=['my.module'], allow_failed_imports=False),
        my_own_key=[1, 2, {'x': None}],
        evaluation=dict(interval=1, metric='bbox'),
        workflow=[('train', 1)],
    )
    new = pass_clean(cfg)
    for key in ('custom_imports', 'my_own_key', 'evaluation', 'workflow'):
        assert new[key] == cfg[key]


def test_fp16_none_is_dropped_and_means_no_amp():
    new = convert_clean(dict(optimizer=dict(type='SGD', lr=0.1), fp16=None))
    assert new == dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)))


def test_child_config_without_optimizer_gives_a_partial_wrapper():
    # As an MMEngine child config: merged into the optim_wrapper of its _base_.
    new = convert_clean(dict(_base_='./faster_rcnn.py', fp16=dict(loss_scale=512.0)))
    assert new == dict(
        _base_='./faster_rcnn.py',
        optim_wrapper=dict(type='AmpOptimWrapper', loss_scale=512.0),
    )
    # Without a _base_ there is nowhere for the optimizer to come from: reported.
    _, problems = convert_config_report(dict(fp16=dict(loss_scale=512.0)))
    assert len(problems) == 1 and problems[0].startswith('optimizer: missing')


ALL_CONFIGS = [
    retinanet_fp16_cfg(),
    dict(
        optimizer=dict(generator=dict(type='Adam', lr=1e-4), discriminator=dict(type='Adam')),
        runner=dict(type='DynamicIterBasedRunner', fp16_loss_scaler=dict(init_scale=512)),
        train_cfg=dict(disc_steps=8, gen_steps=1, batch_accumulation_steps=8, use_ema=True),
        model=dict(type='BasiccGAN'),
    ),
    dict(
        optimizer=dict(type='SGD', lr=0.02, paramwise_cfg=dict(norm_decay_mult=0.0)),
        optimizer_config=dict(
            type='GradientCumulativeFp16OptimizerHook',
            cumulative_iters=2,
            loss_scale=dict(scale_factor=2.0, scale_window=100),
            foo='bar',
        ),
    ),
    dict(_base_='x.py', fp16=dict(loss_scale='dynamic')),
]


@pytest.mark.parametrize('cfg', ALL_CONFIGS)
def test_the_input_is_never_mutated(cfg):
    before = copy.deepcopy(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', MigrationWarning)
        new = convert_config(cfg)
    assert cfg == before
    # Nothing in the result is shared with the input.
    new['optim_wrapper'].clear()
    assert cfg == before


@pytest.mark.parametrize('cfg', [c for c in ALL_CONFIGS if not convert_config_report(c)[1]])
def test_converting_a_converted_config_changes_nothing(cfg):
    once, _ = convert_config_report(cfg)
    twice, problems = convert_config_report(once)
    assert twice == once
    assert problems == []


def test_problems_warn_by_default_and_the_result_keeps_unconverted_keys():
    cfg = dict(
        optimizer=dict(type='SGD', lr=0.1),
        optimizer_config=dict(
            type='Fp16OptimizerHook', loss_scale=512.0, coalesce=False, my_flag=1
        ),
    )
    with pytest.warns(MigrationWarning) as record:
        new = convert_config(cfg)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert messages[0].startswith('optimizer_config.coalesce=False')
    assert messages[1].startswith('optimizer_config.my_flag')
    # The unknown argument is not silently dropped: it stays where it was.
    assert new['optimizer_config'] == dict(type='Fp16OptimizerHook', my_flag=1)
    assert new['optim_wrapper']['loss_scale'] == 512.0


def test_strict_raises_a_value_error_naming_the_key():
    cfg = dict(optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scale='auto'))
    with pytest.raises(ConfigConversionError) as info:
        convert_config(cfg, strict=True)
    assert isinstance(info.value, ValueError)
    assert info.value.problems[0].startswith('fp16.loss_scale')
    assert 'fp16.loss_scale' in str(info.value)
    assert 'strict=False' in str(info.value)


def test_strict_on_a_clean_config_returns_the_same_as_the_report():
    cfg = retinanet_fp16_cfg()
    assert convert_config(cfg, strict=True) == convert_config_report(cfg)[0]


def test_default_obsolete_hook_arguments_are_dropped_without_a_word():
    new = convert_clean(
        dict(
            optimizer=dict(type='SGD', lr=0.1),
            optimizer_config=dict(
                type='Fp16OptimizerHook', coalesce=True, bucket_size_mb=-1, distributed=True
            ),
        )
    )
    assert 'optimizer_config' not in new


def test_unknown_optimizer_hook_type_is_left_untouched_and_reported():
    cfg = dict(
        optimizer=dict(type='SGD', lr=0.1),
        optimizer_config=dict(type='MyOptimizerHook', grad_clip=dict(max_norm=1)),
    )
    new, problems = convert_config_report(cfg)
    assert new['optimizer_config'] == cfg['optimizer_config']
    assert 'clip_grad' not in new['optim_wrapper']
    assert len(problems) == 1 and "'MyOptimizerHook'" in problems[0]


def test_unconvertible_optimizer_leaves_every_optimizer_key_alone():
    cfg = dict(
        optimizer=dict(generator=dict(type='Adam'), lr=0.1),
        fp16=dict(loss_scale=512.0),
        optimizer_config=dict(grad_clip=None),
    )
    new, problems = convert_config_report(cfg)
    assert new == cfg
    assert len(problems) == 1 and problems[0].startswith('optimizer:')


def test_existing_optim_wrapper_next_to_0x_keys_is_reported():
    cfg = dict(optim_wrapper=dict(optimizer=dict(type='SGD')), fp16=dict(loss_scale=512.0))
    new, problems = convert_config_report(cfg)
    assert new == cfg
    assert len(problems) == 1 and problems[0].startswith('optim_wrapper:')


def test_apex_amp_runner_flag_is_reported():
    new, problems = optimizer_pass(
        dict(
            optimizer=dict(type='Adam'),
            runner=dict(type='X', use_apex_amp=True, fp16_loss_scaler=None),
        )
    )
    assert new['runner'] == dict(type='X', use_apex_amp=True)
    assert len(problems) == 1 and problems[0].startswith('runner.use_apex_amp')


def test_a_non_dict_config_is_a_type_error():
    with pytest.raises(TypeError, match='expected the config as a dict'):
        convert_config(['optimizer'])  # type: ignore[arg-type]


def test_converted_configs_build_with_build_optim_wrapper():
    import _caps  # tests/ is on sys.path: see conftest.py
    import torch
    from torch import nn

    from fp16utils.optim import build_optim_wrapper

    model = nn.Linear(4, 2)
    single = convert_clean(retinanet_fp16_cfg())
    wrapper = build_optim_wrapper(model, _caps.on_this_cpu(single['optim_wrapper']))
    assert type(wrapper).__name__ == 'AmpOptimWrapper'
    assert isinstance(wrapper.optimizer, torch.optim.SGD)
    assert wrapper.optimizer.param_groups[0]['lr'] == 0.01

    gan = nn.Module()
    gan.generator = nn.Linear(4, 4)
    gan.discriminator = nn.Linear(4, 1)
    multi = convert_clean(
        dict(
            optimizer=dict(
                generator=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-6),
                discriminator=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6),
            ),
            runner=dict(fp16_loss_scaler=dict(init_scale=512)),
            train_cfg=dict(disc_steps=8, gen_steps=1, batch_accumulation_steps=8),
        )
    )
    wrappers = build_optim_wrapper(gan, _caps.on_this_cpu(multi['optim_wrapper']))
    gen, disc = wrappers['generator'], wrappers['discriminator']
    assert type(gen).__name__ == type(disc).__name__ == 'AmpOptimWrapper'
    assert gen.optimizer.param_groups[0]['lr'] == 0.0001
    assert disc.optimizer.param_groups[0]['lr'] == 0.0004
    gen_params = {id(p) for g in gen.optimizer.param_groups for p in g['params']}
    assert gen_params == {id(p) for p in gan.generator.parameters()}

    amp = enable_amp(convert_clean(dict(optimizer=dict(type='SGD', lr=0.1))), dtype='bfloat16')
    assert type(build_optim_wrapper(model, amp['optim_wrapper'])).__name__ == 'AmpOptimWrapper'


# ======================================================================================
# enable_amp
# ======================================================================================


def test_enable_amp_switches_a_single_wrapper():
    cfg = dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)))
    before = copy.deepcopy(cfg)
    new = enable_amp(cfg)
    assert new['optim_wrapper'] == dict(
        type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1), loss_scale='dynamic'
    )
    assert cfg == before


def test_enable_amp_switches_every_entry_of_a_multi_wrapper():
    cfg = convert_clean(
        dict(optimizer=dict(generator=dict(type='Adam'), discriminator=dict(type='Adam')))
    )
    new = enable_amp(cfg, dtype='float16')
    assert new['optim_wrapper']['constructor'] == 'MultiOptimWrapperConstructor'
    for name in ('generator', 'discriminator'):
        assert new['optim_wrapper'][name] == dict(
            optimizer=dict(type='Adam'),
            type='AmpOptimWrapper',
            loss_scale='dynamic',
            dtype='float16',
        )
    assert 'type' not in cfg['optim_wrapper']['generator']


def test_enable_amp_bfloat16_needs_no_loss_scale():
    new = enable_amp(dict(optim_wrapper=dict(optimizer=dict(type='SGD'))), dtype='bfloat16')
    assert new['optim_wrapper'] == dict(
        optimizer=dict(type='SGD'), type='AmpOptimWrapper', dtype='bfloat16'
    )


def test_enable_amp_keeps_an_existing_amp_wrapper_and_warns():
    cfg = dict(
        optim_wrapper=dict(type='AmpOptimWrapper', optimizer=dict(type='SGD'), loss_scale=512.0)
    )
    with pytest.warns(MigrationWarning, match='already an AmpOptimWrapper'):
        new = enable_amp(cfg, dtype='bfloat16')
    assert new == cfg
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no dtype asked for: nothing to warn about
        assert enable_amp(cfg) == cfg


def test_enable_amp_on_a_0x_config_says_to_convert_first():
    with pytest.raises(ValueError, match=r'run convert_config\(cfg\) first') as info:
        enable_amp(dict(optimizer=dict(type='SGD'), fp16=dict(loss_scale=512.0)))
    assert 'optimizer, fp16' in str(info.value)


@pytest.mark.parametrize(
    'cfg, dtype, fragment',
    [
        (dict(optim_wrapper=dict(optimizer=dict(type='SGD'))), 'half', "got 'half'"),
        (
            dict(optim_wrapper=dict(type='ApexOptimWrapper', optimizer=dict(type='SGD'))),
            None,
            "'ApexOptimWrapper'",
        ),
    ],
)
def test_enable_amp_rejects_what_it_cannot_switch(cfg, dtype, fragment):
    with pytest.raises(ValueError, match=fragment):
        enable_amp(cfg, dtype=dtype)


def test_convert_then_enable_amp_is_the_amp_switch_for_a_0x_config():
    cfg = dict(optimizer=dict(type='SGD', lr=0.02), optimizer_config=dict(grad_clip=None))
    new = enable_amp(convert_clean(cfg))
    assert new == dict(
        optim_wrapper=dict(
            type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.02), loss_scale='dynamic'
        )
    )


# ======================================================================================
# scan
# ======================================================================================

EXPECTED_FIXTURE_FINDINGS = [
    ('broken_module.py', 4, 'syntax-error'),
    ('configs/biggan_128x128_fp16.py', 5, 'config-runner-scaler'),
    ('configs/mask_rcnn_cumulative_fp16.py', 2, 'config-optimizer-hook'),
    ('configs/retinanet_r50_fpn_fp16_1x_coco.py', 3, 'config-fp16'),
    ('configs/retinanet_r50_fpn_fp16_1x_coco.py', 5, 'config-optimizer-hook'),
    ('mmdet_like/dense_head.py', 2, 'import'),
    ('mmdet_like/dense_head.py', 10, 'fp16-enabled'),
    ('mmdet_like/dense_head.py', 15, 'decorator'),
    ('mmdet_like/detector.py', 1, 'import'),
    ('mmdet_like/detector.py', 5, 'fp16-enabled'),
    ('mmdet_like/detector.py', 7, 'forward-decorator'),
    ('mmdet_like/detector.py', 9, 'fp16-enabled'),
    ('mmedit_like/demo_module.py', 2, 'import'),
    ('mmedit_like/demo_module.py', 12, 'bare-decorator'),
    ('mmgen_like/train_apis.py', 1, 'module-import'),
    ('mmgen_like/train_apis.py', 2, 'import'),
    ('mmgen_like/train_apis.py', 7, 'attribute-use'),
    ('mmpose_like/head.py', 1, 'star-import'),
    ('mmpose_like/head.py', 2, 'import'),
    ('mmpose_like/head.py', 11, 'fp16-enabled'),
    ('mmseg_like/decode_head.py', 5, 'import'),
    ('mmseg_like/decode_head.py', 14, 'fp16-enabled'),
    ('mmseg_like/decode_head.py', 16, 'decorator'),
    ('mmseg_like/decode_head.py', 20, 'decorator'),
]


def rel(finding: Finding, root: Path = FIXTURE) -> str:
    return Path(finding.path).relative_to(root).as_posix()


def test_scan_finds_every_0x_fp16_usage_in_the_fixture_codebase():
    findings = scan(FIXTURE)
    assert [(rel(f), f.line, f.kind) for f in findings] == EXPECTED_FIXTURE_FINDINGS
    # Clean files (a plain config, a non-mm auto_fp16 import) give nothing.
    assert not any(rel(f) in ('configs/plain_sgd.py', 'utils/clean.py') for f in findings)
    assert findings == sorted(findings, key=lambda f: (f.path, f.line, f.col))


def test_scan_messages_name_the_imported_names_and_modules():
    by_place = {(rel(f), f.line): f for f in scan(FIXTURE)}
    assert by_place['mmdet_like/detector.py', 1].message == (
        'imports auto_fp16, wrap_fp16_model from mmdet.core'
    )
    assert by_place['mmpose_like/head.py', 2].message == (
        'imports LossScaler as PoseScaler, cast_tensor_type from mmpose.core.fp16'
    )
    assert 'mmedit.core.runners.fp16_utils' in by_place['mmedit_like/demo_module.py', 2].message
    assert 'keeping the other names' in by_place['mmdet_like/dense_head.py', 2].suggestion
    assert '512.0' in by_place['configs/retinanet_r50_fpn_fp16_1x_coco.py', 3].message


def test_scan_explains_the_decorator_findings():
    by_kind = {f.kind: f for f in scan(FIXTURE / 'mmdet_like') + scan(FIXTURE / 'mmedit_like')}
    forward = by_kind['forward-decorator']
    assert 'remove' in forward.suggestion and 'AmpOptimWrapper' in forward.suggestion
    assert 'optim_context' in forward.suggestion
    bare = by_kind['bare-decorator']
    assert 'bug' in bare.message and '@auto_fp16()' in bare.suggestion
    assert 'forward()' in bare.message


def test_scan_says_why_module_imports_are_not_fixed():
    (module_import,) = [f for f in scan(FIXTURE) if f.kind == 'module-import']
    assert 'left alone by --fix' in module_import.suggestion
    assert 'attribute' in module_import.suggestion
    assert 'fp16_utils' in module_import.message


def test_scan_of_one_file_and_columns_in_characters(tmp_path):
    target = tmp_path / 'mod.py'
    target.write_text("x = 'été'; self.fp16_enabled = True\n", encoding='utf-8')
    (finding,) = scan(target)
    assert (finding.line, finding.col, finding.kind) == (1, 12, 'fp16-enabled')
    assert finding.path == str(target)


def test_scan_skips_hidden_pycache_and_virtualenv_dirs(tmp_path):
    line = 'from mmcv.runner import auto_fp16\n'
    for sub in ('.git', '.hidden', '__pycache__', 'venv', 'myenv', 'pkg'):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / 'mod.py').write_text(line)
    (tmp_path / 'myenv' / 'pyvenv.cfg').write_text('home = /usr/bin\n')
    (tmp_path / 'pkg' / 'notes.txt').write_text(line)
    findings = scan(tmp_path)
    assert [(rel(f, tmp_path), f.kind) for f in findings] == [('pkg/mod.py', 'import')]


def test_scan_reports_syntax_errors_and_goes_on(tmp_path):
    (tmp_path / 'a_bad.py').write_text('def f(:\n')
    (tmp_path / 'b_good.py').write_text('from mmdet.core.fp16 import force_fp32\n')
    (tmp_path / 'c_bytes.py').write_bytes(b'x = "\xff"\n')  # not UTF-8
    kinds = [(rel(f, tmp_path), f.kind) for f in scan(tmp_path)]
    assert kinds == [
        ('a_bad.py', 'syntax-error'),
        ('b_good.py', 'import'),
        ('c_bytes.py', 'unreadable'),
    ]


def test_scan_ignores_non_mm_modules_and_relative_imports(tmp_path):
    (tmp_path / 'm.py').write_text(
        'from mylib.runner import auto_fp16\nfrom .fp16_utils import force_fp32\n'
        'from mmengine.runner import LossScaler\nimport mmcv\n'
    )
    assert scan(tmp_path) == []


def test_scan_of_a_missing_path_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match='neither a file nor a directory'):
        scan(tmp_path / 'nope')


def test_findings_are_frozen():
    finding = scan(FIXTURE / 'mmdet_like' / 'detector.py')[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.line = 3  # type: ignore[misc]
    assert str(finding).endswith(': [import] imports auto_fp16, wrap_fp16_model from mmdet.core')


# ======================================================================================
# fix_imports
# ======================================================================================


@pytest.fixture
def codebase(tmp_path):
    root = tmp_path / 'legacy_codebase'
    shutil.copytree(FIXTURE, root)
    return root


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob('*'))
        if p.is_file()
    }


def test_fix_rewrites_only_the_fp16_imports_of_the_fixture(codebase):
    changes = fix_imports(codebase)
    assert all(isinstance(c, FileChange) for c in changes)
    changed = sorted(Path(c.path).relative_to(codebase).as_posix() for c in changes if c.changed)
    assert changed == [
        'mmdet_like/dense_head.py',
        'mmdet_like/detector.py',
        'mmedit_like/demo_module.py',
        'mmgen_like/train_apis.py',
        'mmpose_like/head.py',
        'mmseg_like/decode_head.py',
    ]
    # Every fixable import is gone; what --fix leaves alone is still reported.
    kinds = [(rel(f, codebase), f.kind) for f in scan(codebase)]
    assert ('mmgen_like/train_apis.py', 'module-import') in kinds
    assert ('mmpose_like/head.py', 'star-import') in kinds
    assert [k for k in kinds if k[1] == 'import'] == []
    # The syntax-error file is skipped, with the reason.
    (broken,) = [c for c in changes if c.path.endswith('broken_module.py')]
    assert not broken.changed and 'cannot parse' in (broken.error or '')
    assert (codebase / 'broken_module.py').read_bytes() == (
        FIXTURE / 'broken_module.py'
    ).read_bytes()


def test_fix_splits_a_mixed_import_and_keeps_comments(codebase):
    fix_imports(codebase)
    assert (codebase / 'mmdet_like' / 'dense_head.py').read_text().splitlines()[:3] == [
        'import torch.nn as nn',
        'from mmcv.runner import BaseModule  # base class and fp32 losses',
        'from fp16utils import force_fp32',
    ]
    assert (codebase / 'mmseg_like' / 'decode_head.py').read_text(encoding='utf-8') == (
        (FIXTURE / 'mmseg_like' / 'decode_head.py')
        .read_text(encoding='utf-8')
        .replace(
            '                         auto_fp16,\n                         force_fp32)\n',
            '                         )\nfrom fp16utils import auto_fp16, force_fp32\n',
        )
    )
    # Only-fp16 imports keep their layout and aliases; only the module changes.
    assert (codebase / 'mmpose_like' / 'head.py').read_text().splitlines()[1] == (
        'from fp16utils import LossScaler as PoseScaler, cast_tensor_type'
    )


def outside_imports(source: str) -> list[str]:
    """The lines of a file that belong to no import statement."""
    inside = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            inside.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [line for no, line in enumerate(source.splitlines(), 1) if no not in inside]


def test_fix_leaves_every_other_line_as_it_was(codebase):
    fix_imports(codebase)
    for path in FIXTURE.rglob('*.py'):
        if path.name == 'broken_module.py':
            continue
        old = path.read_text(encoding='utf-8')
        new = (codebase / path.relative_to(FIXTURE)).read_text(encoding='utf-8')
        assert outside_imports(new) == outside_imports(old), path


def test_fix_is_idempotent(codebase):
    first = fix_imports(codebase)
    assert any(c.changed for c in first)
    after_first = {p: data for p, (data, _) in snapshot(codebase).items()}
    second = fix_imports(codebase)
    assert not any(c.changed for c in second)
    assert all(c.diff == '' for c in second)
    assert {p: data for p, (data, _) in snapshot(codebase).items()} == after_first


def test_dry_run_writes_nothing_and_returns_the_same_diffs(codebase):
    before = snapshot(codebase)
    dry = fix_imports(codebase, dry_run=True)
    assert snapshot(codebase) == before  # bytes and mtimes
    real = fix_imports(codebase)
    assert [(c.path, c.diff, c.changed) for c in dry] == [(c.path, c.diff, c.changed) for c in real]
    (detector,) = [c for c in dry if c.path.endswith('detector.py')]
    assert '-from mmdet.core import auto_fp16, wrap_fp16_model\n' in detector.diff
    assert '+from fp16utils import auto_fp16, wrap_fp16_model\n' in detector.diff
    assert detector.diff.startswith('--- ')


def imported(source: str) -> dict[str, list[str]]:
    """module -> names imported from it (with 'as' aliases), in order."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            out.setdefault(node.module or '', []).extend(
                a.name if a.asname is None else f'{a.name} as {a.asname}' for a in node.names
            )
    return out


@pytest.mark.parametrize(
    'source, expected',
    [
        (
            'from mmcv.runner import auto_fp16, BaseModule\n',
            'from mmcv.runner import BaseModule\nfrom fp16utils import auto_fp16\n',
        ),
        (
            'from mmcv.runner import BaseModule, force_fp32 as f32, load_checkpoint  # x\n',
            'from mmcv.runner import BaseModule, load_checkpoint  # x\n'
            'from fp16utils import force_fp32 as f32\n',
        ),
        (
            'from mmcv.runner import (BaseModule, auto_fp16)\n',
            'from mmcv.runner import (BaseModule)\nfrom fp16utils import auto_fp16\n',
        ),
        (
            'from mmcv.runner import (\n    auto_fp16,  # casts\n    BaseModule,\n)\n',
            'from mmcv.runner import (\n    # casts\n    BaseModule,\n)\n'
            'from fp16utils import auto_fp16\n',
        ),
        (
            'from mmcv.runner import (BaseModule,\n'
            '                         Fp16OptimizerHook, OptimizerHook,\n'
            '                         wrap_fp16_model)\n',
            'from mmcv.runner import (BaseModule,\n'
            '                         OptimizerHook,\n'
            '                         )\n'
            'from fp16utils import Fp16OptimizerHook, wrap_fp16_model\n',
        ),
        (
            'from mmcv.runner import BaseModule, \\\n    auto_fp16\n',
            'from mmcv.runner import BaseModule\nfrom fp16utils import auto_fp16\n',
        ),
        (
            'try:\n    from mmcv.runner import auto_fp16, BaseModule\nexcept ImportError:\n'
            '    pass\n',
            'try:\n    from mmcv.runner import BaseModule\n    from fp16utils import auto_fp16\n'
            'except ImportError:\n    pass\n',
        ),
        (
            'import os; from mmcv.runner import auto_fp16, BaseModule; x = 1\n',
            'import os; from mmcv.runner import BaseModule; from fp16utils import auto_fp16; '
            'x = 1\n',
        ),
        (
            'x = 1\nfrom mmcv.runner import BaseModule, auto_fp16',
            'x = 1\nfrom mmcv.runner import BaseModule\nfrom fp16utils import auto_fp16',
        ),
        (
            'from mmcv.runner import (  # fp16 tools\n    auto_fp16, force_fp32)\n',
            'from fp16utils import (  # fp16 tools\n    auto_fp16, force_fp32)\n',
        ),
    ],
    ids=[
        'one-line',
        'alias-and-comment',
        'parens-one-line',
        'parens-comment-kept',
        'parens-several-lines',
        'backslash',
        'indented',
        'semicolons',
        'no-final-newline',
        'only-fp16-names',
    ],
)
def test_fix_import_forms(tmp_path, source, expected):
    path = tmp_path / 'mod.py'
    path.write_text(source)
    (change,) = fix_imports(path)
    assert change.changed
    result = path.read_text()
    assert result == expected
    names_before = imported(source)
    names_after = imported(result)
    moved = [
        n
        for n in names_before.get('mmcv.runner', [])
        if n.split(' ')[0] in ('auto_fp16', 'force_fp32', 'Fp16OptimizerHook', 'wrap_fp16_model')
    ]
    assert names_after['fp16utils'] == moved
    assert names_after.get('mmcv.runner', []) == [
        n for n in names_before['mmcv.runner'] if n not in moved
    ]
    assert not any(c.changed for c in fix_imports(path))


def test_fix_keeps_crlf_line_endings(tmp_path):
    path = tmp_path / 'mod.py'
    path.write_bytes(b'import os\r\nfrom mmcv.runner import auto_fp16, BaseModule\r\nx = 1\r\n')
    fix_imports(path)
    assert path.read_bytes() == (
        b'import os\r\nfrom mmcv.runner import BaseModule\r\nfrom fp16utils import auto_fp16\r\n'
        b'x = 1\r\n'
    )


def test_fix_keeps_the_file_encoding(tmp_path):
    latin = tmp_path / 'latin.py'
    latin.write_bytes(
        b'# -*- coding: latin-1 -*-\n# \xe9t\xe9\nfrom mmcv.runner import BaseModule, auto_fp16\n'
    )
    bom = tmp_path / 'bom.py'
    bom.write_bytes(b'\xef\xbb\xbfs = "\xc3\xa9"; from mmcv.runner import force_fp32\n')
    fix_imports(tmp_path)
    assert latin.read_bytes() == (
        b'# -*- coding: latin-1 -*-\n# \xe9t\xe9\nfrom mmcv.runner import BaseModule\n'
        b'from fp16utils import auto_fp16\n'
    )
    assert bom.read_bytes() == b'\xef\xbb\xbfs = "\xc3\xa9"; from fp16utils import force_fp32\n'


def test_fix_leaves_module_and_star_imports_alone(tmp_path):
    path = tmp_path / 'mod.py'
    source = (
        'import mmcv.runner.fp16_utils as f\nfrom mmcv.runner.fp16_utils import *\n'
        'from mmcv.runner import fp16_utils\n\n@f.auto_fp16()\ndef forward(self, x):\n'
        '    return fp16_utils.cast_tensor_type(x, None, None)\n'
    )
    path.write_text(source)
    (change,) = fix_imports(path)
    assert not change.changed and change.diff == ''
    assert path.read_text() == source
    kinds = [f.kind for f in scan(path)]
    assert kinds == [
        'module-import',
        'star-import',
        'module-import',
        'forward-decorator',
        'attribute-use',
    ]


def test_fixed_code_runs_without_mmcv(tmp_path):
    (tmp_path / 'head.py').write_text(
        'import torch\nfrom torch import nn\n'
        'from mmcv.runner import force_fp32, auto_fp16\n\n\n'
        'class Head(nn.Module):\n'
        '    def __init__(self):\n'
        '        super().__init__()\n'
        '        self.fp16_enabled = True\n\n'
        '    @auto_fp16(apply_to=("x",), out_fp32=True)\n'
        '    def forward(self, x):\n'
        '        return x * 2\n\n'
        '    @force_fp32()\n'
        '    def loss(self, y):\n'
        '        return y.dtype\n\n\n'
        'print(Head()(torch.ones(2)).dtype, Head().loss(torch.ones(2, dtype=torch.half)))\n'
    )
    fix_imports(tmp_path)
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get('PYTHONPATH')]))
    )
    done = subprocess.run(
        [sys.executable, 'head.py'], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['torch.float32', 'torch.float32']


FP16_SAMPLE = ['auto_fp16', 'force_fp32', 'wrap_fp16_model', 'LossScaler', 'Fp16OptimizerHook']
OTHER_SAMPLE = ['BaseModule', 'load_checkpoint', 'OptimizerHook', 'get_dist_info']


@st.composite
def import_statements(draw):
    names = draw(
        st.lists(st.sampled_from(FP16_SAMPLE + OTHER_SAMPLE), min_size=1, max_size=6, unique=True)
    )
    aliases = [n + draw(st.sampled_from(['', ' as x_' + n])) for n in names]
    layout = draw(st.sampled_from(['line', 'parens', 'per-line', 'grouped', 'backslash']))
    comment = draw(st.sampled_from(['', '  # note']))
    if layout == 'line':
        body = ', '.join(aliases) + comment
    elif layout == 'parens':
        body = '(' + ', '.join(aliases) + ')' + comment
    elif layout == 'per-line':
        trailing = draw(st.booleans())
        items = [f'    {a},{comment}' for a in aliases]
        if not trailing:
            items[-1] = items[-1].replace(',', '', 1)
        body = '(\n' + '\n'.join(items) + '\n)'
    elif layout == 'grouped':
        half = max(1, len(aliases) // 2)
        first, rest = ', '.join(aliases[:half]), ', '.join(aliases[half:])
        if rest:
            body = f'({first},{comment}\n        {rest})'
        else:
            body = f'({first}){comment}'
    else:
        body = ', \\\n    '.join(aliases)
    indent = draw(st.sampled_from(['', '    ']))
    stmt = f'from mmcv.runner import {body}'
    stmt = '\n'.join(indent + line for line in stmt.split('\n'))
    head = 'if True:\n' if indent else ''
    return f'import os\n{head}{stmt}\n{indent}value = 1  # kept\n', names, aliases


@given(import_statements())
def test_fix_always_yields_valid_code_with_the_same_names(tmp_path_factory, case):
    source, names, aliases = case
    path = tmp_path_factory.mktemp('prop') / 'mod.py'
    path.write_text(source)
    fix_imports(path)
    result = path.read_text()
    found = imported(result)  # parses, or fails the test
    moved = [a for n, a in zip(names, aliases) if n in FP16_SAMPLE]
    kept = [a for n, a in zip(names, aliases) if n not in FP16_SAMPLE]
    if not kept:
        assert found == {'fp16utils': moved}
    elif not moved:
        assert result == source
    else:
        assert found == {'mmcv.runner': kept, 'fp16utils': moved}
    assert outside_imports(result) == outside_imports(source)
    assert not any(c.changed for c in fix_imports(path))


# --------------------------------------------------------------- no torch


def test_import_migrate_leaves_torch_out_of_a_fresh_interpreter():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), *filter(None, [os.environ.get('PYTHONPATH')])]))
    code = ('import sys, fp16utils.migrate as m\n'
            'print(m.__file__)\n'
            'print(sorted(n for n in sys.modules if "torch" in n or n.startswith("numpy")))')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path, heavy = proc.stdout.splitlines()
    assert Path(path) == root / 'fp16utils' / 'migrate' / '__init__.py'
    assert heavy == '[]'


@pytest.mark.parametrize('loss_scale, needle', [
    (dict(mode='dynamic', scale_window=0), '(scale_window) must be a whole number >= 1'),
    (dict(init_scale=float('inf')), 'init_scale must be a finite number > 0'),
    (dict(growth_factor=2.0, backoff_factor=2.0), 'backoff_factor'),
])
def test_a_loss_scale_the_wrappers_would_refuse_is_reported_by_the_conversion(loss_scale, needle):
    """The conversion reads loss_scale as the wrappers do, so it cannot pass a bad one."""
    _, problems = convert_config_report(dict(
        optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scale=loss_scale)))
    assert len(problems) == 1 and needle in problems[0], problems
    import torch

    from fp16utils.optim import build_optim_wrapper
    with pytest.raises(ValueError, match='loss_scale'):
        build_optim_wrapper(torch.nn.Linear(1, 1), dict(
            type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1), loss_scale=loss_scale))


def test_loss_scale_translation_lives_in_its_module():
    from fp16utils.migrate import _config_converter, _loss_scale

    problems = []
    assert _loss_scale.convert_loss_scale(
        dict(mode='dynamic', init_scale=256, scale_factor=4., scale_window=100),
        'fp16.loss_scale', problems) == dict(init_scale=256, growth_factor=4.,
                                             backoff_factor=0.25, growth_interval=100)
    assert problems == []
    assert _config_converter.convert_loss_scale is _loss_scale.convert_loss_scale
    assert MMCV_LOSS_SCALE == 512.0
    new = convert_clean(dict(optimizer=dict(type='SGD', lr=0.1),
                             optimizer_config=dict(type='Fp16OptimizerHook')))
    assert new['optim_wrapper']['loss_scale'] == MMCV_LOSS_SCALE


# ======================================================================================
# enable_amp on the plug-in's names; misspelt fp16 keys
# ======================================================================================


@pytest.mark.parametrize('dtype', [None, 'bfloat16', 'auto'])
def test_enable_amp_switches_the_plugin_wrapper_to_the_plugin_amp_wrapper(dtype):
    cfg = convert_config(dict(optimizer=dict(type='SGD', lr=0.1)), plugin=True)
    new = enable_amp(cfg, dtype)
    wrapper = new['optim_wrapper']
    assert wrapper['type'] == 'Fp16utilsAmpOptimWrapper'
    assert wrapper['constructor'] == 'Fp16utilsOptimWrapperConstructor'
    assert wrapper.get('dtype') == dtype
    assert wrapper.get('loss_scale') == (None if dtype == 'bfloat16' else 'dynamic')
    assert new['custom_imports'] == cfg['custom_imports']


def test_enable_amp_keeps_a_plugin_config_that_already_trains_in_fp16():
    cfg = convert_config(dict(optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scale=512.)),
                         plugin=True)
    with pytest.warns(MigrationWarning, match="already an AmpOptimWrapper.*'bfloat16' not"):
        new = enable_amp(cfg, 'bfloat16')
    assert new == cfg and new['optim_wrapper']['loss_scale'] == 512.


def test_enable_amp_on_plugin_gan_wrappers_switches_each_entry():
    cfg = convert_config(dict(optimizer=dict(generator=dict(type='Adam', lr=1e-4),
                                             discriminator=dict(type='Adam', lr=4e-4))),
                         plugin=True)
    new = enable_amp(cfg)
    assert new['optim_wrapper']['constructor'] == 'Fp16utilsMultiOptimWrapperConstructor'
    for name in ('generator', 'discriminator'):
        assert new['optim_wrapper'][name]['type'] == 'Fp16utilsAmpOptimWrapper'


def test_migrate_names_a_misspelt_fp16_key_and_the_closest_accepted_one():
    cfg = dict(optimizer=dict(type='SGD', lr=0.1), fp16=dict(loss_scal=512.))
    new, problems = convert_config_report(cfg)
    assert len(problems) == 1
    assert "fp16 got the unknown key 'loss_scal' (did you mean 'loss_scale'?)" in problems[0]
    assert 'dropped with the fp16 key' in problems[0]
    assert 'fp16' not in new  # MMEngine ignores the key: never written back


def test_scan_names_a_misspelt_fp16_key_instead_of_the_default_scale(tmp_path):
    (tmp_path / 'cfg.py').write_text("fp16 = dict(loss_scal=512., grad_clip=None)\n")
    (finding,) = scan(tmp_path)
    assert finding.kind == 'config-fp16'
    assert "unknown key 'loss_scal' (did you mean 'loss_scale'?)" in finding.message
    assert 'default 512' not in finding.message and "'grad_clip'" not in finding.message


def test_fp16_hook_args_list_is_the_hooks_signature():
    import inspect

    from fp16utils import Fp16OptimizerHook
    from fp16utils._args.keys import FP16_HOOK_ARGS

    params = inspect.signature(Fp16OptimizerHook).parameters
    assert set(FP16_HOOK_ARGS) == {n for n, p in params.items() if p.kind != p.VAR_KEYWORD}


# ======================================================================================
# the private helpers: the conversion pass, source files, file names in messages
# ======================================================================================


def test_the_conversion_pass_keeps_what_it_cannot_convert_and_lists_it():
    from fp16utils.migrate._config_converter import ConfigConverter

    converter = ConfigConverter(dict(optimizer=dict(type='SGD', lr=0.1),
                                     fp16=dict(loss_scale='huge')), codebase='mmdet')
    new = converter.run()
    assert new['optim_wrapper']['loss_scale'] == 'huge'
    assert len(converter.problems) == 1 and converter.problems[0].startswith('fp16.loss_scale')
    converter = ConfigConverter(dict(optimizer=dict(type='SGD', lr=0.1), fp16=None))
    assert converter.run() == {'optim_wrapper': {'type': 'OptimWrapper', 'optimizer': {
        'type': 'SGD', 'lr': 0.1}}}
    assert converter.problems == []


def test_source_files_name_modules_and_map_ast_columns_to_characters(tmp_path):
    from fp16utils.migrate import _source_files as sf

    assert (sf.is_mm_module('mmdet.core'), sf.is_mm_module('torch.nn'),
            sf.is_mm_module(None)) == (True, False, False)
    assert (sf.is_fp16_module('mmcv.runner.fp16_utils'),
            sf.is_fp16_module('mmcv.runner')) == (True, False)
    assert sf.alias_text(ast.parse('from m import a as b').body[0].names[0]) == 'a as b'
    assert sf.os_reason(PermissionError(13, 'Permission denied', 'x.py')) == 'Permission denied'
    f = tmp_path / 'm.py'
    f.write_bytes('s = "é"; x = 1\r\n'.encode())
    src = sf.Source(str(f))
    assert (src.encoding, src.lines, src.char_col(1, 12)) == ('utf-8', ['s = "é"; x = 1\r\n'], 11)
    f.write_text('def f(:\n')
    src, tree, why = sf.load_source(str(f))
    assert tree is None and why.line == 1 and why.message.startswith('cannot parse the file')
    assert why.kind == 'syntax-error'
    assert sf.unreadable('cannot read the file: Permission denied').kind == 'unreadable'


def test_a_file_name_the_terminal_cannot_show_is_quoted_for_the_shell():
    from fp16utils.migrate.errors import shown_path

    assert shown_path('cfg.py') == 'cfg.py'
    assert shown_path(b'caf\xe9.py') == "$'caf\\xe9.py'"
