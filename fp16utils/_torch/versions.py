"""The torch version and the backend it implies: native AMP or the legacy emulation.

Tests simulate an old torch by patching :data:`TORCH_VERSION` and calling
``decisions.refresh()``; nothing else in the package compares versions.
"""

from __future__ import annotations

import os

import torch
from packaging.version import InvalidVersion, Version

from .tracing import is_compiling as _is_compiling

__all__ = ['BACKENDS', 'BACKEND_ENV', 'TORCH_VERSION', 'backend_reason', 'default_backend',
           'digit_version', 'forget', 'has_native_amp', 'resolve_backend']

TORCH_VERSION: str = str(torch.__version__)  # a plain str (dynamo hashes it as a key)
"""The running torch's version string, e.g. ``'2.13.0+cpu'`` (tests patch it)."""

#: Environment variable that forces a backend for the whole process.
BACKEND_ENV = 'FP16UTILS_BACKEND'

#: The backends this package knows.
BACKENDS = ('native', 'legacy')

_NATIVE_AMP_MIN = (1, 6, 0, 0, 0, 0)

# Caches, decided at import and again by refresh(): the default backend (or why the
# environment names none); version -> has native AMP. A dynamo trace only reads them.
_default: str | None = None
_default_error: str | None = None
_native_cache: dict[str, bool] = {}


def digit_version(version_str: str, length: int = 4) -> tuple[int, ...]:
    """Turn a version string into a tuple of ints that orders correctly.

    Pre-releases sort before the release (``1.6.0rc1 < 1.6.0``), post-releases
    after it, and local labels (``+cu121``) are ignored.

    Args:
        version_str: A PEP 440 version, e.g. ``'2.1.0+cu121'`` or ``'1.6.0rc1'``.
        length: How many release numbers to keep (padded with zeros).

    Returns:
        A tuple of ``length + 2`` ints.

    Raises:
        ValueError: If ``version_str`` is not a version.

    Example:
        >>> digit_version('1.6.0rc1') < digit_version('1.6.0')
        True
    """
    try:
        version = Version(str(version_str))
    except InvalidVersion:
        raise ValueError(
            f'digit_version() got {version_str!r}, which is not a PEP 440 version '
            "string; pass something like '2.1.0' or '1.6.0rc1'.") from None
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f'digit_version() needs an int length >= 1, got {length!r}.')
    release = list(version.release[:length])
    release += [0] * (length - len(release))
    if version.pre is not None:
        kind = {'a': -3, 'b': -2, 'rc': -1}[version.pre[0]]
        return (*release, kind, version.pre[1])
    if version.post is not None:
        return (*release, 1, version.post)
    if version.dev is not None:
        return (*release, -4, version.dev)
    return (*release, 0, 0)


def has_native_amp(version: str | None = None) -> bool:
    """Tell whether torch has native automatic mixed precision (torch >= 1.6).

    Args:
        version: A torch version to judge; defaults to :data:`TORCH_VERSION`.

    Returns:
        True when ``torch.autocast`` style AMP is available.

    Example:
        >>> has_native_amp('1.5.0'), has_native_amp('1.13.1')
        (False, True)
    """
    version = TORCH_VERSION if version is None else version
    cached = _native_cache.get(version)
    if cached is None:
        if _is_compiling():  # no version parsing inside a trace: what compiles has AMP
            return True
        cached = version != 'parrots' and (
            digit_version(version, length=3)[:3] >= _NATIVE_AMP_MIN[:3])
        _native_cache[version] = cached
    return cached


def resolve_backend(backend: str | None = None) -> str:
    """``backend`` checked (unknown, or native without AMP: ValueError); None: the default."""
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise ValueError(
            f'Unknown fp16utils backend {backend!r}; expected one of {BACKENDS} '
            'or None for the automatic choice.')
    if backend == 'native' and not has_native_amp():
        raise ValueError(
            f"backend='native' needs torch >= 1.6 but torch is {TORCH_VERSION}; use "
            "backend='legacy' or leave it as None.")
    return backend


def default_backend() -> str:
    """The process-wide backend: env ``FP16UTILS_BACKEND``, else the one torch's version implies."""
    backend = _default
    if backend is not None:
        return backend
    if _is_compiling():  # the environment is never read inside a trace
        if _default_error is not None:
            raise ValueError(_default_error)
        return 'native' if has_native_amp() else 'legacy'  # not kept: refresh() decides
    return _decide_default()


def _decide_default() -> str:
    """Read the environment and keep the default backend (or why there is none)."""
    global _default, _default_error
    try:
        env = os.environ.get(BACKEND_ENV) or None
        if env is not None:
            env = env.strip().lower()
            if env not in BACKENDS:
                raise ValueError(
                    f'{BACKEND_ENV}={env!r} is not a backend; set it to one of {BACKENDS} '
                    'or unset it.')
            backend = resolve_backend(env)
        else:
            backend = 'native' if has_native_amp() else 'legacy'
    except ValueError as err:
        _default_error = str(err)
        raise
    _default, _default_error = backend, None
    return backend


def backend_reason() -> str:
    """Why :func:`default_backend` chose what it did, in one sentence."""
    env = os.environ.get(BACKEND_ENV)
    if env:
        return f'{BACKEND_ENV}={env} is set in the environment'
    if has_native_amp():
        return f'torch {TORCH_VERSION} has native AMP (torch.autocast + GradScaler)'
    return f'torch {TORCH_VERSION} is older than 1.6 and has no native AMP'


def forget() -> None:
    """Forget the default backend and the native-AMP answers (``refresh()`` decides them again)."""
    global _default, _default_error
    _default = _default_error = None
    _native_cache.clear()
