"""What the training arguments mean and which values are errors; standard library only.

``spec`` (``loss_scale``, ``clip_grad``, ``nonfinite``, mmcv's defaults), ``policy`` (the
scale policy: hysteresis, floor, ceiling, DeepSpeed's names), ``states`` (scaler states,
mmcv's and GradScaler's), ``limits`` (numeric limits, scale arithmetic), ``numbers``
(whole numbers as mmcv takes them), ``keys`` (unknown keys, named with the closest
accepted one).
"""
