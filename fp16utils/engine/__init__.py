"""The step engine: how an optimizer step is taken, skipped, recorded, saved and restored.

The 1.x optimizer wrappers and the 0.x hooks say when to backward and to step; a
:class:`StepDriver` drives one of three engines (:class:`StepEngine` for float32,
:class:`NativeEngine` for GradScaler, :class:`LegacyEngine` for fp32 masters) through
one explicit :class:`StepState`, and says what an iteration did as a :class:`StepResult`.
"""

from .backward import discard_spent, guarded_backward, refuse_spent
from .base import (
    ResumeState,
    StepEngine,
    StepState,
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
from .driver import Driven, StepDriver, StepResult, check_resume
from .guard import GUARD_ACTIONS, OverflowGuard
from .legacy import LegacyEngine
from .native import HostScale, NativeEngine
from .window import AccumulationWindow

__all__ = ['AccumulationWindow', 'Driven', 'GUARD_ACTIONS', 'HostScale', 'LegacyEngine',
           'NativeEngine', 'OverflowGuard', 'ResumeState', 'StepDriver', 'StepEngine',
           'StepResult', 'StepState', 'check_optimizer_state', 'check_resume',
           'check_tensors', 'discard_spent', 'flat_params', 'guarded_backward',
           'load_optimizer_state', 'optimizer_device_type', 'pending_grads',
           'read_pending_window', 'refuse_spent', 'resume_state_from_meta',
           'snapshot_optimizer']
