"""MMEngine's validation and test loops in half precision, in the dtype the run configured.

``Fp16utilsValLoop`` and ``Fp16utilsTestLoop`` are MMEngine's ``ValLoop`` and
``TestLoop`` whose ``fp16=True`` follows the run's optimizer wrapper, as
:func:`fp16utils.evaluation.configured_precision` reads it: its dtype (also on the
CPU, where MMEngine's ``autocast`` runs bfloat16 whatever was configured), its
``fp32_modules``, and a model the legacy backend made half. ``dtype`` and
``fp32_modules`` given to the loop come first. Each ``val_step``/``test_step`` runs
inside :meth:`EvalPrecision.forward <fp16utils.evaluation.EvalPrecision.forward>`,
innermost, so MMEngine's own context around it changes nothing; the loop itself,
its hooks and the evaluator are MMEngine's.

This module never imports MMEngine (the plug-in, :mod:`fp16utils.mmengine`, is the only
importer of its framework): :class:`HalfPrecisionLoop` is the mixin the plug-in puts
before MMEngine's two loops, and registers in MMEngine's ``LOOPS``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from .._torch import dtypes
from ..fp32_modules import Fp32Modules, check_fp32_modules
from ..precision import is_auto
from .configured import configured_precision
from .context import EvalPrecision, eval_precision

__all__ = ['HalfPrecisionLoop']

_MISSING = object()


class HalfPrecisionLoop:
    """What the two loops add to MMEngine's: the precision of the steps, decided per run."""

    _step_name = ''  # 'val_step' or 'test_step'

    def __init__(self, runner: Any, dataloader: Any, evaluator: Any, fp16: bool = False,
                 dtype: Union[torch.dtype, str, None] = None,
                 fp32_modules: Fp32Modules = None) -> None:
        owner = type(self).__name__
        if not fp16 and (dtype is not None or fp32_modules is not None):
            raise ValueError(
                f'{owner}: dtype and fp32_modules set the half precision of fp16=True, and '
                f'fp16 is {fp16!r}: add fp16=True to the loop config, or drop them.')
        if dtype is not None and not is_auto(dtype):
            try:
                dtypes.resolve_dtype(dtype, full_precision=True)
            except ValueError:
                raise ValueError(
                    f"{owner}: unknown dtype {dtype!r}; expected 'float16', 'bfloat16', "
                    "'auto' or 'float32' (or None: the optimizer wrapper's).") from None
        check_fp32_modules(fp32_modules, f'{owner}(fp32_modules=...)')
        super().__init__(runner, dataloader, evaluator, fp16=fp16)  # type: ignore[call-arg]
        self.dtype = dtype
        self.fp32_modules = fp32_modules
        #: How the last run evaluated (None before the first half-precision run).
        self.precision: Optional[EvalPrecision] = None
        if fp16:
            configured_precision(runner.optim_wrapper, dtype)  # disagreeing wrappers: say so now

    def resolve_precision(self) -> EvalPrecision:
        """How this run evaluates: the loop's settings, else the optimizer wrapper's.

        Returns:
            The :class:`~fp16utils.evaluation.EvalPrecision` for ``runner.model``.

        Raises:
            ValueError: As :func:`~fp16utils.evaluation.eval_precision` raises.
        """
        runner = self.runner  # type: ignore[attr-defined]
        low, backend, modules = configured_precision(runner.optim_wrapper, self.dtype)
        kept = [*check_fp32_modules(self.fp32_modules), *check_fp32_modules(modules)]
        return eval_precision(runner.model, low, backend=backend, fp32_modules=kept or None)

    def run(self) -> dict:
        """MMEngine's run, each step inside the precision :meth:`resolve_precision` gives."""
        if not self.fp16:  # type: ignore[attr-defined]
            return super().run()  # type: ignore[misc]
        precision = self.precision = self.resolve_precision()
        self.runner.logger.info(  # type: ignore[attr-defined]
            f'{type(self).__name__}: {_describe(precision)}')
        model = self.runner.model  # type: ignore[attr-defined]
        name = self._step_name
        own = model.__dict__.get(name, _MISSING)
        model.__dict__[name] = _in_precision(getattr(model, name), precision)
        try:
            with precision.kept():
                return super().run()  # type: ignore[misc]
        finally:
            if own is _MISSING:
                model.__dict__.pop(name, None)
            else:
                model.__dict__[name] = own


def _in_precision(step: Callable[..., Any], precision: EvalPrecision) -> Callable[..., Any]:
    def step_in_precision(*args: Any, **kwargs: Any) -> Any:
        with precision.forward():
            return step(*args, **kwargs)

    return step_in_precision


def _describe(precision: EvalPrecision) -> str:
    low = dtypes.LOW_NAMES.get(precision.dtype, str(precision.dtype).replace('torch.', ''))
    how = (f'autocast on {precision.device_type}' if precision.backend == 'native'
           else 'the half model, its inputs cast')
    kept = (f', fp32_modules={precision.fp32_modules!r}' if precision.fp32_modules
            else '')
    return f'evaluating in {low} ({how}{kept})'
