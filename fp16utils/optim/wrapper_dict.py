"""``OptimWrapperDict``: one optimizer wrapper per sub-model (GANs)."""

from __future__ import annotations

import contextlib
from typing import (
    Any,
    Dict,
    ItemsView,
    Iterator,
    KeysView,
    List,
    Mapping,
    Optional,
    Tuple,
    ValuesView,
)

import torch
from torch import nn

from .wrapper import OptimWrapper

__all__ = ['OptimWrapperDict']

_Tensor = torch.Tensor


class _EntryTypeError(TypeError, AssertionError):
    """An entry that is not a wrapper: a TypeError, and an AssertionError as in MMEngine."""


class OptimWrapperDict:
    """Several optimizer wrappers under names, for models with several optimizers (GANs).

    It behaves as a read-only mapping from names to wrappers. Stepping is each
    wrapper's business: ``update_params``, ``backward``, ``step`` and
    ``optim_context`` on the dict raise NotImplementedError. As in MMEngine,
    ``zero_grad()`` zeroes every entry, ``param_groups`` is ``{name:
    entry.param_groups}``, and ``get_lr()`` / ``get_momentum()`` merge the
    entries' under ``'<name>.lr'`` (``'<name>.base_lr'`` too) and
    ``'<name>.momentum'``.

    Args:
        **wrappers: One :class:`OptimWrapper` (or subclass) per name.

    Raises:
        TypeError: An entry that is not an optimizer wrapper (an AssertionError
            too, as MMEngine raises).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
        >>> wrappers = OptimWrapperDict(
        ...     generator=OptimWrapper(torch.optim.Adam(gen.parameters(), lr=1e-4)),
        ...     discriminator=OptimWrapper(torch.optim.Adam(disc.parameters(), lr=4e-4)))
        >>> sorted(wrappers.get_lr().items())
        [('discriminator.lr', [0.0004]), ('generator.lr', [0.0001])]
        >>> 'generator' in wrappers, len(wrappers)
        (True, 2)
    """

    #: What an entry must be an instance of.
    _entry_types: Tuple[type, ...] = (OptimWrapper,)

    def __init__(self, **wrappers: OptimWrapper) -> None:
        for name, wrapper in wrappers.items():
            if not isinstance(wrapper, self._entry_types):
                raise _EntryTypeError(
                    f'`OptimWrapperDict` only accepts optimizer wrappers: entry {name!r} '
                    f'must be an OptimWrapper (or AmpOptimWrapper), got '
                    f'{type(wrapper).__name__}; wrap the optimizer first, e.g. '
                    'OptimWrapper(optimizer).')
        self.optim_wrappers: Dict[str, OptimWrapper] = dict(wrappers)

    def _per_entry(self, what: str) -> NotImplementedError:
        names = list(self.optim_wrappers)
        example = names[0] if names else 'generator'
        return NotImplementedError(
            f'`{what}` should be called by each optimizer wrapper separately: this '
            f'OptimWrapperDict holds one per sub-model {names}; call it on one of them, '
            f"e.g. optim_wrapper[{example!r}].{what}(...).")

    def update_params(self, loss: _Tensor, step_kwargs: Optional[Dict[str, Any]] = None,
                      zero_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Not supported: call ``update_params`` on one entry."""
        raise self._per_entry('update_params')

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Not supported: call ``backward`` on one entry."""
        raise self._per_entry('backward')

    def step(self, **kwargs: Any) -> None:
        """Not supported: call ``step`` on one entry."""
        raise self._per_entry('step')

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the gradients of every entry (``set_to_none`` and friends pass through)."""
        for wrapper in self.optim_wrappers.values():
            wrapper.zero_grad(**kwargs)

    def optim_context(self, model: nn.Module, cache_enabled: Optional[bool] = None
                      ) -> contextlib.AbstractContextManager:
        """Not supported: use one entry's ``optim_context``."""
        raise self._per_entry('optim_context')

    @property
    def last_results(self) -> Dict[str, Any]:
        """``{name: entry.last_result}``: each entry's last :class:`~fp16utils.StepResult`.

        None for an entry that has not run an iteration yet (or keeps no result).
        """
        return {name: getattr(w, 'last_result', None) for name, w in self.optim_wrappers.items()}

    @property
    def param_groups(self) -> Dict[str, List[Dict[str, Any]]]:
        """``{name: entry.param_groups}``."""
        return {name: w.param_groups for name, w in self.optim_wrappers.items()}

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """Call :meth:`OptimWrapper.initialize_count_status` on every entry."""
        for wrapper in self.optim_wrappers.values():
            wrapper.initialize_count_status(model, init_counts, max_counts)

    def get_lr(self) -> Dict[str, List[float]]:
        """Every entry's learning rates, keyed ``'<name>.lr'`` (and ``'<name>.base_lr'``)."""
        merged = {}
        for name, wrapper in self.optim_wrappers.items():
            for key, lrs in wrapper.get_lr().items():
                merged[f'{name}.{key}'] = lrs
        return merged

    def get_momentum(self) -> Dict[str, List[float]]:
        """Every entry's momentum, keyed ``'<name>.momentum'``."""
        return {f'{name}.momentum': w.get_momentum()['momentum']
                for name, w in self.optim_wrappers.items()}

    def state_dict(self) -> Dict[str, Any]:
        """``{name: wrapper.state_dict()}``."""
        return {name: w.state_dict() for name, w in self.optim_wrappers.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load ``{name: state}``, all or nothing; an unknown name is a KeyError.

        Every entry's state is checked before any is loaded, and the optimizers
        already loaded are rolled back if a later one refuses its state.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f'OptimWrapperDict.load_state_dict() takes {{name: state}}, got '
                            f'{type(state_dict).__name__}.')
        unknown = [name for name in state_dict if name not in self.optim_wrappers]
        if unknown:
            raise KeyError(
                f'OptimWrapperDict.load_state_dict() got states for {unknown}, which are not '
                f'entries of this dict {list(self.optim_wrappers)}.')
        loads = []
        for name, state in state_dict.items():
            try:
                loads.append(self.optim_wrappers[name]._prepare_load(state))
            except (TypeError, KeyError, ValueError) as err:
                if err.args and isinstance(err.args[0], str):
                    err.args = (f'OptimWrapperDict entry {name!r}: {err.args[0]}',
                                *err.args[1:])
                raise
        done: List[Any] = []
        try:
            for load in loads:
                load.load_optimizer()
                done.append(load)
        except BaseException:
            for load in reversed(done):
                load.undo_optimizer()
            raise
        for load in loads:
            load.finish()

    def __getitem__(self, name: str) -> OptimWrapper:
        try:
            return self.optim_wrappers[name]
        except KeyError:
            raise KeyError(f'OptimWrapperDict has no entry {name!r}; its entries are '
                           f'{list(self.optim_wrappers)}.') from None

    def __contains__(self, name: object) -> bool:
        return name in self.optim_wrappers

    def __len__(self) -> int:
        return len(self.optim_wrappers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.optim_wrappers)

    def keys(self) -> KeysView[str]:
        """The entry names."""
        return self.optim_wrappers.keys()

    def values(self) -> ValuesView[OptimWrapper]:
        """The wrappers."""
        return self.optim_wrappers.values()

    def items(self) -> ItemsView[str, OptimWrapper]:
        """``(name, wrapper)`` pairs."""
        return self.optim_wrappers.items()

    def __repr__(self) -> str:
        inner = ', '.join(f'{name}={w!r}' for name, w in self.optim_wrappers.items())
        return f'OptimWrapperDict({inner})'
