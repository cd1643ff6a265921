"""The 0.x hook family: the two optimizer hooks (:mod:`.optimizer`), mmcv's hook API for their
subclasses (:mod:`.api`), the base that follows mmcv's ``Hook`` (:mod:`.base`), the gradient
all-reduce (:mod:`.allreduce`)."""

from .optimizer import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook

__all__ = ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook']
