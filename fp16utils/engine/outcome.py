"""Step outcomes: what one ``update_params`` / ``step`` call did, as a small immutable record.

Example:
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> engine = StepEngine(clip=('norm', {'max_norm': 10.0}))
    >>> engine.backward(p.sum())
    >>> result = take_step(engine, torch.optim.SGD([p], lr=1.0), step=1, kwargs={})
    >>> result.stepped, result.scale, round(result.grad_norm, 4)
    (True, None, 1.4142)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch

from .base import StepEngine

__all__ = ['StepResult', 'accumulating_result', 'take_step']

_Norm = Union[torch.Tensor, float, None]
_FIELDS = ('stepped', 'skipped', 'accumulating', 'scale', 'grad_norm')


class StepResult:
    """What one optimizer-wrapper iteration did: stepped, skipped or accumulated.

    Exactly one of :attr:`stepped`, :attr:`skipped` and :attr:`accumulating`
    is True. Results are immutable, compare equal field by field, hash,
    pickle, and cost no device synchronisation to make: the gradient norm is
    kept as the 0-dim tensor the clipping returned and converted to a float
    (one sync) the first time :attr:`grad_norm` is read, then cached.

    Args:
        stepped: The optimizer stepped: the parameters changed.
        skipped: The gradients held an inf or a nan and the update was
            skipped: parameters and optimizer state are unchanged.
        accumulating: The gradients were accumulated; the optimizer steps at
            the end of the accumulation window.
        scale: The loss scale this iteration's gradients were multiplied by
            (for a step: the scale of the window's backward passes, before a
            skip backs it off or a growth raises it); None when nothing is
            scaled (float32, bfloat16, scaling disabled).
        grad_norm: The total gradient norm when this step clipped by norm
            (a 0-dim tensor or a float; inf or nan when a skipped step was
            clipped first), else None.

    Example:
        >>> r = StepResult(stepped=True, scale=1024.0, grad_norm=torch.tensor(2.0))
        >>> r.stepped, r.skipped, r.scale, r.grad_norm
        (True, False, 1024.0, 2.0)
        >>> r == StepResult(stepped=True, scale=1024.0, grad_norm=2.0)
        True
    """

    __slots__ = ('stepped', 'skipped', 'accumulating', 'scale', '_norm')

    stepped: bool
    skipped: bool
    accumulating: bool
    scale: Optional[float]

    def __init__(self, stepped: bool = False, skipped: bool = False,
                 accumulating: bool = False, scale: Optional[float] = None,
                 grad_norm: _Norm = None) -> None:
        if int(stepped) + int(skipped) + int(accumulating) != 1:
            raise ValueError(
                f'StepResult: exactly one of stepped, skipped and accumulating must be True, '
                f'got stepped={stepped!r}, skipped={skipped!r}, accumulating={accumulating!r}.')
        if grad_norm is not None and not isinstance(grad_norm, torch.Tensor):
            grad_norm = float(grad_norm)
        setter = object.__setattr__
        setter(self, 'stepped', bool(stepped))
        setter(self, 'skipped', bool(skipped))
        setter(self, 'accumulating', bool(accumulating))
        setter(self, 'scale', None if scale is None else float(scale))
        setter(self, '_norm', grad_norm)

    @property
    def grad_norm(self) -> Optional[float]:
        """The total gradient norm of a norm-clipped step, or None (one sync on first read)."""
        norm = self._norm
        if isinstance(norm, torch.Tensor):
            norm = float(norm)
            object.__setattr__(self, '_norm', norm)
        return norm

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (reads :attr:`grad_norm`).

        Example:
            >>> StepResult(accumulating=True).to_dict()['accumulating']
            True
        """
        return {name: getattr(self, name) for name in _FIELDS}

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f'StepResult is immutable: cannot set {name!r}; make a new one.')

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f'StepResult is immutable: cannot delete {name!r}.')

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepResult):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple:
        return (StepResult, self._key())

    def __repr__(self) -> str:
        fields = ', '.join(f'{name}={getattr(self, name)!r}' for name in _FIELDS)
        return f'StepResult({fields})'


def _scale(engine: StepEngine) -> Optional[float]:
    return engine.loss_scale if engine.enabled else None


def take_step(engine: StepEngine, optimizer: torch.optim.Optimizer, step: int,
              kwargs: Mapping[str, Any],
              done: Optional[Callable[[StepResult], None]] = None) -> StepResult:
    """Step ``optimizer`` through ``engine`` and say what happened (no extra device sync).

    Args:
        engine: The step engine.
        optimizer: The optimizer to step.
        step: The iteration number, for the engine's records and messages.
        kwargs: Keyword arguments of ``optimizer.step``.
        done: The wrapper's (or hook's) bookkeeping, called with the result; also
            when the step raises after the optimizer applied the update (the
            exception then goes on), so that its counters match the weights.

    Returns:
        The :class:`StepResult` of the step (stepped or skipped).

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1))
        >>> take_step(StepEngine(), torch.optim.SGD([p], lr=1.0), 1, {}).stepped
        True
    """
    scale = _scale(engine)
    before = engine.grad_norm
    try:
        skipped = engine.step(optimizer, step, kwargs)
    except BaseException:
        if done is not None and engine.committed is not None:
            norm = engine.grad_norm
            done(StepResult(stepped=True, scale=scale, grad_norm=None if norm is before else norm))
        raise
    norm = engine.grad_norm
    result = StepResult(stepped=not skipped, skipped=skipped, scale=scale,
                        grad_norm=None if norm is before else norm)
    if done is not None:
        done(result)
    return result


def accumulating_result(engine: StepEngine) -> StepResult:
    """The :class:`StepResult` of an iteration that only accumulated gradients.

    Example:
        >>> accumulating_result(StepEngine())
        StepResult(stepped=False, skipped=False, accumulating=True, scale=None, grad_norm=None)
    """
    return StepResult(accumulating=True, scale=_scale(engine))
