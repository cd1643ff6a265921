"""How an MMEngine ``Runner`` meets the ``skip_aware_hooks`` of the plug-in's wrappers.

A wrapper never sees the runner, so the first wrapper made with the option wraps the
runner class's ``call_hook`` (:func:`install`; once per process, given the class: this
module imports no framework). The wrapped ``call_hook`` does what it did, and for a
runner whose ``optim_wrapper`` asks for the option (every entry of a dict alike) it also
follows the runner's hooks from ``before_run`` to ``after_run``: it compares the
wrappers' step counters around each iteration to tell a skipped step, and keeps the
count of skipped iterations in the runner's ``MessageHub`` (saved with the checkpoint,
restored by ``resume``). Runners whose wrapper does not ask are left as they were.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from .._args.skip_hooks import MMENGINE_FOLLOWED, OPTION
from ..engine.window import window_length
from .follow import SkipLedger

__all__ = ['HUB_KEY', 'connected', 'install', 'uninstall']

#: The ``MessageHub`` runtime-info key of the record of skipped iterations.
HUB_KEY = 'fp16_skip_aware_hooks'
_ORIGINAL = '__fp16utils_original__'


class _Run:
    """One runner's followed run: the ledger, the wrappers, their counters at the start."""

    def __init__(self, ledger: SkipLedger, entries: Dict[str, Any]) -> None:
        self.ledger = ledger
        self.entries = entries
        self.before: Dict[str, Tuple[int, int]] = {}


#: runner -> its run (held weakly: a runner gone takes its run along).
_RUNS: weakref.WeakKeyDictionary[Any, _Run] = weakref.WeakKeyDictionary()
#: The wrappers a running runner follows (what :func:`connected` reads).
_FOLLOWED: weakref.WeakSet[Any] = weakref.WeakSet()


def connected(wrapper: Any) -> bool:
    """Whether a runner's run follows ``wrapper``'s steps now."""
    return wrapper in _FOLLOWED


def _entries(optim_wrapper: Any) -> Dict[str, Any]:
    """``{name: wrapper}`` of a dict, ``{'': wrapper}`` of one wrapper."""
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    return dict(wrappers) if isinstance(wrappers, dict) else {'': optim_wrapper}


def _setting(wrapper: Any) -> Any:
    value = getattr(wrapper, OPTION, False)
    return False if value is None else value


def _connect(runner: Any) -> None:
    _disconnect(runner)
    entries = _entries(getattr(runner, 'optim_wrapper', None))
    settings = {name: _setting(w) for name, w in entries.items()}
    asked = [value for value in settings.values() if value is not False]
    if not asked:
        return
    owner = type(next(w for w in entries.values() if _setting(w) is not False)).__name__
    if len(asked) != len(settings) or any(value != asked[0] for value in asked):
        shown = ', '.join(f'{name}: {value!r}' for name, value in settings.items())
        raise ValueError(
            f'{owner}: {OPTION} follows the runner\'s hooks for the whole OptimWrapperDict, '
            f'so every entry must be an fp16utils wrapper with the same setting; got {shown}.')
    ledger = SkipLedger.parse(asked[0], owner, MMENGINE_FOLLOWED)
    if ledger is None:  # an entry's setting changed to None since it was checked
        return
    ledger.connect(runner, getattr(runner, 'hooks', ()))
    _RUNS[runner] = _Run(ledger, entries)
    _FOLLOWED.update(entries.values())


def _disconnect(runner: Any) -> None:
    run = _RUNS.pop(runner, None)
    if run is not None:
        run.ledger.disconnect()
        for wrapper in run.entries.values():
            _FOLLOWED.discard(wrapper)


def _counters(wrapper: Any) -> Tuple[int, int]:
    return wrapper.steps_taken, getattr(wrapper, 'skipped_steps', 0)


def _window(wrapper: Any) -> int:
    """The iterations of the accumulation window that ``wrapper``'s last step closed."""
    return window_length(wrapper.accumulative_counts, wrapper.max_counts,
                         wrapper.inner_count - 1)


def _start(runner: Any, run: _Run) -> None:
    """At ``before_train`` (after any resume): the record the checkpoint saved, if any."""
    hub = runner.message_hub
    where = f"the MessageHub's runtime info {HUB_KEY!r}"
    run.ledger.take(runner, hub.get_info(HUB_KEY), where)
    run.ledger.start(functools.partial(hub.get_info, HUB_KEY),
                     functools.partial(hub.update_info, HUB_KEY), where)


def _end_iteration(runner: Any, run: _Run) -> None:
    """At ``after_train_iter``: which wrappers skipped and which stepped in this iteration."""
    skipped, stepped = [], False
    for name, wrapper in run.entries.items():
        taken, skips = _counters(wrapper)
        taken_before, skips_before = run.before.get(name, (taken, skips))
        stepped = stepped or taken > taken_before
        if skips > skips_before:
            skipped.append(name)
    if not skipped:
        return
    if not stepped:
        run.ledger.skipped(runner, max(_window(run.entries[name]) for name in skipped))
        return
    schedulers = getattr(runner, 'param_schedulers', None)
    if isinstance(schedulers, dict):  # the stepped entries' schedulers step, the others not
        run.ledger.partly_skipped(runner, {'param_schedulers': {
            name: value for name, value in schedulers.items() if name not in skipped}})


def _follow_call(call_hook: Callable[..., Any]) -> Callable[..., Any]:
    """``Runner.call_hook``, with the followed runs' bookkeeping around it."""

    @functools.wraps(call_hook)
    def wrapper(self: Any, fn_name: str, **kwargs: Any) -> Any:
        if fn_name == 'before_run':
            _connect(self)
        run = _RUNS.get(self)
        if run is not None:
            if fn_name == 'before_train':
                _start(self, run)
            elif fn_name == 'before_train_iter':
                run.before = {name: _counters(w) for name, w in run.entries.items()}
            elif fn_name == 'after_train_iter':
                _end_iteration(self, run)
        try:
            return call_hook(self, fn_name, **kwargs)
        finally:
            if fn_name == 'after_run':
                _disconnect(self)

    setattr(wrapper, _ORIGINAL, call_hook)
    return wrapper


def install(runner_cls: type) -> bool:
    """Wrap ``runner_cls.call_hook`` (once); True when this call wrapped it."""
    current: Optional[Callable[..., Any]] = runner_cls.__dict__.get('call_hook')
    if current is None or getattr(current, _ORIGINAL, None) is not None:
        return False
    runner_cls.call_hook = _follow_call(current)  # type: ignore[attr-defined]
    return True


def uninstall(runner_cls: type) -> bool:
    """Put ``runner_cls.call_hook`` back; True when it was wrapped."""
    original = getattr(runner_cls.__dict__.get('call_hook'), _ORIGINAL, None)
    if original is None:
        return False
    runner_cls.call_hook = original  # type: ignore[attr-defined]
    return True
