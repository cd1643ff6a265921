"""1.x-style optimizer wrappers: ``OptimWrapper``, ``AmpOptimWrapper``, ``OptimWrapperDict``.

An optimizer wrapper owns everything that happens between a loss and a
parameter update: the loss division for gradient accumulation, the backward
pass, loss scaling, gradient clipping, skipping non-finite steps and zeroing
the gradients. A training step then reads::

    with optim_wrapper.optim_context(model):
        loss = model(inputs).loss
    optim_wrapper.update_params(loss)

How a step is taken is the business of the step engine
(:mod:`fp16utils.engine`); the wrappers say when. :class:`AmpOptimWrapper`
runs the forward inside ``torch.autocast`` on the model's device (CPU
included) and scales the loss with ``torch.amp.GradScaler`` (native backend),
or keeps float32 master weights for a half model and scales with
:class:`~fp16utils.LossScaler` (legacy backend). :class:`OptimWrapperDict`
groups one wrapper per sub-model (GANs), and :func:`build_optim_wrapper`
builds any of them from a config dict.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from fp16utils.optim import AmpOptimWrapper
    >>> model = nn.Linear(4, 2)
    >>> wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    >>> with wrapper.optim_context(model):
    ...     loss = model(torch.full((2, 4), 0.1)).float().mean()
    >>> wrapper.update_params(loss).stepped
    True
    >>> wrapper.skipped_steps, wrapper.loss_scale
    (0, 65536.0)
"""

from .._args.spec import MIN_LOSS_SCALE, NONFINITE_POLICIES, SCALE_HISTORY_LEN
from .amp import AmpOptimWrapper
from .builder import build_optim_wrapper
from .wrapper import OptimWrapper
from .wrapper_dict import OptimWrapperDict

__all__ = ['AmpOptimWrapper', 'MIN_LOSS_SCALE', 'NONFINITE_POLICIES', 'OptimWrapper',
           'OptimWrapperDict', 'SCALE_HISTORY_LEN', 'build_optim_wrapper']
