# The training schedule shared by the 0.x configs of this sample.
optimizer = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2))
lr_config = dict(policy='step', warmup='linear', warmup_iters=500, step=[8, 11])
runner = dict(type='EpochBasedRunner', max_epochs=12)
