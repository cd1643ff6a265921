"""``LossScaler``, mmcv's loss scaler, and the fused single-sync overflow check it uses."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping, Optional

import torch

from ._args import policy as _policy
from ._args.numbers import as_whole, check_window
from ._args.policy import POLICY_KEYS, ScalePolicy
from ._args.spec import (
    MMCV_INIT_SCALE,
    MMCV_STATE_KEYS,
    check_scale,
    check_scaler_state,
    grow_scale,
    positive_finite,
    shrink_scale,
)
from ._torch import ops, state

__all__ = ['LossScaler', 'non_finite_check_']

_F32 = torch.float32
# Per thread: device -> [found_inf, inv_scale, the value inv_scale holds].
_local = threading.local()
# (kernel, device type, dtype) that torch's fused check turned out not to support.
_no_fused_kernel: set[tuple[Any, str, torch.dtype]] = set()
# (kernel, number of tensors) for which one call over a whole CPU list failed
# (sparse gradients, another device in the list, an unsupported dtype): those
# lists go straight to the grouped path from then on.
_no_whole_list: set[tuple[Any, int]] = set()
_EMPTY: dict = {}
_dispatch_mode_active = state.dispatch_mode_active


def _flag_tensors(device: Any, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed ``found_inf`` and an ``inv_scale`` of ``factor``, reused per thread and device."""
    if _dispatch_mode_active():  # fake or meta tensors: nothing to keep
        return (torch.zeros(1, dtype=_F32, device=device),
                torch.full((1,), factor, dtype=_F32, device=device))
    entry = getattr(_local, 'table', _EMPTY).get(device)
    if entry is None:
        with torch.inference_mode(False):  # inference tensors refuse later in-place use
            entry = [torch.zeros(1, dtype=_F32, device=device),
                     torch.full((1,), factor, dtype=_F32, device=device), factor]
        _local.__dict__.setdefault('table', {})[device] = entry
        return entry[0], entry[1]
    found, inv = entry[0], entry[1]
    found.zero_()
    if entry[2] != factor:
        inv.fill_(factor)
        entry[2] = factor
    return found, inv


def non_finite_check_(tensors: list[torch.Tensor], inv_scale: Optional[float] = None, *,
                      reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                      ) -> bool:
    """Check tensors for inf/nan, multiplying them by ``inv_scale`` in the same pass.

    One fused kernel launch per (device, dtype) group and one device sync in all.

    Args:
        tensors: Dense floating-point tensors (gradients), changed in place when
            ``inv_scale`` is given.
        inv_scale: Factor to multiply by; None only checks.
        reduce: Applied to the found flag before it is read, in the same sync (an
            all-reduce, so that ranks agree); called on a CPU zero flag when
            ``tensors`` is empty.

    Returns:
        True when any tensor holds an inf or a nan.
    """
    if reduce is None:
        return _check(tensors, inv_scale, False)
    if not tensors:
        return bool(reduce(torch.zeros(1)).item())
    return _check(tensors, inv_scale, False, reduce)


def _read(flag: torch.Tensor, reduce: Any) -> bool:
    """The one sync: read ``flag`` (reduced first, when asked)."""
    return (flag if reduce is None else reduce(flag)).item() != 0


def _check(tensors: list[torch.Tensor], inv_scale: Optional[float], sparse: bool,
           reduce: Any = None) -> bool:
    """:func:`non_finite_check_`; ``sparse``: some tensors may be sparse."""
    if not tensors:
        return False
    fused = ops.fused_non_finite_check()
    if inv_scale is None and tensors[0].is_cpu:
        # The common case, a pure check of CPU tensors: one call, no grouping.
        # Whatever the kernel refuses (a sparse or non-CPU tensor, a dtype it
        # lacks) it refuses before its one pass or, multiplying by exactly 1,
        # after rewriting some tensors unchanged: the grouped path then decides.
        key = (fused, len(tensors))
        if key not in _no_whole_list:
            found, inv = _flag_tensors('cpu', 1.0)
            try:
                fused(tensors, found, inv)
            except (RuntimeError, NotImplementedError):
                _no_whole_list.add(key)
            else:
                return _read(found, reduce)
    if sparse:
        tensors = [ops.sparse_values(t) if t.is_sparse else t for t in tensors]
    return _grouped_check_(tensors, fused, 1.0 if inv_scale is None else float(inv_scale),
                           reduce)


def _grouped_check_(tensors: list[torch.Tensor], fused: Any, factor: float,
                    reduce: Any = None) -> bool:
    """The fused kernel once per (device, dtype) group; one sync in all."""
    groups = ops.group_by_device_and_dtype(tensors)
    found: dict[Any, torch.Tensor] = {}
    scales: dict[Any, torch.Tensor] = {}
    for (device, dtype), group in groups:
        if device not in found:
            found[device], scales[device] = _flag_tensors(device, factor)
        key = (fused, device.type, dtype)
        if key not in _no_fused_kernel:
            try:
                fused(group, found[device], scales[device])
                continue
            except (RuntimeError, NotImplementedError):
                # Raised at dispatch or by the kernel's up-front checks, before any
                # tensor is touched, so the group is checked (and unscaled) once below.
                _no_fused_kernel.add(key)
        _non_finite_check_slow_(group, found[device], factor)
    flags = list(found.values())
    if len(flags) == 1:
        return _read(flags[0], reduce)
    first = flags[0].device
    return _read(torch.stack([f.to(first, non_blocking=True) for f in flags]).sum(), reduce)


def _non_finite_check_slow_(tensors: list[torch.Tensor], found: torch.Tensor,
                            factor: float) -> None:
    """Unfused fallback (old torch, or a device without the fused kernel); no sync."""
    for t in tensors:
        found.add_(torch.isfinite(t).logical_not().any().to(found.dtype))
        if factor != 1.0:
            t.mul_(factor)


class LossScaler:
    """Loss scaler for float16 training, compatible with mmcv's.

    In ``'dynamic'`` mode an overflow divides the scale by ``scale_factor`` (never
    below 1, never raising a scale already below 1), and every ``scale_window``
    clean iterations since the last overflow multiply it, up to 2**127. In
    ``'static'`` mode the scale never changes; an overflow is still found, so a
    non-finite gradient is never applied. The keyword-only policy arguments (none
    of them mmcv's; their defaults are mmcv's behaviour) change the dynamic scale
    as DeepSpeed's and Megatron-LM's scalers do.

    Args:
        init_scale: Initial scale, a number in (0, 2**127]; mmcv's default, 2**32.
        mode: ``'dynamic'`` or ``'static'``.
        scale_factor: Factor of growth and backoff (>= 1 in ``'dynamic'`` mode;
            1 keeps the scale while overflows are still skipped, as mmcv's does).
        scale_window: Clean iterations between growths, a whole number >= 1
            (``2.0`` is taken as ``2``, as mmcv takes it).
        min_scale: The floor (default 1); an overflow never backs off below it.
        max_scale: The ceiling (default 2**127); growth stops there.
        hysteresis: Overflows tolerated before the scale backs off (default 1:
            every overflow backs off). A tolerated overflow still skips its step
            and restarts the growth window.
        consecutive_hysteresis: Restore the tolerance after every clean step, so
            that only overflows in a row count (default False: restored when the
            scale grows).
        at_min_scale: What an overflow that should back off does at the floor:
            ``'continue'`` (default), ``'warn'`` (log a warning) or ``'raise'``
            (FloatingPointError, the scaler unchanged).

    Raises:
        ValueError: An unknown mode, or a scale, factor, window or policy value out
            of range (a window with a fraction too: mmcv would stretch ``2.5`` to
            every 5), or policy arguments with ``mode='static'``.

    Example:
        >>> import torch
        >>> scaler = LossScaler(init_scale=8., scale_window=2)
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> p.grad = torch.tensor([16., float('inf')])
        >>> overflow = scaler.unscale_([p])
        >>> scaler.update_scale(overflow)
        >>> overflow, scaler.loss_scale
        (True, 4.0)
    """

    def __init__(self, init_scale: float = MMCV_INIT_SCALE, mode: str = 'dynamic',
                 scale_factor: float = 2., scale_window: int = 1000, *,
                 min_scale: Optional[float] = None, max_scale: Optional[float] = None,
                 hysteresis: Optional[int] = None,
                 consecutive_hysteresis: Optional[bool] = None,
                 at_min_scale: Optional[str] = None) -> None:
        if mode not in ('dynamic', 'static'):
            raise ValueError(
                f"LossScaler mode must be 'dynamic' or 'static', got {mode!r}.")
        check_scale(init_scale, 'LossScaler', 'init_scale')
        _check_positive('scale_factor', scale_factor)
        if scale_factor < 1 and mode == 'dynamic':  # it would raise the scale on overflow
            raise ValueError(
                f'LossScaler scale_factor must be >= 1 in dynamic mode (an overflow divides '
                f'the scale by it), got {scale_factor}.')
        window = check_window(scale_window, 'LossScaler', 'scale_window')
        self.cur_scale = float(init_scale)
        self.cur_iter = 0
        self.mode = mode
        self.last_overflow_iter = -1
        self.scale_factor = float(scale_factor)
        self.scale_window = window
        given = {key: value for key, value in zip(
            POLICY_KEYS, (min_scale, max_scale, hysteresis, consecutive_hysteresis,
                          at_min_scale)) if value is not None}
        self._set_policy(_policy.make_policy(
            given, 'LossScaler', static=mode == 'static', init_scale=float(init_scale)))

    def _set_policy(self, policy: ScalePolicy, left: Optional[int] = None) -> None:
        for key, value in policy._asdict().items():
            setattr(self, key, value)
        self.cur_hysteresis = policy.hysteresis if left is None else left

    @property
    def policy(self) -> ScalePolicy:
        """The scale policy (hysteresis, floor, ceiling, the action at the floor)."""
        return ScalePolicy(**{key: getattr(self, key) for key in POLICY_KEYS})

    @property
    def loss_scale(self) -> float:
        """The current scale."""
        return self.cur_scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """Return ``loss * loss_scale``."""
        return loss * self.cur_scale

    def has_overflow(self, params: Iterable[Any]) -> bool:
        """Tell whether any gradient of ``params`` holds an inf or a nan (one device sync).

        Args:
            params: Parameters; their ``.grad`` is checked (None grads skipped).

        Returns:
            True on overflow.
        """
        return _check([g for p in params if (g := p.grad) is not None], None, True)

    def unscale_(self, params: Iterable[Any]) -> bool:
        """Divide the gradients of ``params`` by the scale and check them, in one pass.

        Args:
            params: Parameters whose ``.grad`` is unscaled in place.

        Returns:
            True on overflow (the gradients are then meaningless: skip the step).
        """
        return _check([g for p in params if (g := p.grad) is not None],
                      1.0 / self.cur_scale, True)

    @staticmethod
    def _has_inf_or_nan(x: torch.Tensor) -> bool:
        """Whether ``x`` holds an inf or a nan (mmcv's static helper)."""
        return _check([x.detach()], None, True)

    def update_scale(self, overflow: bool) -> None:
        """Advance one iteration and adjust the scale (dynamic mode only).

        Args:
            overflow: Whether this iteration overflowed.
        """
        if self.mode != 'dynamic':
            return
        policy = self.policy
        if overflow:
            backs_off, left = _policy.on_overflow(self.cur_hysteresis)
            if backs_off:
                floor = _policy.floor_of(policy)
                if self.cur_scale <= floor:  # may raise: then nothing has changed
                    _policy.at_floor(policy, self.cur_scale,
                                     f'LossScaler (iteration {self.cur_iter})')
                self.cur_scale = shrink_scale(self.cur_scale,
                                              self.cur_scale / self.scale_factor, floor)
            self.cur_hysteresis = left
            self.last_overflow_iter = self.cur_iter
        else:
            grows = (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0
            if grows:
                self.cur_scale = _policy.bounded_growth(
                    self.cur_scale, grow_scale(self.cur_scale, self.scale_factor), policy)
            self.cur_hysteresis = _policy.on_clean(policy, self.cur_hysteresis, grows)
        self.cur_iter += 1

    #: :meth:`update_scale` as defined here: completes a step whose update raised.
    _advance = update_scale

    def state_dict(self) -> dict[str, Any]:
        """The scaler state, with exactly mmcv's keys (and, for a policy that is not the
        default, the policy's keys, which mmcv ignores when it loads the state)."""
        state = {key: getattr(self, key) for key in MMCV_STATE_KEYS}
        state.update(_policy.policy_state(self.policy, self.cur_hysteresis))
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict` (or by mmcv).

        Raises:
            KeyError: A key is missing.
            ValueError: An unknown key, or a value of the wrong type or range; the
                message names the key and the value. Nothing is changed on an error.
        """
        missing = [k for k in MMCV_STATE_KEYS if k not in state_dict]
        if missing:
            raise KeyError(
                f'LossScaler state is missing {missing}; expected the keys {MMCV_STATE_KEYS} '
                'as written by LossScaler.state_dict().')
        check_scaler_state(state_dict, 'LossScaler.load_state_dict()', unit_factor=True)
        saved = _policy.check_policy_state(state_dict, 'LossScaler.load_state_dict()')
        self._set_policy(*(saved or (self.policy,)))  # a state without them keeps ours
        for key in MMCV_STATE_KEYS:
            value = state_dict[key]
            if key in ('cur_scale', 'scale_factor'):
                value = float(value)
            elif key != 'mode':  # whole numbers, possibly saved as floats (2.0)
                value = as_whole(value)
            setattr(self, key, value)

    def __repr__(self) -> str:
        policy = ''.join(f', {key}={value!r}' for key, value in self.policy.given().items())
        return (f'LossScaler(cur_scale={self.cur_scale}, mode={self.mode!r}, '
                f'scale_factor={self.scale_factor}, scale_window={self.scale_window}{policy})')


def _check_positive(name: str, value: Any) -> None:
    if not positive_finite(value):
        raise ValueError(f'LossScaler {name} must be a finite number > 0, got {value!r}.')
