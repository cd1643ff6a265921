"""An MMEngine config that trains with fp16utils' AmpOptimWrapper in MMEngine's Runner.

``custom_imports`` loads the plug-in, so the constructor and wrapper names below
are found in MMEngine's registries. ``Fp16utilsOptimWrapperConstructor`` builds
this package's wrappers from ``type='AmpOptimWrapper'`` and applies
``paramwise_cfg`` as MMEngine's default constructor does: here the norm layers
get no weight decay (``norm_decay_mult`` needs ``weight_decay`` in the optimizer,
as in MMEngine).

The model and data set (``ToyRegressor``, ``ToyDataset``) are registered by
examples/mmengine_runner.py, which builds the Runner from this file:

Run: python examples/mmengine_runner.py --config examples/mmengine_config.py
"""

custom_imports = dict(imports=['fp16utils.mmengine'], allow_failed_imports=False)

model = dict(type='ToyRegressor')
train_dataloader = dict(
    dataset=dict(type='ToyDataset'), batch_size=8, num_workers=0,
    sampler=dict(type='InfiniteSampler', shuffle=True), collate_fn=dict(type='default_collate'))
train_cfg = dict(by_epoch=False, max_iters=24)

optim_wrapper = dict(
    constructor='Fp16utilsOptimWrapperConstructor',
    type='AmpOptimWrapper', dtype='bfloat16',  # 'auto': the native dtype of the device
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0.0),
    clip_grad=dict(max_norm=5.0))
param_scheduler = dict(type='MultiStepLR', milestones=[16], gamma=0.1, by_epoch=False)

default_hooks = dict(logger=dict(type='LoggerHook', interval=8),
                     checkpoint=dict(type='CheckpointHook', interval=24, by_epoch=False))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
work_dir = './work_dirs/mmengine_config'
