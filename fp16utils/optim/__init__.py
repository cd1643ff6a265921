"""1.x-style optimizer wrappers: :class:`OptimWrapper`, :class:`AmpOptimWrapper`,
:class:`OptimWrapperDict`, and :func:`build_optim_wrapper`, which builds them from a config.

A wrapper owns what happens between a loss and a parameter update (the loss division
for accumulation, backward, loss scaling, clipping, skipping non-finite steps, zeroing);
the step engine (:mod:`fp16utils.engine`) says how a step is taken. A training step::

    with optim_wrapper.optim_context(model):
        loss = model(inputs).loss
    optim_wrapper.update_params(loss)
"""

from .._args.spec import MIN_LOSS_SCALE, NONFINITE_POLICIES, SCALE_HISTORY_LEN
from .amp import AmpOptimWrapper
from .builder import build_optim_wrapper
from .wrapper import OptimWrapper
from .wrapper_dict import OptimWrapperDict

__all__ = ['AmpOptimWrapper', 'MIN_LOSS_SCALE', 'NONFINITE_POLICIES', 'OptimWrapper',
           'OptimWrapperDict', 'SCALE_HISTORY_LEN', 'build_optim_wrapper']
