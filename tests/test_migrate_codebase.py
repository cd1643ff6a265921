"""Tests for the codebase-aware parts of ``fp16utils migrate``: telling the codebase,
reading ``fp16`` by its rules, mmedit's ``optimizers``, named constructors, and the notes
on values whose meaning changes (``'dynamic'``, ``--faithful``)."""

from __future__ import annotations

import pytest

from fp16utils.migrate import migrate_config
from fp16utils.migrate._codebase import CODEBASES, FP16_RULES, find_codebase
from fp16utils.migrate._config_converter import ConfigConverter

SGD = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001)


#: Why the MMEngine parts skip in the main suite.
NO_MMENGINE = 'mmengine is not installed here (.ci/mmengine runs this test)'

def convert(cfg, codebase=None, path=None, faithful=False):
    """The optimizer pass alone: (new config, problems, notes, test_fp16)."""
    converter = ConfigConverter(cfg, codebase=find_codebase(cfg, codebase, path),
                                faithful=faithful)
    new = converter.run()
    return new, converter.problems, converter.notes, converter.test_fp16


# ---------------------------------------------------------------- telling the codebase


@pytest.mark.parametrize('path, expected', [
    ('/site-packages/mmdet/.mim/configs/retinanet/retinanet_r50_fpn_fp16_1x_coco.py', 'mmdet'),
    ('/src/mmdetection/configs/fp16/retinanet_r50_fpn_fp16_1x_coco.py', 'mmdet'),
    ('/src/mmsegmentation-0.30.0/configs/convnext/x.py', 'mmseg'),
    ('/w/mmsegmentation-0.30.0-py3-none-any/mmseg/.mim/configs/mae/x.py', 'mmseg'),
    ('mmclassification/configs/resnet/resnet50_8xb32-fp16_in1k.py', 'mmcls'),
    ('/x/mmediting/configs/restorers/srcnn/srcnn.py', 'mmedit'),
    ('/x/mmgen-0.7.3/mmgen/.mim/configs/styleganv2/a.py', 'mmgen'),
    ('/x/mmdetection3d/configs/pointpillars/a.py', 'mmdet3d'),
    ('/x/mmpose/configs/body/a.py', 'mmpose'),
    ('/home/me/experiments/configs/a.py', None),
    ('/home/me/mmdet_experiments/configs/a.py', None),  # not a codebase's folder
])
def test_the_codebase_is_told_from_the_nearest_folder_that_names_one(path, expected):
    assert find_codebase({}, None, path) == expected


@pytest.mark.parametrize('cfg, expected', [
    (dict(model=dict(type='EncoderDecoder')), 'mmseg'),
    (dict(model=dict(type='CascadeEncoderDecoder')), 'mmseg'),
    (dict(model=dict(type='ImageClassifier')), 'mmcls'),
    (dict(model=dict(type='RetinaNet')), 'mmdet'),
    (dict(model=dict(type='BasicRestorer')), 'mmedit'),
    (dict(model=dict(type='StaticUnconditionalGAN')), 'mmgen'),
    (dict(model=dict(type='CycleGAN'), optimizer=dict(generators=SGD)), 'mmgen'),
    (dict(model=dict(type='CycleGAN'), optimizers=dict(generators=SGD)), 'mmedit'),
    (dict(data=dict(train=dict(type='RepeatDataset', dataset=dict(type='ADE20KDataset')))),
     'mmseg'),
    (dict(data=dict(train=dict(type='CocoDataset'))), 'mmdet'),
    (dict(data=dict(train=dict(type='CityscapesDataset'))), None),  # in mmdet and mmseg
    (dict(model=dict(type='MyOwnDetector')), None),
])
def test_the_codebase_is_told_from_the_model_then_the_dataset_type(cfg, expected):
    assert find_codebase(cfg, None, None) == expected


def test_an_explicit_codebase_wins_and_an_unknown_name_is_refused():
    path = '/src/mmdetection/configs/a.py'
    assert find_codebase(dict(model=dict(type='EncoderDecoder')), 'mmcls', path) == 'mmcls'
    with pytest.raises(ValueError, match=r"codebase: 'mmfoo' is not one of mmdet, mmseg"):
        find_codebase({}, 'mmfoo', None)
    assert set(CODEBASES) >= {'mmdet', 'mmseg', 'mmcls', 'mmedit', 'mmgen', 'mmdet3d',
                              'mmocr', 'mmpose', 'mmrotate'}


# ---------------------------------------------------------------- fp16 by the codebase's rules


def test_mmdet_fp16_trains_in_amp_and_tests_in_half_and_the_key_is_dropped():
    cfg = dict(optimizer=SGD, optimizer_config=dict(grad_clip=None), fp16=dict(loss_scale=512.))
    new, problems, notes, test_fp16 = convert(cfg, 'mmdet')
    assert new == {'optim_wrapper': dict(type='AmpOptimWrapper', optimizer=SGD,
                                         loss_scale=512.0)}
    assert (problems, notes, test_fp16) == ([], [], True)


def test_mmseg_fp16_with_a_plain_hook_stays_float32_with_a_note():
    cfg = dict(model=dict(type='EncoderDecoder'), optimizer=SGD, optimizer_config=dict(),
               fp16=dict(loss_scale='dynamic'))
    new, problems, notes, test_fp16 = convert(cfg)
    assert new['optim_wrapper'] == dict(type='OptimWrapper', optimizer=SGD)
    assert 'fp16' not in new and problems == [] and test_fp16 is True
    (note,) = notes
    assert note.startswith('fp16: mmseg 0.x training does not read fp16')
    assert 'trained in float32 and optim_wrapper stays OptimWrapper' in note
    assert 'val_cfg/test_cfg fp16=True' in note


def test_mmseg_fp16_hook_trains_in_amp_and_the_fp16_placeholder_only_tests_in_half():
    cfg = dict(optimizer=SGD, fp16=dict(),
               optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=256.))
    new, problems, notes, test_fp16 = convert(cfg, 'mmseg')
    assert new == {'optim_wrapper': dict(type='AmpOptimWrapper', optimizer=SGD,
                                         loss_scale=256.0)}
    assert problems == [] and test_fp16 is True
    assert len(notes) == 1 and 'mixed precision here comes from optimizer_config' in notes[0]


def test_mmseg_ignores_the_fp16_loss_scale_and_reads_the_hooks():
    cfg = dict(optimizer=SGD, fp16=dict(loss_scale=512.),
               optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=64.))
    new, problems, notes, _ = convert(cfg, 'mmseg')
    assert new['optim_wrapper']['loss_scale'] == 64.0 and problems == []
    assert 'its loss_scale was not used' in notes[0]


@pytest.mark.parametrize('codebase', ['mmedit', 'mmgen'])
def test_mmedit_and_mmgen_ignore_fp16_entirely(codebase):
    cfg = dict(optimizer=SGD, fp16=dict(loss_scale=512.))
    new, problems, notes, test_fp16 = convert(cfg, codebase)
    assert new == {'optim_wrapper': dict(type='OptimWrapper', optimizer=SGD)}
    assert problems == [] and test_fp16 is False
    assert 'its tools/test.py ignored it too' in notes[0]


def test_mmcls_fp16_trains_in_amp_and_tests_in_half():
    cfg = dict(optimizer=SGD, optimizer_config=dict(grad_clip=None), fp16=dict(loss_scale=512.))
    new, problems, notes, test_fp16 = convert(cfg, 'mmcls')
    assert new['optim_wrapper']['type'] == 'AmpOptimWrapper'
    assert (problems, notes, test_fp16) == ([], [], True)


def test_an_unknown_codebase_keeps_the_amp_reading_and_says_to_pass_codebase():
    cfg = dict(optimizer=SGD, fp16=dict(loss_scale=512.))
    new, problems, notes, test_fp16 = convert(cfg)
    assert new['optim_wrapper']['type'] == 'AmpOptimWrapper' and test_fp16 is True
    assert problems == []  # the usual reading: said, but --strict does not fail on it
    note = next(n for n in notes if n.startswith('fp16: the codebase could not be told'))
    assert 'mmseg 0.x training ignores it' in note and 'pass --codebase' in note


def test_no_fp16_key_means_no_test_time_half_precision():
    assert convert(dict(optimizer=SGD), 'mmdet')[3] is False
    assert convert(dict(optimizer=SGD, fp16=None), 'mmdet')[3] is False


def test_mmdet3d_segmentors_follow_the_mmseg_rule():
    cfg = dict(model=dict(type='EncoderDecoder3D'), optimizer=SGD, fp16=dict(loss_scale=512.))
    new, _, notes, _ = convert(cfg, 'mmdet3d')
    assert new['optim_wrapper']['type'] == 'OptimWrapper'
    assert 'train_segmentor' in notes[0]
    cfg['model'] = dict(type='VoxelNet')
    assert convert(cfg, 'mmdet3d')[0]['optim_wrapper']['type'] == 'AmpOptimWrapper'


def test_every_codebase_has_a_rule():
    assert set(FP16_RULES) == set(CODEBASES)


# ---------------------------------------------------------------- values whose meaning changes


def test_dynamic_is_kept_with_a_note_giving_both_meanings_and_the_faithful_form():
    cfg = dict(optimizer=SGD, fp16=dict(loss_scale='dynamic'))
    new, problems, notes, _ = convert(cfg, 'mmdet')
    assert new['optim_wrapper']['loss_scale'] == 'dynamic' and problems == []
    (note,) = notes
    assert note.startswith("fp16.loss_scale: 'dynamic' kept as optim_wrapper loss_scale")
    assert 'init_scale 2**16, growth_interval 2000' in note
    assert 'init_scale 2**32, scale factor 2, scale_window 1000' in note
    assert 'dict(init_scale=2.**32, growth_interval=1000)' in note


def test_faithful_writes_mmcv_numbers_for_dynamic():
    cfg = dict(optimizer=SGD, optimizer_config=dict(type='Fp16OptimizerHook',
                                                    loss_scale='dynamic'))
    new, problems, notes, _ = convert(cfg, 'mmseg', faithful=True)
    assert new['optim_wrapper']['loss_scale'] == {'init_scale': 2.0 ** 32,
                                                  'growth_interval': 1000}
    assert problems == [] and '(--faithful)' in notes[0]


def test_an_mmcv_scaler_dict_missing_its_defaults_is_noted_or_filled_in():
    scale = dict(mode='dynamic', scale_factor=2.)
    cfg = dict(optimizer=SGD, fp16=dict(loss_scale=scale))
    new, problems, notes, _ = convert(cfg, 'mmdet')
    assert new['optim_wrapper']['loss_scale'] == dict(growth_factor=2.0, backoff_factor=0.5)
    assert problems == [] and 'leaves out init_scale, growth_interval' in notes[0]
    new, _, notes, _ = convert(cfg, 'mmdet', faithful=True)
    assert new['optim_wrapper']['loss_scale'] == dict(
        init_scale=2.0 ** 32, growth_factor=2.0, backoff_factor=0.5, growth_interval=1000)
    # A complete dict changes nothing: no note.
    full = dict(mode='dynamic', init_scale=1024., scale_window=500)
    assert convert(dict(optimizer=SGD, fp16=dict(loss_scale=full)), 'mmdet')[2] == []


def test_grad_scaler_arguments_keep_their_meaning_without_a_note():
    cfg = dict(optimizer=dict(generator=SGD), runner=dict(type='DynamicIterBasedRunner',
                                                          fp16_loss_scaler=dict(init_scale=512)))
    new, problems, notes, _ = convert(cfg, 'mmgen', faithful=True)
    assert new['optim_wrapper']['generator']['loss_scale'] == dict(init_scale=512)
    assert (problems, notes) == ([], [])


def test_custom_imports_get_a_note():
    cfg = dict(optimizer=SGD, custom_imports=dict(imports=['my.module']))
    new, _, notes, _ = convert(cfg, 'mmdet')
    assert new['custom_imports'] == dict(imports=['my.module'])
    assert notes[0].startswith('custom_imports: kept; MMEngine imports these modules too')


# ---------------------------------------------------------------- mmedit's optimizers


def test_mmedit_generator_and_discriminator_become_a_multi_wrapper_as_mmagic_writes():
    adam = dict(type='Adam', lr=1e-4, betas=(0.9, 0.999))
    cfg = dict(model=dict(type='ESRGAN', discriminator=dict(type='ModifiedVGG')),
               optimizers=dict(generator=adam, discriminator=adam))
    new, problems, notes, _ = convert(cfg)
    assert 'optimizers' not in new and (problems, notes) == ([], [])
    assert new['optim_wrapper'] == dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(type='OptimWrapper', optimizer=adam),
        discriminator=dict(type='OptimWrapper', optimizer=adam))


def test_mmedit_single_generator_of_a_restorer_becomes_one_wrapper():
    adam = dict(type='Adam', lr=2e-4, betas=(0.9, 0.99))
    paramwise = dict(custom_keys={'spynet': dict(lr_mult=0.125)})
    cfg = dict(model=dict(type='BasicVSR'),
               optimizers=dict(generator=dict(adam, paramwise_cfg=paramwise)))
    new, problems, _, _ = convert(cfg)
    assert new['optim_wrapper'] == dict(constructor='DefaultOptimWrapperConstructor',
                                        type='OptimWrapper', optimizer=adam,
                                        paramwise_cfg=paramwise)
    assert problems == []
    # mmagic's GAN-family restorers take a dict of wrappers even with one optimizer.
    cfg['model'] = dict(type='RealESRGAN')
    assert convert(cfg)[0]['optim_wrapper']['constructor'] == 'MultiOptimWrapperConstructor'


def test_mmedit_optimizers_as_one_optimizer_and_pix2pix_keys():
    cfg = dict(model=dict(type='DIM'), optimizers=dict(type='Adam', lr=1e-5))
    assert convert(cfg)[0]['optim_wrapper'] == dict(
        constructor='DefaultOptimWrapperConstructor', type='OptimWrapper',
        optimizer=dict(type='Adam', lr=1e-5))
    adam = dict(type='Adam', lr=2e-4)
    cfg = dict(model=dict(type='Pix2Pix', discriminator=dict(type='PatchDiscriminator')),
               optimizers=dict(generator=adam, discriminator=adam))
    new, _, notes, _ = convert(cfg)
    assert list(new['optim_wrapper']) == ['constructor', 'generators', 'discriminators']
    assert notes[0].startswith('optimizers.generator: written as optim_wrapper.generators')


def test_mmedit_optimizers_turned_to_amp_when_the_codebase_is_unknown_and_fp16_is_set():
    cfg = dict(optimizers=dict(generator=SGD, discriminator=SGD), fp16=dict(loss_scale=512.))
    new, problems, _, _ = convert(cfg, codebase=None)
    # 'optimizers' tells mmedit, which ignores fp16: float32, with a note.
    assert new['optim_wrapper']['generator']['type'] == 'OptimWrapper' and problems == []


# ---------------------------------------------------------------- named constructors


LRD = dict(type='AdamW', lr=1e-4, weight_decay=0.05,
           constructor='LearningRateDecayOptimizerConstructor',
           paramwise_cfg=dict(decay_rate=0.7, decay_type='stage_wise', num_layers=6))


def test_a_named_constructor_that_the_1x_codebase_ships_is_kept_with_a_note():
    cfg = dict(optimizer=LRD, fp16=dict(loss_scale='dynamic'))
    new, problems, notes, _ = convert(cfg, 'mmdet')
    wrapper = new['optim_wrapper']
    assert wrapper['constructor'] == 'LearningRateDecayOptimizerConstructor'
    assert wrapper['paramwise_cfg'] == LRD['paramwise_cfg'] and problems == []
    assert any('mmdet 3.x ships a 1.x constructor of this name' in n for n in notes)


def test_a_renamed_or_unknown_named_constructor_is_a_problem_saying_so():
    _, problems, _, _ = convert(dict(optimizer=LRD), 'mmcls')
    assert "mmpretrain 1.x renamed it 'LearningRateDecayOptimWrapperConstructor'" in problems[0]
    _, problems, _, _ = convert(dict(optimizer=LRD))
    assert 'no 1.x constructor of this name is known (the codebase is unknown)' in problems[0]


def test_plugin_keeps_a_named_constructor_and_renames_only_the_wrapper():
    cfg = dict(optimizer=LRD, optimizer_config=dict(grad_clip=None),
               fp16=dict(loss_scale='dynamic'))
    report = migrate_config(cfg, plugin=True, codebase='mmdet')
    wrapper = report.config['optim_wrapper']
    assert wrapper['constructor'] == 'LearningRateDecayOptimizerConstructor'
    assert wrapper['type'] == 'Fp16utilsAmpOptimWrapper'
    assert any(n.startswith("optim_wrapper.constructor: 'LearningRateDecayOptimizerConstructor'"
                            ' kept with --plugin') for n in report.notes)
    plain = migrate_config(dict(optimizer=SGD), plugin=True, codebase='mmdet').config
    assert plain['optim_wrapper']['constructor'] == 'Fp16utilsOptimWrapperConstructor'


def test_a_named_constructor_builds_the_plugins_wrapper_under_mmengine():
    pytest.importorskip('mmengine.optim', reason=NO_MMENGINE)
    torch = pytest.importorskip('torch')
    from mmengine.optim import DefaultOptimWrapperConstructor
    from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

    import fp16utils.mmengine as plugin

    seen = {}

    class StandIn(DefaultOptimWrapperConstructor):
        """Records the paramwise options it gets; applies none of them."""

        def __init__(self, optim_wrapper_cfg, paramwise_cfg=None):
            seen['paramwise_cfg'] = paramwise_cfg
            super().__init__(optim_wrapper_cfg, None)

    name = 'LearningRateDecayOptimizerConstructor'
    OPTIM_WRAPPER_CONSTRUCTORS.register_module(name=name, module=StandIn, force=True)
    try:
        cfg = dict(optimizer=LRD, fp16=dict(loss_scale=512.))
        wrapper_cfg = dict(migrate_config(cfg, plugin=True, codebase='mmdet')
                           .config['optim_wrapper'])
        constructor = OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
            type=wrapper_cfg.pop('constructor'), optim_wrapper_cfg=wrapper_cfg,
            paramwise_cfg=wrapper_cfg.pop('paramwise_cfg')))
        wrapper = constructor(torch.nn.Linear(2, 2))
    finally:
        OPTIM_WRAPPER_CONSTRUCTORS.module_dict.pop(name, None)
    assert isinstance(wrapper, plugin.Fp16utilsAmpOptimWrapper)
    assert seen['paramwise_cfg'] == LRD['paramwise_cfg']
    assert type(wrapper.optimizer).__name__ == 'AdamW'


# -- fixes found on the real configs (docs/migration/upstream.md#conversion-fixes) -----------

def test_misspelt_delete_in_paramwise_cfg_is_dropped_with_a_note() -> None:
    cfg = dict(optimizer=dict(type='AdamW', lr=5e-4, paramwise_cfg=dict(
        _delete=True, norm_decay_mult=0.0, custom_keys={'.pos_block.': dict(decay_mult=0.0)})))
    report = migrate_config(cfg, codebase='mmcls')
    assert report.config['optim_wrapper']['paramwise_cfg'] == dict(
        norm_decay_mult=0.0, custom_keys={'.pos_block.': dict(decay_mult=0.0)})
    said = [n for n in report.notes
            if n.startswith('optimizer.paramwise_cfg._delete: True dropped')]
    assert len(said) == 1 and '_delete_' in said[0] and report.problems == []
    assert cfg['optimizer']['paramwise_cfg']['_delete'] is True  # the input is untouched


def test_int_adam_betas_are_written_as_floats_with_a_note() -> None:
    cfg = dict(optimizer=dict(generator=dict(type='Adam', lr=0.0015, betas=(0, 0.99)),
                              discriminator=dict(type='Adam', lr=0.0018, betas=(0.5, 0.99))))
    report = migrate_config(cfg, codebase='mmgen')
    betas = report.config['optim_wrapper']['generator']['optimizer']['betas']
    assert betas == (0.0, 0.99) and [type(b) for b in betas] == [float, float]
    assert report.config['optim_wrapper']['discriminator']['optimizer']['betas'] == (0.5, 0.99)
    assert [n.split(':')[0] for n in report.notes if '.betas' in n] == ['optimizer.generator.betas']
    lists = migrate_config(dict(optimizer=dict(type='Adam', lr=1e-3, betas=[0, 0.9])))
    assert lists.config['optim_wrapper']['optimizer']['betas'] == [0.0, 0.9]


def test_mmgen_optimizer_none_says_the_model_builds_its_optimizers() -> None:
    cfg = dict(optimizer=None, runner=dict(type='DynamicIterBasedRunner'), total_iters=100)
    report = migrate_config(cfg, codebase='mmgen')
    assert 'optim_wrapper' not in report.config and 'optimizer' not in report.config
    said = [p for p in report.problems if p.startswith('optimizer: None (left out): ')]
    assert len(said) == 1
    assert 'SinGANOptimWrapperConstructor' in said[0]
    assert 'PGGANOptimWrapperConstructor' in said[0]
    assert not any('expected dict' in p for p in report.problems)
