"""The 0.x hook family: the two optimizer hooks (:mod:`.optimizer`), mmcv's hook API for their
subclasses (:mod:`.api`), the base that follows mmcv's ``Hook`` (:mod:`.base`), the gradient
all-reduce (:mod:`.allreduce`), what they keep on the runner (:mod:`.runner_state`), and
``skip_aware_hooks``: the runner's hooks that follow the steps taken (:mod:`.follow`; for
MMEngine's Runner through :mod:`.runner_bridge`)."""

from .optimizer import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook

__all__ = ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook']
