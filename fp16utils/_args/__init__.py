"""What the training arguments mean and which values are errors; standard library only.

- :mod:`.spec`: ``loss_scale``, ``clip_grad``, ``nonfinite`` and scaler states.
- :mod:`.limits`: the numeric limits and the scale arithmetic.
- :mod:`.numbers`: whole numbers as mmcv takes them (``2.0`` as ``2``).
- :mod:`.keys`: unknown keyword arguments and config keys, named with the closest
  accepted one.

``fp16utils.migrate`` uses these without importing torch.
"""
