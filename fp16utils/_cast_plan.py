"""Which arguments of a decorated function to cast, worked out once when it is decorated."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Collection, Iterable, Optional

import torch

from .cast import _CONVERT, _cast, _device_type

__all__ = ['CastPlan', 'cast_positional', 'check_function']

_Tensor = torch.Tensor
_SCALARS = (int, float, bool, str)


class CastPlan:
    """Which arguments of one function to cast, worked out at decoration time."""

    __slots__ = ('all_args', 'positions', 'var_from', 'names', 'all_extra_kwargs',
                 'named')

    def __init__(self, func: Callable[..., Any], apply_to: Optional[Iterable[str]],
                 decorator: str) -> None:
        check_function(func, decorator)
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError) as err:
            raise TypeError(
                f'@{decorator} needs a function with an inspectable signature; '
                f'{func!r} has none ({err}).') from None
        kinds = inspect.Parameter
        positional = [p.name for p in params
                      if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
        var_pos = next((p.name for p in params if p.kind == kinds.VAR_POSITIONAL), None)
        var_kw = next((p.name for p in params if p.kind == kinds.VAR_KEYWORD), None)
        self.named = frozenset(p.name for p in params
                               if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD))
        self.all_args = apply_to is None
        self.positions: tuple[int, ...] = ()
        self.var_from: Optional[int] = None
        self.names: frozenset[str] = frozenset()
        self.all_extra_kwargs = False
        if apply_to is None:
            return
        if isinstance(apply_to, str):  # one name (mmcv matched substrings of it)
            apply_to = (apply_to,)
        if not isinstance(apply_to, Iterable):
            raise TypeError(
                f'@{decorator}(apply_to=...) takes a list or tuple of argument names '
                f'(or None for all); got {apply_to!r} for {func.__qualname__}.')
        wanted = tuple(apply_to)
        for name in wanted:
            if not isinstance(name, str):
                raise TypeError(
                    f'@{decorator}(apply_to=...) takes argument names as strings; got '
                    f'{name!r} for {func.__qualname__}.')
            if name not in self.named and name not in (var_pos, var_kw) and var_kw is None:
                raise ValueError(
                    f'@{decorator}(apply_to={wanted!r}): {func.__qualname__}() has no '
                    f'argument {name!r}; its arguments are '
                    f'{[p.name for p in params]}.')
        self.positions = tuple(i for i, n in enumerate(positional) if n in wanted and i > 0)
        if var_pos is not None and var_pos in wanted:
            self.var_from = len(positional)
        self.names = frozenset(n for n in wanted if n not in (var_pos, var_kw))
        self.all_extra_kwargs = var_kw is not None and var_kw in wanted

    def cast(self, args: tuple, kwargs: dict, src: Collection[torch.dtype],
             dst: torch.dtype, seen: list) -> tuple[tuple, dict]:
        """Return ``(args, kwargs)`` with the planned arguments cast."""
        if self.all_args:
            new_args = (args[0], *[_cast(a, src, dst, seen) for a in args[1:]])
            if kwargs:
                kwargs = {k: _cast(v, src, dst, seen) for k, v in kwargs.items()}
            return new_args, kwargs
        if self.positions or self.var_from is not None:
            lst = list(args)
            n = len(lst)
            for i in self.positions:
                if i < n:
                    lst[i] = _cast(lst[i], src, dst, seen)
            if self.var_from is not None:
                for i in range(self.var_from, n):
                    lst[i] = _cast(lst[i], src, dst, seen)
            args = tuple(lst)
        if kwargs:
            names, extra, named = self.names, self.all_extra_kwargs, self.named
            kwargs = {k: (_cast(v, src, dst, seen)
                          if k in names or (extra and k not in named) else v)
                      for k, v in kwargs.items()}
        return args, kwargs


def check_function(func: Any, decorator: str) -> None:
    """Refuse, when applied, what the decorator cannot run as a method of a module."""
    kind = type(func)
    if kind in (staticmethod, classmethod, property):
        raise TypeError(
            f'@{decorator} decorates methods that take the module as their first '
            f'argument, not a {kind.__name__} object (it reads fp16_enabled from that '
            'argument); decorate a plain method.')
    if (inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func)
            or inspect.isasyncgenfunction(func)):
        raise TypeError(
            f'@{decorator} cannot decorate {getattr(func, "__qualname__", func)}: it is '
            'a generator or async function, whose body would run after the decorator '
            'has returned (without the casting context). Decorate a plain method that '
            'returns the result.')


def cast_positional(args: tuple, src: Collection[torch.dtype], dst: torch.dtype
                     ) -> tuple[tuple, Optional[str]]:
    """Cast the arguments after the owner: ``(args, device type of the first tensor cast)``."""
    convert = _CONVERT[dst]
    device_type = None
    changed = False
    out = [args[0]]
    for value in args[1:]:
        if isinstance(value, _Tensor):
            if value.dtype in src:
                if device_type is None:
                    device_type = 'cpu' if value.is_cpu else _device_type(value)
                value = convert(value)
                changed = True
        elif value is not None and not isinstance(value, _SCALARS):
            seen: list = []
            new = _cast(value, src, dst, seen)
            if new is not value:
                value, changed = new, True
                if device_type is None and seen:
                    device_type = seen[0]
        out.append(value)
    return (tuple(out) if changed else args), device_type
