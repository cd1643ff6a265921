"""DeepSpeed's fp16 names, and its ``fp16`` config block, in the loss-scale policy's names.

DeepSpeed spells the dynamic loss scale's settings ``initial_scale_power`` (the scale is
``2**power``), ``loss_scale_window``, ``hysteresis``, ``consecutive_hysteresis`` and
``min_loss_scale``; its ``fp16`` block adds ``enabled`` and ``loss_scale`` (``0``: a
dynamic scale, another number: a static one). The 1.x wrappers take ``init_scale``,
``growth_interval``, ``hysteresis``, ``consecutive_hysteresis``, ``min_scale``,
``max_scale`` and ``at_min_scale``. Where DeepSpeed's default for a key left out differs
from the wrappers' (a window of 1000 steps, not GradScaler's 2000; a hysteresis of 2,
not 1) a note says so, and ``faithful`` writes DeepSpeed's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .._args.policy import DEEPSPEED_NAMES, DEFAULT_POLICY, policy_value
from .._args.spec import TORCH_DYNAMIC, is_number, positive_finite

__all__ = ['BLOCK_KEYS', 'POLICY_ARGS', 'deepspeed_defaults', 'is_deepspeed_block',
           'policy_args', 'read_block', 'rename_deepspeed']

#: The loss-scale policy's keys (``fp16utils._args.policy.POLICY_KEYS``), in the
#: order a converted ``loss_scale`` dict writes them, after GradScaler's.
POLICY_ARGS = ('hysteresis', 'consecutive_hysteresis', 'min_scale', 'max_scale', 'at_min_scale')
#: The keys of DeepSpeed's ``fp16`` block that can stand next to ``loss_scale``.
BLOCK_KEYS = ('enabled', 'auto_cast', 'initial_scale_power', 'loss_scale_window', 'hysteresis',
              'consecutive_hysteresis', 'min_loss_scale', 'raise_error_at_min_scale',
              'fp16_master_weights_and_grads')
_SCALER_KEYS = ('initial_scale_power', 'loss_scale_window', 'hysteresis',
                'consecutive_hysteresis', 'min_loss_scale', 'raise_error_at_min_scale')
#: Block keys with no equivalent here, and DeepSpeed's default (dropped in silence).
_NO_EQUIVALENT = {
    'auto_cast': (False, 'AmpOptimWrapper runs the forward under torch.autocast, which casts '
                         'the inputs of each op'),
    'fp16_master_weights_and_grads': (False, 'the wrappers keep float32 parameters (the legacy '
                                             'backend float32 masters) and their optimizer '
                                             'state'),
}
#: Our key -> (DeepSpeed's default, ours, DeepSpeed's name), where the two differ.
_DIFFERENT_DEFAULTS = {
    'growth_interval': (1000, TORCH_DYNAMIC.growth_interval, 'loss_scale_window'),
    'hysteresis': (2, DEFAULT_POLICY.hysteresis, 'hysteresis'),
}
_SEE = 'see docs/migration/convert-config.md#deepspeed'


def rename_deepspeed(args: dict[str, Any], where: str,
                     problems: list[str]) -> tuple[bool, dict[str, Any]]:
    """Rename DeepSpeed's keys of a loss-scale dict to ours, in place.

    Returns whether there was one, and the ones whose value is unusable (taken out of
    ``args``, each told in ``problems``, to be written back as they were). A DeepSpeed
    name given with ours for the same setting is a problem; ours is kept.
    """
    found = False
    kept: dict[str, Any] = {}
    for theirs, ours in DEEPSPEED_NAMES.items():
        if theirs not in args:
            continue
        found = True
        value = args.pop(theirs)
        same = [k for k in (ours, 'scale_window' if ours == 'growth_interval' else None)
                if k is not None and k in args]
        if same:
            problems.append(
                f'{where}: {theirs} (DeepSpeed) and {same[0]} name the same setting; '
                f'{same[0]}={args[same[0]]!r} was kept and {theirs}={value!r} dropped; give '
                'only one of them'
            )
            continue
        new, expected = policy_value(theirs, value)
        if expected:
            problems.append(f'{where}.{theirs}: expected {expected}, got {value!r}; kept as '
                            'is, fix it')
            kept[theirs] = value
        else:
            args[ours] = new
    return found, kept


def policy_args(args: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """Take the policy's keys out of ``args``; an unusable value is told and kept as it is."""
    out: dict[str, Any] = {}
    for key in POLICY_ARGS:
        if key not in args:
            continue
        value = args.pop(key)
        new, expected = policy_value(key, value)
        if expected:
            problems.append(f'{where}.{key}: expected {expected}, got {value!r}; kept as is, '
                            'fix it')
            new = value
        out[key] = new
    low, high = out.get('min_scale'), out.get('max_scale')
    if is_number(low) and is_number(high) and positive_finite(low) and low > high:
        problems.append(f'{where}: min_scale={low!r} is above max_scale={high!r}; kept as '
                        'is, fix one of them')
    return out


def deepspeed_defaults(out: dict[str, Any], policy: dict[str, Any], where: str,
                       notes: Optional[list[str]], faithful: bool) -> None:
    """A DeepSpeed dict leaving out a key whose default differs here: say so, or write it."""
    missing = {key: vals for key, vals in _DIFFERENT_DEFAULTS.items()
               if key not in out and key not in policy}
    if not missing:
        return
    said = '; '.join(f'{name}: DeepSpeed {theirs}, here {ours}' for theirs, ours, name in
                     missing.values())
    wanted = ', '.join(f'{key}={theirs}' for key, (theirs, _, _) in missing.items())
    if faithful:
        for key, (theirs, _, _) in missing.items():
            (policy if key in POLICY_ARGS else out)[key] = theirs
        if notes is not None:
            notes.append(f"{where}: DeepSpeed's defaults written out ({wanted}) for keys its "
                         f'fp16 config leaves out ({said}) (--faithful); {_SEE}')
        return
    if notes is not None:
        why = ('; a hysteresis of 2 backs off at the second overflow in a row, 1 at every one'
               if 'hysteresis' in missing else '')
        notes.append(
            f"{where}: DeepSpeed's fp16 keys, without {', '.join(v[2] for v in missing.values())}"
            f", whose default differs ({said}{why}); this package's default was kept; add "
            f"{wanted} for DeepSpeed's, or pass --faithful; {_SEE}"
        )


def is_deepspeed_block(fp16: Mapping[str, Any]) -> bool:
    """Whether an ``fp16`` dict is DeepSpeed's block (``enabled``, ``initial_scale_power``...)."""
    return any(key in BLOCK_KEYS for key in fp16)


def read_block(fp16: Mapping[str, Any], problems: list[str],
               notes: list[str]) -> tuple[bool, Any, str]:
    """Read DeepSpeed's ``fp16`` block: (is it on, its loss scale, where that was read).

    The scale is a number (static), or a dict of DeepSpeed's and our keys (dynamic: its
    ``loss_scale`` is 0, ``'dynamic'`` or absent), for :func:`~._loss_scale.convert_loss_scale`.
    """
    enabled = fp16.get('enabled', None)
    if enabled is None:
        notes.append(
            "fp16: DeepSpeed's fp16 keys without enabled; DeepSpeed would read the block as "
            'off (its enabled defaults to False), 0.x codebases read an fp16 key as on: '
            'read as on (AmpOptimWrapper); write enabled=True, or enabled=False for float32; '
            + _SEE
        )
        enabled = True
    elif not isinstance(enabled, bool):
        hf = (" ('auto' is the HF Trainer's, filled in from its own arguments, which this "
              'config does not have)' if enabled == 'auto' else '')
        problems.append(f'fp16.enabled: expected True or False, got {enabled!r}{hf}; read as '
                        'True (AmpOptimWrapper); write True or False')
        enabled = True
    for key, (default, why) in _NO_EQUIVALENT.items():
        if key in fp16 and fp16[key] != default:
            problems.append(f'fp16.{key}={fp16[key]!r} has no equivalent here ({why}) and '
                            f'was dropped; {_SEE}')
    if not enabled:
        return False, None, 'fp16'
    scaler = {key: fp16[key] for key in _SCALER_KEYS if key in fp16}
    scale = fp16.get('loss_scale', 0)
    if isinstance(scale, Mapping):
        if scaler:
            problems.append(
                f'fp16: {", ".join(scaler)} next to loss_scale=dict(...): two places for the '
                'scaler settings; the loss_scale dict was used and these dropped; move them '
                'into it'
            )
        return True, scale, 'fp16.loss_scale'
    if scale == 'dynamic' or (is_number(scale) and scale == 0):
        return True, scaler, 'fp16'
    if positive_finite(scale) and scaler:
        problems.append(
            f'fp16: {", ".join(scaler)}: for a dynamic scale (loss_scale=0) only, and '
            f'loss_scale={scale!r} is a static one (DeepSpeed ignores them too); dropped; '
            'remove them, or set loss_scale=0 for a dynamic scale'
        )
    return True, scale, 'fp16.loss_scale'
