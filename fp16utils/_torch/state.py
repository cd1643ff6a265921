"""Private GradScaler, optimizer and dispatch state, each read behind a named helper.

The other private reads live with their concept (:mod:`.ops`, :mod:`.tracing`,
:mod:`.models`, :mod:`.autocast`); none is outside :mod:`fp16utils._torch`.

Each helper says what it relies on and falls back to public behaviour where it can.

Example:
    >>> import torch
    >>> from fp16utils._torch.state import optimizer_handles_unscaling
    >>> optimizer_handles_unscaling(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))
    False
"""

from __future__ import annotations

from typing import Any

import torch

from .factory import make_grad_scaler  # noqa: F401  (the examples use it)


def optimizer_handles_unscaling(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` unscales and skips by itself (``fused=True`` optimizers).

    Relies on the private ``_step_supports_amp_scaling`` flag that torch's
    fused optimizers set (torch >= 2.0); False where it is absent.

    Example:
        >>> optimizer_handles_unscaling(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
        ...                                              lr=1.0))
        False
    """
    return bool(getattr(optimizer, '_step_supports_amp_scaling', False))


def grad_scaler_started(scaler: Any) -> bool:
    """Whether ``scaler`` has scaled a loss yet (made its scale tensor).

    Relies on GradScaler's private ``_scale`` attribute (None until the
    first ``scale()``); a scaler without it counts as started.

    Example:
        >>> scaler = make_grad_scaler('cpu')
        >>> before = grad_scaler_started(scaler)
        >>> _ = scaler.scale(torch.ones(1))
        >>> before, grad_scaler_started(scaler)
        (False, True)
    """
    return getattr(scaler, '_scale', True) is not None


def grad_scaler_found_inf(scaler: Any, optimizer: Any) -> dict[Any, torch.Tensor]:
    """The per-device found-inf flags that ``scaler.unscale_(optimizer)`` recorded.

    Uses GradScaler's private ``_found_inf_per_device`` (or, on older torch,
    its ``_per_optimizer_states``). Call it after ``unscale_`` and before
    ``update``; the flags are device tensors (reading them syncs).

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([p], lr=1.0)
        >>> scaler = make_grad_scaler('cpu')
        >>> scaler.scale(p.sum()).backward(); scaler.unscale_(opt)
        >>> [bool(flag) for flag in grad_scaler_found_inf(scaler, opt).values()]
        [False]
    """
    getter = getattr(scaler, '_found_inf_per_device', None)
    if getter is not None:
        return getter(optimizer)
    return scaler._per_optimizer_states[id(optimizer)]['found_inf_per_device']


#: The GradScaler class that :func:`make_grad_scaler` builds on this torch.
_GRAD_SCALER: type = getattr(getattr(torch, 'amp', None), 'GradScaler', None) or (
    torch.cuda.amp.GradScaler)


class ObservedGradScaler(_GRAD_SCALER):  # type: ignore[misc, valid-type]
    """A GradScaler that counts the state changes made to it from outside fp16utils.

    ``load_state_dict`` and ``update`` (with or without ``new_scale``: code that
    drives the scaler itself, as a 0.x hook's own ``after_train_iter`` does)
    bump the count that :func:`grad_scaler_changes` reads, so that whoever
    mirrors the scale on the host (to read it without a device sync) can tell
    that its mirror is stale. fp16utils makes its own calls through
    :func:`quiet_grad_scaler_update` / :func:`quiet_grad_scaler_load`. A
    pickled or deep-copied one is a plain GradScaler again (nobody watches it).
    Make one with :func:`make_observed_grad_scaler`.
    """

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
    """:func:`make_grad_scaler`, as an :class:`ObservedGradScaler`.

    Args:
        device_type: The device the gradients live on.
        check: Called with each state loaded from outside (and with the state
            an outside ``update(new_scale)`` would make) before it is applied;
            it raises to refuse it. None: no check.
        **kwargs: :func:`make_grad_scaler`'s arguments.

    Example:
        >>> scaler = make_observed_grad_scaler('cpu', init_scale=8.0)
        >>> scaler.load_state_dict(dict(scaler.state_dict(), scale=4.0))
        >>> grad_scaler_changes(scaler), scaler.get_scale()
        (1, 4.0)
    """
    return observed_grad_scaler(make_grad_scaler(device_type, **kwargs), check)


def observed_grad_scaler(scaler: Any, check: Any = None) -> ObservedGradScaler:
    """An :class:`ObservedGradScaler` that takes over the state of ``scaler``.

    For a plain GradScaler that nobody else holds: one just made, or one
    that came back plain from ``pickle`` (the two share their scale tensors).

    Example:
        >>> observed_grad_scaler(make_grad_scaler('cpu', init_scale=8.0)).get_scale()
        8.0
    """
    observed = ObservedGradScaler.__new__(ObservedGradScaler)
    observed.__dict__.update(vars(scaler))
    if check is not None:
        observed._fp16utils_check = check
    return observed


def grad_scaler_changes(scaler: Any) -> int:
    """How many outside ``load_state_dict`` / ``update`` calls ``scaler`` had.

    Counted by an :class:`ObservedGradScaler`; 0 for any other scaler (see
    :func:`grad_scaler_fingerprint` for those).
    """
    return getattr(scaler, '_fp16utils_changes', 0)


def _version(tensor: Any) -> int:
    """``tensor._version`` (0 for None: a GradScaler's lazy tensors start from its init values)."""
    return 0 if tensor is None else tensor._version


def grad_scaler_fingerprint(scaler: Any) -> Any:
    """What any change to a GradScaler's state changes, read on the host (no sync).

    For a GradScaler given from outside, which counts nothing: two equal
    fingerprints mean that nobody loaded a state into it or updated it in
    between. Relies on the private ``_scale`` and ``_growth_tracker`` tensors
    (their in-place version counters: ``update`` and ``load_state_dict`` change
    them in place) and the private ``_init_scale``, ``_init_growth_tracker``,
    ``_growth_factor``, ``_backoff_factor`` and ``_growth_interval``. Where
    those cannot be read (another scaler class, inference tensors), a new
    object that equals nothing: the state is then re-read every time.

    Example:
        >>> scaler = make_grad_scaler('cpu', init_scale=8.0)
        >>> before = grad_scaler_fingerprint(scaler)
        >>> _ = scaler.scale(torch.ones(1))  # makes the scale tensor: no change
        >>> same = grad_scaler_fingerprint(scaler) == before
        >>> scaler.update(4.0)
        >>> same, grad_scaler_fingerprint(scaler) == before
        (True, False)
    """
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
    """Forget what ``scaler`` recorded in this iteration (unscaled optimizers, found-inf flags).

    What ``update()`` does at its end, without changing the scale: after an
    iteration that raised, the next ``unscale_`` then runs again. Clears the
    private ``_per_optimizer_states`` (every entry starts READY again); a
    scaler without it is left as it is.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([p], lr=1.0)
        >>> scaler = make_grad_scaler('cpu')
        >>> scaler.scale(p.sum()).backward(); scaler.unscale_(opt)
        >>> reset_grad_scaler_step(scaler); scaler.unscale_(opt)  # no "already called"
    """
    states = getattr(scaler, '_per_optimizer_states', None)
    if states is not None:
        states.clear()


_dispatch_stack_len = getattr(torch._C, '_len_torch_dispatch_stack', None)


def dispatch_mode_active() -> bool:
    """Whether a torch dispatch mode (fake or meta tensors, tracing) is on.

    Reads torch's private ``torch._C._len_torch_dispatch_stack``; False where
    torch lacks it (no dispatch modes there).

    Example:
        >>> dispatch_mode_active()
        False
    """
    return bool(_dispatch_stack_len is not None and _dispatch_stack_len())
