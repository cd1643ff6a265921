"""The 0.x optimizer hooks: ``Fp16OptimizerHook`` and ``GradientCumulativeFp16OptimizerHook``.

- :mod:`.optimizer`: the two hooks, thin users of the step engine.
- :mod:`.api`: mmcv's ``OptimizerHook`` API that 0.x subclasses call.
- :mod:`.base`: the hooks' plain base, which becomes mmcv's ``Hook`` once
  ``mmcv.runner`` is imported.
- :mod:`.allreduce`: the hooks' gradient all-reduce.

Example:
    >>> from fp16utils.hooks import Fp16OptimizerHook
    >>> Fp16OptimizerHook(loss_scale=512.).loss_scale
    512.0
"""

from .optimizer import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook

__all__ = ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook']
