"""What a 0.x schedule needs from the rest of its config: the runner's horizon, base values.

mmcv's updater hooks read ``runner.max_epochs``/``runner.max_iters`` at run time; the 1.x
schedulers need them written down. :class:`Horizon` reads them (without changing the
config) and turns one policy's unit (``by_epoch``) into the 1.x scheduler's unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ['SEE', 'Horizon', 'NoForm', 'base_value', 'read_horizon']

#: The page every schedule message points to.
SEE = 'docs/migration/schedule.md'


class NoForm(Exception):
    """A 0.x schedule (or one of its values) with no 1.x form; the text says why."""

    def __init__(self, text: str, section: str = 'no-1x-form') -> None:
        """``text``: the reason, starting with the key; ``section``: the doc anchor."""
        super().__init__(text)
        self.text = text
        self.section = section


def _count(value: Any) -> Optional[int]:
    """``value`` when it is an int >= 1 (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


@dataclass(frozen=True)
class Horizon:
    """The training length as the 0.x runner saw it.

    Attributes:
        kind: ``'epoch'`` (EpochBasedRunner), ``'iter'`` (IterBasedRunner and its kin) or
            ``None`` (no runner, no ``total_epochs``/``total_iters``).
        epochs: ``max_epochs`` (epoch-based runner), or None.
        iters: ``max_iters`` (iteration-based runner), or None.
    """

    kind: Optional[str]
    epochs: Optional[int]
    iters: Optional[int]

    def unit(self, by_epoch: bool, needs_length: bool,
             where: str) -> tuple[Optional[int], bool, bool]:
        """``(length, by_epoch, convert_to_iter_based)`` of the 1.x scheduler for ``by_epoch``.

        ``length`` counts the 1.x scheduler's steps (epochs when by_epoch, iterations
        otherwise); with ``convert_to_iter_based`` the scheduler is written in epochs and
        MMEngine's Runner turns it into iterations (the epoch-based runner's policy
        ``by_epoch=False``, whose ``max_iters`` is only known at run time).
        """
        if by_epoch:
            if self.kind == 'iter':
                raise NoForm(f'{where}: by_epoch=True under an iteration-based runner: mmcv '
                             'never called the hook at epoch starts there (the schedule did '
                             'not run); set by_epoch=False and convert again',
                             'horizons')
            if needs_length and self.epochs is None:
                raise NoForm(f'{where}: the policy reads runner.max_epochs, and the config '
                             'has neither runner.max_epochs nor total_epochs; add the runner '
                             'and convert again', 'horizons')
            return self.epochs, True, False
        if self.kind == 'iter':
            if needs_length and self.iters is None:
                raise NoForm(f'{where}: the policy reads runner.max_iters, and the config has '
                             'neither runner.max_iters nor total_iters; add them and convert '
                             'again', 'horizons')
            return self.iters, False, False
        if self.kind == 'epoch' and needs_length:
            if self.epochs is None:
                raise NoForm(f'{where}: the policy reads runner.max_iters (max_epochs x '
                             'iterations per epoch), and the config has no max_epochs; add '
                             'the runner and convert again', 'horizons')
            return self.epochs, True, True
        if needs_length:
            raise NoForm(f'{where}: the policy reads runner.max_iters, and the config has no '
                         'runner (nor total_iters); add the runner and convert again',
                         'horizons')
        return None, False, False


def read_horizon(out: Mapping[str, Any]) -> Horizon:
    """The 0.x training length: ``runner`` first, else ``total_epochs``/``total_iters``."""
    runner = out.get('runner')
    total_iters = _count(out.get('total_iters'))
    total_epochs = _count(out.get('total_epochs'))
    if isinstance(runner, Mapping):
        kind = str(runner.get('type', ''))
        if 'IterBased' in kind or (not kind and 'max_iters' in runner):
            # mmedit/mmgen passed total_iters to runner.run(), which wins over max_iters
            return Horizon('iter', None, total_iters or _count(runner.get('max_iters')))
        if 'EpochBased' in kind or (not kind and 'max_epochs' in runner):
            return Horizon('epoch', _count(runner.get('max_epochs')) or total_epochs, None)
    if total_iters is not None:
        return Horizon('iter', None, total_iters)
    if total_epochs is not None:
        return Horizon('epoch', total_epochs, None)
    return Horizon(None, None, None)


def base_value(out: Mapping[str, Any], name: str) -> tuple[float, bool]:
    """The optimizer's ``lr``/``momentum`` (Adam's ``betas[0]``): ``(value, found)``.

    Values read off the 1.x ``optim_wrapper`` (the optimizer pass ran first) or the 0.x
    ``optimizer``; a per-submodule optimizer dict gives its first entry. Not found:
    ``(1.0, False)`` for lr, ``(0.9, False)`` for momentum.
    """
    default = 1.0 if name == 'lr' else 0.9
    wrapper = out.get('optim_wrapper')
    opt: Any = wrapper.get('optimizer') if isinstance(wrapper, Mapping) else None
    if opt is None:
        opt = out.get('optimizer')
    if isinstance(opt, Mapping) and 'type' not in opt:
        firsts = [v for v in opt.values() if isinstance(v, Mapping)]
        opt = firsts[0] if firsts else None
    if isinstance(wrapper, Mapping) and opt is None:
        firsts = [v.get('optimizer') for v in wrapper.values() if isinstance(v, Mapping)]
        opt = next((o for o in firsts if isinstance(o, Mapping)), None)
    if not isinstance(opt, Mapping):
        return default, False
    value = opt.get(name)
    if name == 'momentum' and value is None:
        betas = opt.get('betas')
        value = betas[0] if isinstance(betas, (list, tuple)) and betas else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value), True
    return default, False
