"""The loss-scale policy: hysteresis, a floor and a ceiling, and what to do at the floor.

One reading of the policy keys of a ``loss_scale`` dict (ours and DeepSpeed's names) and
of the keys a scaler state carries for them, shared by ``LossScaler``, the native
engine's host scale and the config migration. The defaults are what mmcv's LossScaler
and ``torch.amp.GradScaler`` do: back off at every overflow, never below 1 (nor below the
initial scale), grow up to ``2**127``, and keep going at the floor.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, MutableMapping, NamedTuple, Optional, Tuple

from .limits import MAX_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_RANGE, real_number, usable_scale
from .numbers import as_whole

__all__ = ['AT_MIN_SCALE', 'DEEPSPEED_NAMES', 'DEFAULT_POLICY', 'POLICY_KEYS',
           'POLICY_STATE_KEYS', 'ScalePolicy', 'at_floor', 'bounded_growth',
           'check_policy_state', 'floor_of', 'make_policy', 'on_clean', 'on_overflow',
           'policy_state', 'policy_value', 'pop_policy', 'read_deepspeed_names']

logger = logging.getLogger('fp16utils')

#: What an overflow does when the scale is already at its floor and should back off.
AT_MIN_SCALE = ('continue', 'warn', 'raise')
#: The policy keys of a ``loss_scale`` dict (our names).
POLICY_KEYS = ('min_scale', 'max_scale', 'hysteresis', 'consecutive_hysteresis',
               'at_min_scale')
#: What a scaler state holds for a policy that is not the default: the settings and
#: ``cur_hysteresis``, the overflows still tolerated before the next back-off.
POLICY_STATE_KEYS = POLICY_KEYS + ('cur_hysteresis',)
#: DeepSpeed's ``fp16`` key -> ours (``hysteresis`` and ``consecutive_hysteresis`` are
#: the same in both); ``initial_scale_power`` p means ``init_scale = 2.0**p``.
DEEPSPEED_NAMES = {
    'initial_scale_power': 'init_scale',
    'loss_scale_window': 'growth_interval',
    'min_loss_scale': 'min_scale',
    'raise_error_at_min_scale': 'at_min_scale',
}
#: Names that set the same value: giving two of one group is an error.
_SAME_SETTING = (('init_scale', 'initial_scale_power'),
                 ('growth_interval', 'scale_window', 'loss_scale_window'),
                 ('min_scale', 'min_loss_scale'),
                 ('at_min_scale', 'raise_error_at_min_scale'))


class ScalePolicy(NamedTuple):
    """How a dynamic loss scale moves beyond growth and backoff (defaults: mmcv's and torch's).

    ``hysteresis`` overflows are tolerated before the scale backs off (1: at every
    overflow); the count is restored when the scale grows, or after every clean step with
    ``consecutive_hysteresis`` (only overflows in a row then count), as DeepSpeed and
    Megatron-LM define it. A tolerated overflow still skips its step and restarts the
    growth window. ``min_scale`` (None: 1, or the initial scale when that is lower) and
    ``max_scale`` bound the scale; ``at_min_scale`` says what an overflow that should back
    off does when the scale is at ``min_scale``.
    """

    min_scale: Optional[float] = None
    max_scale: float = MAX_LOSS_SCALE
    hysteresis: int = 1
    consecutive_hysteresis: bool = False
    at_min_scale: str = 'continue'

    @property
    def is_default(self) -> bool:
        """Whether this is the policy of mmcv's LossScaler and torch's GradScaler."""
        return self == DEFAULT_POLICY

    def given(self) -> Dict[str, Any]:
        """The settings that differ from the default, as keyword arguments."""
        return {key: value for key, value in self._asdict().items()
                if value != getattr(DEFAULT_POLICY, key)}


DEFAULT_POLICY = ScalePolicy()


def floor_of(policy: ScalePolicy) -> float:
    """The scale below which an overflow never backs off (a lower scale is kept as it is)."""
    return MIN_LOSS_SCALE if policy.min_scale is None else policy.min_scale


#: What a policy key (ours or DeepSpeed's) is, said before "must be" in an error.
_WHAT = {'hysteresis': ' (overflows tolerated before the scale backs off)',
         'initial_scale_power': ' (init_scale = 2**power)'}


def policy_value(key: str, value: Any) -> Tuple[Any, str]:
    """``(value in our terms, '')`` for a policy key (ours, or DeepSpeed's name), or
    ``(None, what was expected)``: the one reading of these values, which the wrappers
    raise on and the config migration reports.

    ``initial_scale_power`` gives the scale ``2.0**power``, ``raise_error_at_min_scale``
    the ``at_min_scale`` action; ``loss_scale_window`` a whole number.

    Example:
        >>> policy_value('initial_scale_power', 16), policy_value('hysteresis', 0)[1]
        ((65536.0, ''), 'a whole number >= 1')
    """
    if key in ('min_scale', 'max_scale', 'min_loss_scale'):
        return (float(real_number(value)), '') if usable_scale(value) else (None, SCALE_RANGE)
    if key in ('hysteresis', 'loss_scale_window'):
        whole = as_whole(value)
        return (whole, '') if whole is not None and whole >= 1 else (
            None, 'a whole number >= 1')
    if key == 'initial_scale_power':
        whole = as_whole(value)
        return (2.0 ** whole, '') if whole is not None and -127 <= whole <= 127 else (
            None, 'a whole number in [-127, 127]')
    if key == 'at_min_scale':
        return (value, '') if isinstance(value, str) and value in AT_MIN_SCALE else (
            None, f'one of {list(AT_MIN_SCALE)} (what an overflow does with the scale at '
                  'min_scale)')
    if not isinstance(value, bool):  # consecutive_hysteresis, raise_error_at_min_scale
        return None, 'True or False'
    if key == 'raise_error_at_min_scale':
        return ('raise' if value else 'continue'), ''
    return value, ''


def _checked(key: str, value: Any, usage: str) -> Any:
    """:func:`policy_value`, or a ValueError naming ``key`` and what it must be."""
    new, expected = policy_value(key, value)
    if expected:
        raise ValueError(f'{usage}; {key}{_WHAT.get(key, "")} must be {expected}, got '
                         f'{value!r}.')
    return new


def read_deepspeed_names(args: MutableMapping[str, Any], usage: str) -> None:
    """Refuse two names for one setting; rewrite DeepSpeed's names as ours, in place."""
    for group in _SAME_SETTING:
        given = [name for name in group if name in args]
        if len(given) > 1:
            raise ValueError(f'{usage}; {given[0]!r} and {given[1]!r} are the same setting '
                             'under two names: give only one of them.')
    for theirs in ('initial_scale_power', 'raise_error_at_min_scale'):
        if theirs in args:
            args[DEEPSPEED_NAMES[theirs]] = _checked(theirs, args.pop(theirs), usage)
    for theirs in ('loss_scale_window', 'min_loss_scale'):  # checked under our names
        if theirs in args:
            args[DEEPSPEED_NAMES[theirs]] = args.pop(theirs)


def pop_policy(args: MutableMapping[str, Any], usage: str, *, static: bool,
               init_scale: float) -> ScalePolicy:
    """Take the policy keys out of ``args`` (our names) and check them; the ScalePolicy."""
    given = {key: args.pop(key) for key in POLICY_KEYS if key in args}
    return make_policy(given, usage, static=static, init_scale=init_scale)


def make_policy(given: Mapping[str, Any], usage: str, *, static: bool,
                init_scale: float) -> ScalePolicy:
    """A ScalePolicy from policy keys (our names) that were given, checked against the scale."""
    if not given:
        return DEFAULT_POLICY
    policy = _policy(given, usage)
    if static and policy.is_default:  # e.g. DeepSpeed's raise_error_at_min_scale=False
        return DEFAULT_POLICY
    if static:
        raise ValueError(f'{usage}; {sorted(given)} only apply to a dynamic scale (a static '
                         'scale never backs off or grows): drop them, or make the scale '
                         'dynamic.')
    low = floor_of(policy) if policy.min_scale is not None else None
    if low is not None and init_scale < low:
        raise ValueError(f'{usage}; init_scale={init_scale!r} is below min_scale={low!r}: '
                         'start at or above the floor.')
    if init_scale > policy.max_scale:
        raise ValueError(f'{usage}; init_scale={init_scale!r} is above '
                         f'max_scale={policy.max_scale!r}: start at or below the ceiling.')
    return policy


def _policy(given: Mapping[str, Any], usage: str) -> ScalePolicy:
    """A ScalePolicy from policy keys (our names), each checked; ValueError naming a bad one."""
    policy = ScalePolicy(**{key: _checked(key, given[key], usage)
                            for key in POLICY_KEYS if key in given})
    if policy.min_scale is not None and policy.min_scale > policy.max_scale:
        raise ValueError(f'{usage}; min_scale={policy.min_scale!r} is above '
                         f'max_scale={policy.max_scale!r}.')
    return policy


def check_policy_state(state: Mapping[str, Any], owner: str
                       ) -> Optional[Tuple[ScalePolicy, int]]:
    """The policy and ``cur_hysteresis`` a scaler state carries (None: none), checked."""
    present = [key for key in POLICY_STATE_KEYS if key in state]
    if not present:
        return None
    missing = [key for key in POLICY_STATE_KEYS if key not in state]
    if missing:
        raise KeyError(f'{owner}: the loss scaler state has the policy key(s) {present} but '
                       f'not {missing}; a state written with a scale policy has all of '
                       f'{list(POLICY_STATE_KEYS)}.')
    policy = _policy({key: state[key] for key in POLICY_KEYS if state[key] is not None},
                     f'{owner}: the loss scaler state')
    left = as_whole(state['cur_hysteresis'])
    if left is None or not 1 <= left <= policy.hysteresis:
        raise ValueError(f"{owner}: the loss scaler state has cur_hysteresis="
                         f"{state['cur_hysteresis']!r}; expected a whole number in [1, "
                         f'hysteresis={policy.hysteresis}].')
    return policy, left


def policy_state(policy: ScalePolicy, left: int) -> Dict[str, Any]:
    """The keys a scaler state adds for ``policy`` ({} for the default policy)."""
    if policy.is_default:
        return {}
    return {**policy._asdict(), 'cur_hysteresis': left}


def at_floor(policy: ScalePolicy, scale: float, where: str) -> None:
    """An overflow should back off a scale already at its floor: warn, raise, or go on.

    Raises:
        FloatingPointError: ``at_min_scale='raise'``; nothing was changed.
    """
    action = policy.at_min_scale
    if action == 'continue':
        return
    floor = floor_of(policy)
    text = (f'{where}: non-finite gradients (inf/nan) with the loss scale {scale} already at '
            f'its floor (min_scale={floor}): the scale cannot back off further')
    if action == 'raise':
        raise FloatingPointError(
            f'{text}; the update was not applied (parameters, optimizer state and the scaler '
            "are unchanged). Look for the cause with fp16utils.find_overflow(model), lower "
            "min_scale, or set at_min_scale='warn' to go on skipping such steps.")
    logger.warning('%s; the step is skipped.', text)


def bounded_growth(scale: float, grown: float, policy: ScalePolicy) -> float:
    """``grown``, at most ``max_scale``; never lower than ``scale`` (a scale already above)."""
    return grown if grown <= policy.max_scale else max(scale, policy.max_scale)


def on_overflow(left: int) -> Tuple[bool, int]:
    """Whether an overflow backs the scale off, and the tolerance left after it.

    ``left`` overflows were still tolerated; the last one backs off, and so does every
    later one until the tolerance is restored (:func:`on_clean`).
    """
    if left > 1:
        return False, left - 1
    return True, left


def on_clean(policy: ScalePolicy, left: int, grew: bool) -> int:
    """The tolerance after a clean step: restored when the scale grew, or always when
    consecutive overflows only count."""
    return policy.hysteresis if grew or policy.consecutive_hysteresis else left
