"""What the training arguments mean and which values are errors; standard library only.

``spec`` (``loss_scale``, ``clip_grad``, ``nonfinite``, scaler states, mmcv's defaults),
``limits`` (numeric limits, scale arithmetic), ``numbers`` (whole numbers as mmcv takes
them), ``keys`` (unknown keys, named with the closest accepted one).
"""
