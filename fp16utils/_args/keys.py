"""Unknown keyword arguments and config keys, named in one line with the accepted ones."""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

__all__ = ['FP16_HOOK_ARGS', 'UnknownKeyError', 'unknown_keys_message']

#: What ``Fp16OptimizerHook`` takes, so what a 0.x config's ``fp16`` dict may hold
#: (mmdet 2.x passes it as ``Fp16OptimizerHook(**optimizer_config, **fp16)``).
FP16_HOOK_ARGS = ('loss_scale', 'grad_clip', 'coalesce', 'bucket_size_mb', 'distributed',
                  'dtype', 'backend', 'nonfinite', 'overflow_guard', 'agree_across_ranks',
                  'skip_aware_hooks')


class UnknownKeyError(TypeError):
    """A keyword argument or config key that is not taken (a TypeError, as Python's own)."""


def unknown_keys_message(owner: str, unknown: Iterable[object], accepted: Sequence[str]) -> str:
    """``owner got the unknown key 'x' (did you mean 'y'?); it takes a, b``."""
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), accepted, n=1)
        named.append(f'{key!r}' + (f' (did you mean {close[0]!r}?)' if close else ''))
    noun = 'key' if len(named) == 1 else 'keys'
    return f'{owner} got the unknown {noun} {", ".join(named)}; it takes {", ".join(accepted)}'
