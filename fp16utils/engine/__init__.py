"""The step engine: how an optimizer step is taken, skipped, recorded, saved and restored.

Both training styles drive the same engine: the 1.x optimizer wrappers
(:mod:`fp16utils.optim`) and the 0.x hooks (:mod:`fp16utils.hooks.optimizer`) only say
*when* to backward and to step, and where the state lives in a checkpoint.
Three engines share one interface:

- :class:`StepEngine`: float32 (no scaling); the base, with no-op defaults.
- :class:`NativeEngine`: ``torch.amp.GradScaler`` with skip detection, a scale
  floor and one device sync per step.
- :class:`LegacyEngine`: float32 master weights for a half model, scaled by
  :class:`~fp16utils.LossScaler`.

:class:`AccumulationWindow` is the gradient-accumulation arithmetic both
styles share (the loss divisor, when to step, the warnings on resume).
:class:`StepResult` says what one iteration did (:func:`take_step` makes it)
and :class:`OverflowGuard` diagnoses a run of skipped steps. :class:`StepDriver`
is what both styles do around the engine (backward, step, records, the pending
window).

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> from fp16utils._args.spec import TORCH_DYNAMIC
    >>> engine = NativeEngine(TORCH_DYNAMIC, torch.float16, lambda: 'cpu')
    >>> engine.backward(model(torch.ones(1, 2)).sum())
    >>> engine.step(optimizer, step=1, kwargs={})
    False
    >>> engine.loss_scale, engine.skipped_steps
    (65536.0, 0)
"""

from .base import (
    ResumeState,
    StepEngine,
    flat_params,
    optimizer_device_type,
    pending_grads,
    resume_state_from_meta,
)
from .checks import (
    check_optimizer_state,
    check_tensors,
    load_optimizer_state,
    read_pending_window,
    snapshot_optimizer,
)
from .driver import Driven, StepDriver, check_resume
from .guard import GUARD_ACTIONS, OverflowGuard
from .interrupt import Leftovers, guarded_backward
from .legacy import LegacyEngine
from .native import NativeEngine
from .outcome import StepResult, accumulating_result, take_step
from .window import AccumulationWindow

__all__ = ['AccumulationWindow', 'Driven', 'GUARD_ACTIONS', 'LegacyEngine', 'Leftovers',
           'NativeEngine', 'OverflowGuard', 'ResumeState', 'StepDriver', 'StepEngine', 'StepResult',
           'accumulating_result', 'check_optimizer_state', 'check_resume', 'check_tensors',
           'flat_params', 'optimizer_device_type', 'guarded_backward', 'load_optimizer_state',
           'pending_grads', 'read_pending_window', 'resume_state_from_meta',
           'snapshot_optimizer', 'take_step']
