"""The host's copy of a GradScaler's scale state, and the arithmetic that moves it.

``torch.amp.GradScaler`` keeps its scale and growth tracker in device tensors:
reading them is a device sync. The native engine keeps the same numbers on
the host and moves them as GradScaler's update kernel does (in float32), with
fp16utils' floor and ceiling, so that it knows the scale after each step
without reading it back.

Example:
    >>> from fp16utils._args.spec import TORCH_DYNAMIC
    >>> host = HostScale(TORCH_DYNAMIC._replace(init_scale=8.0, growth_interval=2))
    >>> host.count_clean(), host.count_clean(), host.scale
    (False, True, 16.0)
    >>> host.back_off(), host.state_dict()['_growth_tracker']
    (8.0, 0)
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from .._args.limits import to_float32
from .._args.spec import MIN_LOSS_SCALE, ScaleSpec, grow_scale, shrink_scale

__all__ = ['HostScale']


class HostScale:
    """A GradScaler's state on the host: scale, growth tracker, factors, interval, floor.

    Args:
        spec: The parsed ``loss_scale`` it starts from.

    Attributes:
        scale: The loss scale.
        tracker: Clean steps since the last growth or backoff (``_growth_tracker``).
        growth_factor: Applied after ``growth_interval`` clean steps.
        backoff_factor: Applied after an overflow.
        growth_interval: Clean steps between growths.
        min_scale: The floor of a backoff: :data:`~fp16utils._args.spec.MIN_LOSS_SCALE`,
            or the initial scale when that is lower (GradScaler has no floor: a long
            run of overflows would shrink the scale until ``1/scale`` is inf).

    Example:
        >>> from fp16utils._args.spec import TORCH_DYNAMIC
        >>> host = HostScale(TORCH_DYNAMIC._replace(init_scale=2.0))
        >>> host.back_off(), host.back_off()  # floored at 1
        (1.0, 1.0)
    """

    def __init__(self, spec: ScaleSpec) -> None:
        self.scale = spec.init_scale
        self.tracker = 0
        self.growth_factor = spec.growth_factor
        self.backoff_factor = spec.backoff_factor
        self.growth_interval = spec.growth_interval
        self.min_scale = min(MIN_LOSS_SCALE, spec.init_scale)

    def back_off(self) -> float:
        """After an overflow: GradScaler's float32 backoff, floored; return the new scale.

        Never raises the scale (a scale already below the floor stays), and
        restarts the growth count.
        """
        backed_off = to_float32(to_float32(self.scale) * self.backoff_factor)
        self.scale = shrink_scale(self.scale, backed_off, self.min_scale)
        self.tracker = 0
        return self.scale

    def count_clean(self) -> bool:
        """After a clean step: count it; grow every ``growth_interval``; say whether it grew.

        The growth is GradScaler's (float32, the scale kept where that is inf),
        never beyond :data:`~fp16utils._args.spec.MAX_LOSS_SCALE`.
        """
        self.tracker += 1
        if self.tracker != self.growth_interval:
            return False
        self.tracker = 0
        self.scale = grow_scale(self.scale, self.growth_factor, float32=True)
        return True

    def save(self) -> Tuple[float, int]:
        """What a step changes, to :meth:`restore` after a step that raised."""
        return self.scale, self.tracker

    def restore(self, saved: Tuple[float, int]) -> None:
        """Put back what :meth:`save` returned."""
        self.scale, self.tracker = saved

    def lower_floor_to_scale(self) -> None:
        """Take the current scale as the floor when it is below 1 (a scale given from outside)."""
        self.min_scale = min(MIN_LOSS_SCALE, self.scale)

    def state_dict(self) -> Dict[str, Any]:
        """``GradScaler.state_dict()``'s keys and values, read on the host."""
        return {
            'scale': self.scale,
            'growth_factor': self.growth_factor,
            'backoff_factor': self.backoff_factor,
            'growth_interval': self.growth_interval,
            '_growth_tracker': self.tracker,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a (checked) ``GradScaler.state_dict()``."""
        self.scale = float(state['scale'])
        self.tracker = int(state['_growth_tracker'])
        self.growth_factor = float(state['growth_factor'])
        self.backoff_factor = float(state['backoff_factor'])
        self.growth_interval = int(state['growth_interval'])
