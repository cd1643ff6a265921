# A 0.x (mmcv 1.x era) detector config that trains in fp16.
_base_ = ['./_base_/schedule_1x.py', './_base_/default_runtime.py']
model = dict(type='RetinaNet', backbone=dict(type='ResNet', depth=50))
optimizer_config = dict(type='Fp16OptimizerHook')
fp16 = dict(loss_scale=dict(init_scale=512.0, scale_window=500))
