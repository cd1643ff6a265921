# The same detector, trained in float32 (no fp16 key).
_base_ = ['./_base_/schedule_1x.py', './_base_/default_runtime.py']
model = dict(type='RetinaNet', backbone=dict(type='ResNet', depth=50))
