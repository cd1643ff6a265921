"""Private GradScaler, optimizer and dispatch state, each read behind a named helper."""

from __future__ import annotations

from typing import Any

import torch

from .factory import make_grad_scaler


def optimizer_handles_unscaling(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` unscales and skips by itself (fused optimizers' private flag)."""
    return bool(getattr(optimizer, '_step_supports_amp_scaling', False))


def grad_scaler_started(scaler: Any) -> bool:
    """Whether ``scaler`` has scaled a loss yet (its private ``_scale`` is made then)."""
    return getattr(scaler, '_scale', True) is not None


def grad_scaler_found_inf(scaler: Any, optimizer: Any) -> dict[Any, torch.Tensor]:
    """The per-device found-inf flags ``scaler.unscale_(optimizer)`` recorded (reading syncs)."""
    return scaler._found_inf_per_device(optimizer)


#: The GradScaler class that :func:`make_grad_scaler` builds on this torch.
_GRAD_SCALER: type = getattr(torch.amp, 'GradScaler', None) or (
    torch.cuda.amp.GradScaler)


class ObservedGradScaler(_GRAD_SCALER):  # type: ignore[misc, valid-type]
    """A GradScaler that counts outside ``load_state_dict``/``update`` calls (copies are plain)."""

    # Whoever mirrors the scale on the host can tell its mirror is stale; fp16utils' own
    # calls go through quiet_grad_scaler_update / quiet_grad_scaler_load.
    _fp16utils_changes = 0
    _fp16utils_check: Any = None

    def load_state_dict(self, state_dict: Any) -> None:
        if self._fp16utils_check is not None:
            self._fp16utils_check(state_dict)
        super().load_state_dict(state_dict)
        self._fp16utils_changes += 1

    def update(self, new_scale: Any = None) -> None:
        if new_scale is not None and self._fp16utils_check is not None:
            value = new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale
            self._fp16utils_check(dict(self.state_dict(), scale=value))
        super().update(new_scale)
        self._fp16utils_changes += 1

    def _fp16utils_plain_state(self) -> dict[str, Any]:
        state = self.__getstate__()
        state.pop('_fp16utils_changes', None)
        state.pop('_fp16utils_check', None)
        return state

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _plain_grad_scaler, (_GRAD_SCALER, self._fp16utils_plain_state())

    def __deepcopy__(self, memo: Any) -> Any:
        import copy

        state = copy.deepcopy(self._fp16utils_plain_state(), memo)
        return _plain_grad_scaler(_GRAD_SCALER, state)


def _plain_grad_scaler(cls: type, state: dict[str, Any]) -> Any:
    scaler = cls.__new__(cls)
    scaler.__setstate__(state)
    return scaler


def make_observed_grad_scaler(device_type: str, check: Any = None,
                              **kwargs: Any) -> ObservedGradScaler:
    """``make_grad_scaler(...)``, observed; ``check(state)`` raises to refuse a state."""
    return observed_grad_scaler(make_grad_scaler(device_type, **kwargs), check)


def observed_grad_scaler(scaler: Any, check: Any = None) -> ObservedGradScaler:
    """An :class:`ObservedGradScaler` taking over the state of ``scaler`` (held by nobody else)."""
    observed = ObservedGradScaler.__new__(ObservedGradScaler)
    observed.__dict__.update(vars(scaler))
    if check is not None:
        observed._fp16utils_check = check
    return observed


def grad_scaler_changes(scaler: Any) -> int:
    """How many outside ``load_state_dict``/``update`` calls ``scaler`` had (0: not observed)."""
    return getattr(scaler, '_fp16utils_changes', 0)


def _version(tensor: Any) -> int:
    """``tensor._version`` (0 for None: a GradScaler's lazy tensors start from its init values)."""
    return 0 if tensor is None else tensor._version


def grad_scaler_fingerprint(scaler: Any) -> Any:
    """What any change to a GradScaler's state changes, read on the host (no sync)."""
    # Private attributes and tensor version counters; unreadable: an object equal to nothing.
    attrs = getattr(scaler, '__dict__', {})
    try:
        interval = attrs['_growth_interval']
        return (_version(attrs['_scale']), _version(attrs['_growth_tracker']),
                attrs['_init_scale'], attrs['_init_growth_tracker'], attrs['_growth_factor'],
                attrs['_backoff_factor'], interval, type(interval))
    except (KeyError, AttributeError, RuntimeError):
        return object()


def quiet_grad_scaler_update(scaler: Any, new_scale: Any = None) -> None:
    """``scaler.update(new_scale)`` without counting it as an outside change."""
    if isinstance(scaler, ObservedGradScaler):
        _GRAD_SCALER.update(scaler, new_scale)
    else:
        scaler.update(new_scale)


def quiet_grad_scaler_load(scaler: Any, state: Any) -> None:
    """``scaler.load_state_dict(state)`` without counting it as an outside change."""
    if isinstance(scaler, ObservedGradScaler):
        _GRAD_SCALER.load_state_dict(scaler, state)
    else:
        scaler.load_state_dict(state)


def reset_grad_scaler_step(scaler: Any) -> None:
    """Forget what ``scaler`` recorded this iteration (as ``update()`` does), keeping the scale."""
    states = getattr(scaler, '_per_optimizer_states', None)
    if states is not None:
        states.clear()


_dispatch_stack_len = torch._C._len_torch_dispatch_stack


def dispatch_mode_active() -> bool:
    """Whether a torch dispatch mode (fake or meta tensors, tracing) is on."""
    return bool(_dispatch_stack_len())
