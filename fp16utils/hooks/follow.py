"""Skip-aware runner hooks: a runner's schedule and EMA hooks that do not advance on a
skipped step (``skip_aware_hooks=True`` on the 0.x optimizer hooks and on the MMEngine
plug-in's wrappers).

A :class:`SkipLedger` counts the iterations whose optimizer step was skipped and follows
the runner's hook *instances* of the classes asked for (mmcv's LR / momentum updaters
and EMA hooks, MMEngine's ``ParamSchedulerHook`` and ``EMAHook``, subclasses included):
their train stages are set on the instances (never on a class) for the run and taken off
after it. A followed hook sees the runner through a :class:`RunnerView` whose ``iter`` is
the runner's less the iterations skipped so far, and its ``after_train_iter`` is not
called after a skipped step. So the learning rate, momentum and EMA weights are those of
a run in which the skipped iterations never happened (same schedule length), bit for bit.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .._args.skip_hooks import (
    OPTION,
    Followed,
    check_record,
    check_skip_aware_hooks,
    describe,
    follows,
    record,
)
from .runner_state import fp16_slot

__all__ = ['META_KEY', 'STAGES', 'RunnerView', 'SkipLedger', 'connect_0x', 'read_meta',
           'write_meta']

logger = logging.getLogger('fp16utils')

#: The stages a followed hook sees through the view (its other stages see the runner).
STAGES = ('before_train_epoch', 'before_train_iter', 'after_train_iter', 'after_train_epoch')
#: Where the 0.x hooks keep the record of skips: ``runner.meta['fp16'][META_KEY]``.
META_KEY = OPTION
_ABSENT = object()
#: Base classes whose do-nothing stages do not count as acting after an iteration.
_BASES = ('Hook', 'RunnerHook', 'object')


class RunnerView:
    """The runner as a followed hook sees it: ``iter`` less the skipped iterations.

    Every other attribute is the runner's (read and set through), ``isinstance``
    holds for the runner's classes, and ``overrides`` replace attributes (an
    ``OptimWrapperDict`` entry's skipped schedulers left out of ``param_schedulers``).

    Args:
        runner: The runner.
        iteration: What ``iter`` reads.
        overrides: Attributes read from here instead of the runner.

    Example:
        >>> class R: iter, epoch = 7, 1
        >>> view = RunnerView(R(), 5)
        >>> view.iter, view.epoch, isinstance(view, R)
        (5, 1, True)
    """

    __slots__ = ('_runner', '_iter', '_overrides')

    def __init__(self, runner: Any, iteration: int,
                 overrides: Optional[Mapping[str, Any]] = None) -> None:
        object.__setattr__(self, '_runner', runner)
        object.__setattr__(self, '_iter', iteration)
        object.__setattr__(self, '_overrides', dict(overrides or {}))

    @property
    def iter(self) -> int:
        """The runner's iteration less the iterations skipped before it."""
        return self._iter

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - isinstance(view, Runner) holds
        return type(self._runner)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, '_overrides')
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, '_runner'), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._runner, name, value)

    def __repr__(self) -> str:
        return f'RunnerView({self._runner!r}, iter={self._iter})'


def _acts_after_iteration(hook: Any) -> bool:
    """Whether ``hook``'s class does something in ``after_train_iter`` (or ``after_iter``)."""
    return any(('after_train_iter' in vars(klass) or 'after_iter' in vars(klass))
               for klass in type(hook).__mro__ if klass.__name__ not in _BASES)


def _priority(hook: Any) -> str:
    priority = getattr(hook, 'priority', None)
    name = getattr(priority, 'name', None)  # mmcv's and MMEngine's Priority enum
    return name if isinstance(name, str) else str(priority)


class SkipLedger:
    """The iterations skipped so far in one run, and the runner's hooks that follow them.

    Args:
        owner: Who took the option (for messages).
        followed: The hook classes to follow, as ``check_skip_aware_hooks`` returns them.
        strict: Each entry of ``followed`` must match a hook of the runner (a list the
            user gave); ``True``'s defaults need not.

    Example:
        >>> ledger = SkipLedger.parse(True, 'Fp16OptimizerHook', ('EMAHook',))
        >>> ledger.skipped_iters, SkipLedger.parse(False, 'x', ()) is None
        (0, True)
    """

    def __init__(self, owner: str, followed: Followed, strict: bool) -> None:
        self.owner = owner
        self.followed = followed
        self.strict = strict
        self._count = 0  # iterations skipped so far, as of self._record
        self._last = (-1, 0)  # the iteration of the last skip, and its length
        self._record: Any = _ABSENT  # the record the count was read from or written as
        self._read: Optional[Callable[[], Any]] = None
        self._write: Optional[Callable[[Any], None]] = None
        self._where = ''
        self._runner: Optional[Callable[[], Any]] = None
        self._hooks: List[Tuple[Any, Dict[str, Any]]] = []
        self._skipped_at: Optional[int] = None  # runner.iter of the last skipped iteration
        self._partial: Tuple[Optional[int], Dict[str, Any]] = (None, {})

    @classmethod
    def parse(cls, value: Any, owner: str, defaults: Sequence[str]) -> Optional[SkipLedger]:
        """A ledger for the option's ``value`` (None: off); see ``check_skip_aware_hooks``."""
        followed = check_skip_aware_hooks(value, owner, defaults)
        return None if followed is None else cls(owner, followed, strict=value is not True)

    def __getstate__(self) -> Dict[str, Any]:
        # A copy (deepcopy, pickle: the hook that holds it) follows no run.
        state = self.__dict__.copy()
        state.update(_runner=None, _hooks=[], _read=None, _write=None, _skipped_at=None,
                     _partial=(None, {}), _record=_ABSENT)
        return state

    # -- the run -----------------------------------------------------------------------------

    @property
    def runner(self) -> Any:
        """The runner connected (None when none is)."""
        return None if self._runner is None else self._runner()

    @property
    def hooks(self) -> List[Any]:
        """The hooks followed in the current run, in the runner's order."""
        return [hook for hook, _ in self._hooks]

    def connect(self, runner: Any, hooks: Iterable[Any], stepper: Any = None) -> None:
        """Follow the hooks of ``runner`` that match (and only those), until :meth:`disconnect`.

        ``stepper``: the optimizer hook that takes the steps in ``after_train_iter``
        (0.x); a followed hook that acts after an iteration before it is an error.

        Raises:
            ValueError: A class named in a list given matches none of the runner's
                hooks, or a followed hook acts after an iteration before ``stepper``.
        """
        self.disconnect()
        hooks = list(hooks)
        chosen = [h for h in hooks if h is not stepper and follows(type(h), self.followed)]
        if self.strict:
            missing = [e for e in self.followed
                       if not any(follows(type(h), (e,)) for h in chosen)]
            if missing:
                raise ValueError(
                    f'{self.owner}: {OPTION} names {describe(tuple(missing))}, which none of '
                    f"the runner's hooks is; its hooks are "
                    f'{", ".join(type(h).__name__ for h in hooks) or "none"}.')
        at = next((i for i, h in enumerate(hooks) if h is stepper), None)
        if stepper is not None and at is not None:
            early = [h for h in hooks[:at]
                     if any(h is c for c in chosen) and _acts_after_iteration(h)]
            if early:
                names = ', '.join(f'{type(h).__name__} (priority {_priority(h)})' for h in early)
                raise ValueError(
                    f'{self.owner}: {OPTION}: {names} acts after each iteration before '
                    f'{type(stepper).__name__} (priority {_priority(stepper)}) has stepped, so '
                    'it cannot know whether the step is skipped; register it with a lower '
                    "priority (e.g. priority='NORMAL'), or leave it out of the list.")
        self._runner = weakref.ref(runner)
        self._skipped_at, self._partial = None, (None, {})
        shown = (f'{", ".join(type(h).__name__ for h in chosen)} (they do not advance on a '
                 'skipped step)' if chosen else
                 f"no hook (none of the runner's hooks is {describe(self.followed)})")
        (getattr(runner, 'logger', None) or logger).info('%s: %s: following %s', self.owner,
                                                         OPTION, shown)
        ref = weakref.ref(self)
        for hook in chosen:
            saved = {stage: hook.__dict__.get(stage, _ABSENT) for stage in STAGES}
            for stage in STAGES:
                original = getattr(hook, stage, None)
                if callable(original):
                    hook.__dict__[stage] = _followed_stage(ref, stage, original)
            self._hooks.append((hook, saved))

    def disconnect(self) -> None:
        """Give the followed hooks back their own stages; follow nothing."""
        for hook, saved in self._hooks:
            for stage, previous in saved.items():
                if previous is _ABSENT:
                    hook.__dict__.pop(stage, None)
                else:
                    hook.__dict__[stage] = previous
        self._hooks = []
        self._runner = None

    def take(self, runner: Any, saved: Any, where: str) -> None:
        """Count from the record a run saved (``saved``, read from ``where``; None: none).

        The record's last skip is not counted when its iteration runs again (mmcv's
        ``IterBasedRunner`` resumes at the iteration its checkpoint was written in).

        Raises:
            ValueError: ``saved`` is not such a record (nothing is changed then).
        """
        done = int(getattr(runner, 'iter', 0) or 0)
        log = getattr(runner, 'logger', None) or logger
        if saved is None:
            if done:
                log.warning('%s: %s: the run starts at iteration %d, but %s holds no record of '
                            'skipped iterations (a checkpoint written without the option, or a '
                            'resume that did not restore it); the followed hooks count skips '
                            'from here.', self.owner, OPTION, done, where)
            count, last = 0, (-1, 0)
        else:
            count, at, length = check_record(saved, where, self.owner)
            last = (at, length)
            if at >= done:  # that iteration runs again: its skip is decided again
                count, last = count - length, (-1, 0)
            if not done:  # a run from the start (a record left from another run: not ours)
                count = 0
            elif count > done:
                log.warning('%s: %s: %s counts %d skipped iterations, more than the %d the run '
                            'starts after (a resume that changed the iteration); counting %d.',
                            self.owner, OPTION, where, count, done, done)
                count = done
        self._count, self._last, self._record = count, last, saved

    def start(self, read: Callable[[], Any], write: Callable[[Any], None], where: str) -> None:
        """Keep the record in the run: ``read()`` at each use (a resume may replace it),
        ``write(record)`` at each skip, and now (so that each checkpoint holds one)."""
        self._read, self._write, self._where = read, write, where
        self._save()

    def _save(self) -> None:
        self._record = record(self._count, *self._last)
        if self._write is not None:
            self._write(self._record)

    @property
    def skipped_iters(self) -> int:
        """Iterations whose step was skipped so far (all those of a skipped window).

        Raises:
            ValueError: A resume brought a record that is not one.
        """
        runner, read = self.runner, self._read
        if runner is not None and read is not None:
            saved = read()
            if saved is not self._record:  # a resume replaced it
                self.take(runner, saved, self._where)
        return self._count

    # -- each iteration ----------------------------------------------------------------------

    def skipped(self, runner: Any, iterations: int = 1) -> None:
        """This iteration's step was skipped; ``iterations``: those of its window (>= 1)."""
        self._count = self.skipped_iters + iterations
        self._last = (int(runner.iter), iterations)
        self._skipped_at = runner.iter
        self._save()

    def partly_skipped(self, runner: Any, overrides: Mapping[str, Any]) -> None:
        """Some steps of this iteration were skipped: its ``after_train_iter`` view reads
        ``overrides`` (the schedulers of the stepped entries only)."""
        self._partial = (runner.iter, dict(overrides))

    def is_skipped(self, runner: Any) -> bool:
        """Whether the current iteration's step was skipped."""
        return self._skipped_at is not None and self._skipped_at == runner.iter

    def view(self, runner: Any, stage: str) -> RunnerView:
        """The runner as a followed hook sees it at ``stage``."""
        at, overrides = self._partial
        if stage != 'after_train_iter' or at != runner.iter:
            overrides = {}
        return RunnerView(runner, runner.iter - self.skipped_iters, overrides)


def _followed_stage(ref: Callable[[], Optional[SkipLedger]], stage: str,
                    original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a hook's bound stage) as the ledger ``ref`` makes it run."""

    def stage_fn(runner: Any, *args: Any, **kwargs: Any) -> Any:
        ledger = ref()
        if ledger is None or ledger.runner is not runner:  # another runner: as it was
            return original(runner, *args, **kwargs)
        if stage == 'after_train_iter' and ledger.is_skipped(runner):
            return None
        return original(ledger.view(runner, stage), *args, **kwargs)

    stage_fn.__wrapped__ = original  # type: ignore[attr-defined]
    stage_fn.__name__ = stage
    return stage_fn


def read_meta(runner: Any) -> Any:
    """The record in ``runner.meta['fp16']`` (None: none)."""
    meta = getattr(runner, 'meta', None)
    fp16 = meta.get('fp16') if isinstance(meta, Mapping) else None
    return fp16.get(META_KEY) if isinstance(fp16, Mapping) else None


def write_meta(runner: Any, saved: Any) -> None:
    """Put the record in ``runner.meta['fp16']`` (saved with each checkpoint of the run)."""
    fp16_slot(runner)[META_KEY] = saved


def connect_0x(ledger: SkipLedger, runner: Any, stepper: Any) -> None:
    """Start a 0.x run: the record in ``runner.meta['fp16']``, follow ``runner.hooks``.

    Called by the optimizer hook ``stepper`` first thing in its ``before_run``, so that a
    refused setting (a bad record, a hook that acts too early) changes nothing. The
    record is read at each use: a hook that resumes in its own ``before_run`` (mmcv's
    ``EMAHook(resume_from=...)``) brings the saved one back.
    """
    where = f"runner.meta['fp16']['{META_KEY}']"
    saved = read_meta(runner)
    if saved is not None:
        check_record(saved, where, ledger.owner)
    hooks = getattr(runner, 'hooks', ())
    ledger.connect(runner, hooks, stepper)  # may refuse the hooks' order
    ledger.take(runner, saved, where)
    ledger.start(functools.partial(read_meta, runner), functools.partial(write_meta, runner),
                 where)
