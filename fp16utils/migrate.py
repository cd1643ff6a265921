"""Move a 0.x fp16 codebase to the 1.x style: configs, the ``--amp`` switch, and code.

Four tools, all plain functions that need neither torch nor mmcv:

* :func:`convert_config` turns a 0.x training config (``fp16``, ``optimizer``,
  ``optimizer_config``, ``runner.fp16_loss_scaler``, the GAN ``train_cfg`` steps)
  into a 1.x one built around ``optim_wrapper``. :func:`convert_config_report`
  does the same and returns the list of problems instead of warning.
* :func:`enable_amp` is the ``--amp`` switch: it turns the wrapper(s) of a 1.x
  config into ``AmpOptimWrapper``.
* :func:`scan` finds every 0.x fp16 usage in a source tree (imports from mm*
  packages, decorators, ``fp16_enabled``, fp16 config keys).
* :func:`fix_imports` rewrites the imports of the 0.x fp16 names to
  ``from fp16utils import ...`` so the code runs without mmcv, and leaves
  everything else in the files as it was.

Example:
    >>> cfg = dict(
    ...     optimizer=dict(type='SGD', lr=0.02, momentum=0.9),
    ...     optimizer_config=dict(grad_clip=dict(max_norm=35, norm_type=2)),
    ...     fp16=dict(loss_scale=512.),
    ... )
    >>> convert_config(cfg)['optim_wrapper']  # doctest: +NORMALIZE_WHITESPACE
    {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'SGD', 'lr': 0.02, 'momentum': 0.9},
     'loss_scale': 512.0, 'clip_grad': {'max_norm': 35, 'norm_type': 2}}
"""

from __future__ import annotations

import ast
import copy
import difflib
import io
import math
import os
import tokenize
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = [
    'ConfigConversionError',
    'FileChange',
    'Finding',
    'MigrationWarning',
    'convert_config',
    'convert_config_report',
    'enable_amp',
    'fix_imports',
    'scan',
]


class MigrationWarning(UserWarning):
    """A part of a config or codebase that could not be migrated safely.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter('always')
        ...     _ = convert_config({'optimizer': dict(generator=dict(type='Adam')),
        ...                         'train_cfg': dict(disc_steps=5, batch_accumulation_steps=2)})
        >>> caught[0].category is MigrationWarning
        True
    """


class ConfigConversionError(ValueError):
    """Raised by ``convert_config(cfg, strict=True)`` when a key cannot be converted safely.

    Attributes:
        problems: one human-readable line per problem, each starting with the key.

    Example:
        >>> try:
        ...     convert_config({'fp16': dict(loss_scale='huge')}, strict=True)
        ... except ConfigConversionError as err:
        ...     err.problems[0].startswith('fp16')
        True
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = '\n'.join(f'  - {p}' for p in self.problems)
        super().__init__(
            f'the config cannot be converted safely ({len(self.problems)} problem(s)):\n'
            f'{lines}\n'
            'Fix these keys in the 0.x config, or call convert_config(cfg, strict=False) '
            'to get the partial result with a MigrationWarning per problem.'
        )


# --------------------------------------------------------------------------------------
# Config conversion
# --------------------------------------------------------------------------------------

_MISSING: Any = object()

#: mmcv optimizer hooks whose behaviour the 1.x wrappers cover.
_FP16_HOOKS = frozenset({'Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook'})
_CUMULATIVE_HOOKS = frozenset(
    {'GradientCumulativeOptimizerHook', 'GradientCumulativeFp16OptimizerHook'}
)
_KNOWN_HOOKS = _FP16_HOOKS | _CUMULATIVE_HOOKS | {'OptimizerHook', 'DistOptimizerHook'}

#: Hook arguments that only drove mmcv's own gradient all-reduce (done by the DDP
#: wrapper in 1.x) or its debugging aids; dropped, with a problem when not default.
_OBSOLETE_HOOK_ARGS = {
    'coalesce': True,
    'bucket_size_mb': -1,
    'distributed': True,
    'detect_anomalous_params': False,
}

#: mmcv's default ``loss_scale`` of ``Fp16OptimizerHook`` (a static scale).
_MMCV_DEFAULT_LOSS_SCALE = 512.0
#: mmcv ``LossScaler``'s default ``init_scale``.
_MMCV_DEFAULT_INIT_SCALE = float(2**32)

_GRAD_SCALER_ARGS = frozenset(
    {'init_scale', 'growth_factor', 'backoff_factor', 'growth_interval', 'enabled'}
)
_WRAPPER_TYPES = frozenset({'OptimWrapper', 'AmpOptimWrapper'})
_GAN_STEP_KEYS = ('disc_steps', 'gen_steps', 'batch_accumulation_steps')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _convert_loss_scale(value: Any, where: str, problems: list[str]) -> Any:
    """Translate a 0.x ``loss_scale`` into the value ``AmpOptimWrapper`` takes."""
    expected = "expected a positive number (static scale), 'dynamic', or a dict of scaler arguments"
    if isinstance(value, str):
        if value == 'dynamic':
            return 'dynamic'
        problems.append(f'{where}: {value!r} is not understood; {expected}; kept as is, fix it')
        return value
    if _is_number(value):
        if not (math.isfinite(value) and value > 0):
            problems.append(f'{where}: {value!r} is not a usable scale; {expected}; kept as is')
            return value
        return float(value)
    if not isinstance(value, Mapping):
        problems.append(
            f'{where}: got {type(value).__name__} {value!r}; {expected}; kept as is, fix it'
        )
        return value

    args = dict(value)
    mode = args.pop('mode', 'dynamic')
    if mode == 'static':
        ignored = sorted(k for k in args if k != 'init_scale')
        if ignored:
            problems.append(
                f"{where}: {', '.join(ignored)}: ignored with mode='static', so dropped; "
                'remove them from the 0.x config'
            )
        if 'init_scale' not in args:
            problems.append(
                f"{where}: mode='static' without init_scale means mmcv's default static "
                'scale 2**32, which overflows on almost every step; it was kept, but set '
                "a smaller loss_scale (e.g. 512.) or use 'dynamic'"
            )
        init = args.get('init_scale', _MMCV_DEFAULT_INIT_SCALE)
        if not (_is_number(init) and math.isfinite(init) and init > 0):
            problems.append(f'{where}.init_scale: {init!r} is not a positive number; kept as is')
            return init
        return float(init)
    if mode != 'dynamic':
        problems.append(
            f"{where}.mode: {mode!r} is not 'static' or 'dynamic'; the scaler arguments "
            'were kept as is; fix the mode'
        )
        return dict(value)

    out: dict[str, Any] = {}
    for key, val in args.items():
        if key == 'scale_factor':
            if 'growth_factor' in args or 'backoff_factor' in args:
                problems.append(
                    f'{where}: both scale_factor (mmcv) and growth_factor/backoff_factor '
                    '(GradScaler) are given; the GradScaler values were kept and '
                    'scale_factor dropped; keep only one spelling'
                )
                continue
            if not (_is_number(val) and val > 1):
                problems.append(
                    f'{where}.scale_factor: {val!r} is not a number > 1; kept as is, fix it'
                )
                out[key] = val
                continue
            out['growth_factor'] = val
            out['backoff_factor'] = 1 / val
        elif key == 'scale_window':
            if 'growth_interval' in args:
                problems.append(
                    f'{where}: both scale_window (mmcv) and growth_interval (GradScaler) '
                    'are given; growth_interval was kept and scale_window dropped'
                )
                continue
            out['growth_interval'] = val
        elif key in _GRAD_SCALER_ARGS:
            out[key] = val
        else:
            problems.append(
                f'{where}.{key}: not an argument of mmcv LossScaler or torch GradScaler; '
                'kept as is, remove or rename it'
            )
            out[key] = val
    # Keep the documented order: init_scale, growth_factor, backoff_factor, ...
    order = ['init_scale', 'growth_factor', 'backoff_factor', 'growth_interval', 'enabled']
    return {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else 99)}


def _optimizer_layout(opt: Any) -> Optional[str]:
    """'single' for ``dict(type=...)``, 'multi' for ``dict(name=dict(type=...), ...)``."""
    if not isinstance(opt, Mapping) or not opt:
        return None
    if 'type' in opt:
        return 'single'
    if all(isinstance(v, Mapping) and 'type' in v for v in opt.values()):
        return 'multi'
    return None


class _ConfigConverter:
    """One pass of the 0.x -> 1.x conversion over a deep copy of the config."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.out: dict[str, Any] = copy.deepcopy(dict(cfg))
        self.problems: list[str] = []
        self.drop: set[str] = set()

    def problem(self, text: str) -> None:
        self.problems.append(text)

    # -- the parts ----------------------------------------------------------------

    def _read_fp16(self) -> tuple[bool, Any]:
        """Read the ``fp16`` key: (is fp16 on, loss_scale or _MISSING)."""
        if 'fp16' not in self.out:
            return False, _MISSING
        fp16 = self.out['fp16']
        if fp16 is None:
            self.drop.add('fp16')
            return False, _MISSING
        if not isinstance(fp16, Mapping):
            self.problem(
                f'fp16: expected dict(loss_scale=...) or None, got {fp16!r}; left untouched '
                'and fp16 NOT enabled; fix the key or call enable_amp() on the result'
            )
            return False, _MISSING
        unknown = {k: v for k, v in fp16.items() if k != 'loss_scale'}
        if unknown:
            self.problem(
                f'fp16: {", ".join(sorted(unknown))} not understood (only loss_scale is); '
                'left in the fp16 key; port them by hand'
            )
            self.out['fp16'] = unknown
        else:
            self.drop.add('fp16')
        return True, fp16.get('loss_scale', _MISSING)

    def _read_runner(self) -> tuple[bool, Any]:
        """Read ``runner.fp16_loss_scaler`` (MMEditing/MMGeneration 0.x)."""
        runner = self.out.get('runner')
        if not isinstance(runner, Mapping):
            return False, _MISSING
        if runner.get('use_apex_amp'):
            self.problem(
                'runner.use_apex_amp: apex AMP has no 1.x config equivalent and was left '
                'untouched; AmpOptimWrapper (native torch AMP) replaces it: remove the key '
                'and call enable_amp() on the converted config'
            )
        if 'fp16_loss_scaler' not in runner:
            return False, _MISSING
        scaler = runner['fp16_loss_scaler']
        runner = dict(runner)
        del runner['fp16_loss_scaler']
        if runner:
            self.out['runner'] = runner
        else:
            self.drop.add('runner')
        if not scaler:  # the 0.x runners enable the scaler only when it is truthy
            return False, _MISSING
        return True, scaler

    def _read_hook(self, fp16_elsewhere: bool) -> dict[str, Any]:
        """Read ``optimizer_config``: what it contributes to the wrapper."""
        found: dict[str, Any] = {'fp16': False}
        if 'optimizer_config' not in self.out:
            return found
        hook = self.out['optimizer_config']
        if hook is None:
            self.drop.add('optimizer_config')
            return found
        if not isinstance(hook, Mapping):
            self.problem(
                f'optimizer_config: expected a dict of optimizer hook arguments, got {hook!r}; '
                'left untouched'
            )
            return found
        hook_type = hook.get('type', 'OptimizerHook')
        if hook_type not in _KNOWN_HOOKS:
            self.problem(
                f'optimizer_config.type: {hook_type!r} is not an mmcv optimizer hook '
                f'({", ".join(sorted(_KNOWN_HOOKS))}); left untouched; port its step logic '
                'to a custom OptimWrapper by hand'
            )
            return found
        found['fp16'] = hook_type in _FP16_HOOKS
        fp16_on = found['fp16'] or fp16_elsewhere
        leftover: dict[str, Any] = {}
        for key, val in hook.items():
            where = f'optimizer_config.{key}'
            if key == 'type':
                continue
            if key == 'grad_clip':
                if val is None:
                    continue
                if isinstance(val, Mapping):
                    found['clip_grad'] = dict(val)
                else:
                    self.problem(
                        f'{where}: expected dict(max_norm=..., norm_type=...) or None, got '
                        f'{val!r}; left in optimizer_config'
                    )
                    leftover[key] = val
            elif key == 'cumulative_iters' and hook_type in _CUMULATIVE_HOOKS:
                if _is_positive_int(val):
                    if val > 1:
                        found['accumulative_counts'] = val
                else:
                    self.problem(
                        f'{where}: expected an int >= 1, got {val!r}; left in optimizer_config'
                    )
                    leftover[key] = val
            elif key == 'loss_scale' and fp16_on:
                found['loss_scale'] = val
            elif key in _OBSOLETE_HOOK_ARGS:
                if val != _OBSOLETE_HOOK_ARGS[key]:
                    self.problem(
                        f'{where}={val!r} has no 1.x equivalent (gradients are all-reduced '
                        'by the DDP model wrapper in 1.x) and was dropped'
                    )
            else:
                self.problem(
                    f'{where}: not an argument that {hook_type} understands here; left in '
                    'optimizer_config; port it by hand'
                )
                leftover[key] = val
        if leftover:
            self.out['optimizer_config'] = {'type': hook_type, **leftover}
        else:
            self.drop.add('optimizer_config')
        return found

    def _wrapper_entry(
        self, opt: Mapping[str, Any], where: str, amp: bool, extras: dict[str, Any]
    ) -> dict[str, Any]:
        """Build one wrapper dict (single wrapper or one entry of a multi config)."""
        optimizer = dict(opt)
        entry: dict[str, Any] = {}
        if amp or where == 'optimizer':
            entry['type'] = 'AmpOptimWrapper' if amp else 'OptimWrapper'
        paramwise = optimizer.pop('paramwise_cfg', _MISSING)
        constructor = optimizer.pop('constructor', _MISSING)
        entry['optimizer'] = optimizer
        entry.update(extras)
        if paramwise is not _MISSING:
            entry['paramwise_cfg'] = paramwise
        if constructor is not _MISSING and constructor != 'DefaultOptimizerConstructor':
            entry['constructor'] = constructor
            self.problem(
                f'{where}.constructor: {constructor!r} was moved to the optim_wrapper, but '
                '1.x constructors build optimizer wrappers and have another interface; '
                'port the constructor class to an OptimWrapper constructor'
            )
        return entry

    def _gan_steps(self, wrapper: Optional[dict[str, Any]], layout: Optional[str]) -> None:
        """``train_cfg.disc_steps/gen_steps/batch_accumulation_steps`` -> 1.x keys."""
        train_cfg = self.out.get('train_cfg')
        if not isinstance(train_cfg, Mapping) or not any(k in train_cfg for k in _GAN_STEP_KEYS):
            return
        values = {k: train_cfg.get(k, 1) for k in _GAN_STEP_KEYS}
        bad = [k for k, v in values.items() if not _is_positive_int(v)]
        if bad:
            self.problem(
                f'train_cfg: {", ".join(f"{k}={values[k]!r}" for k in bad)} must be ints >= 1; '
                'the GAN step keys were left in train_cfg; fix them and convert again'
            )
            return
        model = self.out.get('model', _MISSING)
        if model is _MISSING:
            model = {}
        elif not isinstance(model, Mapping):
            self.problem(
                f'model: expected a dict to receive discriminator_steps/generator_steps, got '
                f'{type(model).__name__}; the GAN step keys were left in train_cfg'
            )
            return
        disc, gen, accum = (values[k] for k in _GAN_STEP_KEYS)
        disc_steps = disc // accum
        if disc % accum:
            disc_steps = max(1, disc_steps)
            self.problem(
                f'train_cfg.disc_steps: {disc} is not a multiple of batch_accumulation_steps='
                f'{accum}; 0.x counted disc_steps in train_step calls, i.e. {disc / accum:g} '
                'discriminator updates per cycle, but 1.x counts whole updates; '
                f'model.discriminator_steps was set to {disc_steps}: check it, or make '
                'disc_steps a multiple of batch_accumulation_steps'
            )
        model = dict(model)
        for key, val in (('generator_steps', gen), ('discriminator_steps', disc_steps)):
            if key in model and model[key] != val:
                self.problem(
                    f'model.{key}: already {model[key]!r} but train_cfg gives {val!r}; the '
                    'model value was kept; reconcile the two'
                )
            else:
                model[key] = val
        self.out['model'] = model

        new_train_cfg = {k: v for k, v in train_cfg.items() if k not in _GAN_STEP_KEYS}
        if accum > 1:
            entries = _wrapper_entries(wrapper, layout) if wrapper is not None else []
            if not entries:
                new_train_cfg['batch_accumulation_steps'] = accum
                self.problem(
                    f'train_cfg.batch_accumulation_steps: there is no optimizer to carry '
                    f'accumulative_counts={accum}; it was left in train_cfg; set '
                    f'accumulative_counts={accum} on each optim_wrapper entry by hand'
                )
            for name, entry in entries:
                have = entry.get('accumulative_counts', _MISSING)
                if have is not _MISSING and have != accum:
                    self.problem(
                        f'{name}.accumulative_counts: already {have!r} (optimizer_config.'
                        f'cumulative_iters) but train_cfg.batch_accumulation_steps is {accum}; '
                        'the first was kept; reconcile the two'
                    )
                    continue
                # Right after the type (first when there is none), as 1.x configs write it.
                items = [(k, v) for k, v in entry.items() if k == 'type']
                items.append(('accumulative_counts', accum))
                items += [
                    (k, v) for k, v in entry.items() if k not in ('type', 'accumulative_counts')
                ]
                entry.clear()
                entry.update(items)
        if new_train_cfg:
            self.out['train_cfg'] = new_train_cfg
        else:
            self.drop.add('train_cfg')

    # -- the whole pass -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        out = self.out
        anchor = next(
            (k for k in ('optimizer', 'optimizer_config', 'fp16', 'runner') if k in out), None
        )
        wrapper: Optional[dict[str, Any]] = None
        layout: Optional[str] = None

        has_legacy = any(k in out for k in ('optimizer', 'optimizer_config', 'fp16')) or (
            isinstance(out.get('runner'), Mapping) and 'fp16_loss_scaler' in out['runner']
        )
        opt = out.get('optimizer', _MISSING)
        opt_layout = _optimizer_layout(opt) if opt is not _MISSING else None

        if 'optim_wrapper' in out:
            if has_legacy:
                self.problem(
                    'optim_wrapper: the config already has an optim_wrapper and also 0.x '
                    'keys (optimizer/optimizer_config/fp16/runner.fp16_loss_scaler); the 0.x '
                    'keys were left untouched; merge them by hand'
                )
            wrapper = out['optim_wrapper'] if isinstance(out['optim_wrapper'], dict) else None
            layout = _wrapper_layout(wrapper) if wrapper is not None else None
        elif opt is not _MISSING and opt_layout is None:
            self.problem(
                "optimizer: expected dict(type='SGD', ...) or one dict with a 'type' per "
                f'submodule (generator=dict(type=...), ...), got {opt!r}; the optimizer and '
                'fp16 keys were left untouched; fix the optimizer and convert again'
            )
        elif has_legacy:
            wrapper, layout = self._convert_optimizer(opt, opt_layout)

        self._gan_steps(wrapper, layout)

        result: dict[str, Any] = {}
        for key, val in out.items():
            if key == anchor and wrapper is not None and 'optim_wrapper' not in out:
                result['optim_wrapper'] = wrapper
            if key in self.drop:
                continue
            result[key] = val
        if wrapper is not None and 'optim_wrapper' not in result:
            result['optim_wrapper'] = wrapper
        return result

    def _convert_optimizer(
        self, opt: Any, opt_layout: Optional[str]
    ) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        fp16_key_on, fp16_scale = self._read_fp16()
        runner_on, runner_scale = self._read_runner()
        hook = self._read_hook(fp16_elsewhere=fp16_key_on or runner_on)
        amp = fp16_key_on or runner_on or hook['fp16']

        extras: dict[str, Any] = {}
        if amp:
            candidates = [
                (where, val)
                for where, val in (
                    ('fp16.loss_scale', fp16_scale),
                    ('optimizer_config.loss_scale', hook.get('loss_scale', _MISSING)),
                    ('runner.fp16_loss_scaler', runner_scale),
                )
                if val is not _MISSING
            ]
            converted = [(w, _convert_loss_scale(v, w, self.problems)) for w, v in candidates]
            if converted:
                chosen_where, chosen = converted[0]
                for where, val in converted[1:]:
                    if val != chosen:
                        self.problem(
                            f'{where}: {val!r} differs from {chosen_where} ({chosen!r}); '
                            f'the {chosen_where} value was used; keep one loss scale'
                        )
            else:
                chosen = _MMCV_DEFAULT_LOSS_SCALE
            extras['loss_scale'] = chosen
        if 'clip_grad' in hook:
            extras['clip_grad'] = hook['clip_grad']
        if 'accumulative_counts' in hook:
            extras['accumulative_counts'] = hook['accumulative_counts']

        if opt_layout is not None:
            self.drop.add('optimizer')
        if opt_layout == 'single':
            return self._wrapper_entry(opt, 'optimizer', amp, extras), 'single'
        if opt_layout == 'multi':
            wrapper: dict[str, Any] = {'constructor': 'MultiOptimWrapperConstructor'}
            for name, sub in opt.items():
                wrapper[name] = self._wrapper_entry(
                    sub, f'optimizer.{name}', amp, copy.deepcopy(extras)
                )
            return wrapper, 'multi'

        # No optimizer in this config: a partial optim_wrapper, as a child config of
        # an inherited (_base_) one would write it.
        if not amp and not extras:
            return None, None
        if '_base_' not in self.out:
            self.problem(
                'optimizer: missing, so optim_wrapper has no optimizer; fine when the '
                'optimizer comes from a _base_ config (it is merged there), otherwise add '
                "optim_wrapper['optimizer'] = dict(type=..., lr=...)"
            )
        partial: dict[str, Any] = {'type': 'AmpOptimWrapper'} if amp else {}
        partial.update(extras)
        return partial, 'single'


def _wrapper_layout(wrapper: Mapping[str, Any]) -> str:
    """'multi' for a MultiOptimWrapperConstructor style optim_wrapper, else 'single'."""
    if wrapper.get('constructor') == 'MultiOptimWrapperConstructor':
        return 'multi'
    if 'optimizer' not in wrapper and 'type' not in wrapper:
        subs = [v for k, v in wrapper.items() if k not in ('constructor', 'paramwise_cfg')]
        if subs and all(isinstance(v, Mapping) and 'optimizer' in v for v in subs):
            return 'multi'
    return 'single'


def _wrapper_entries(
    wrapper: dict[str, Any], layout: Optional[str]
) -> list[tuple[str, dict[str, Any]]]:
    """(dotted name, wrapper dict) for a single wrapper or each entry of a multi one."""
    if layout == 'multi':
        return [
            (f'optim_wrapper.{name}', entry)
            for name, entry in wrapper.items()
            if name not in ('constructor', 'paramwise_cfg') and isinstance(entry, dict)
        ]
    return [('optim_wrapper', wrapper)]


def convert_config_report(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Convert a 0.x training config to 1.x and return the problems instead of warning.

    The rules are those of :func:`convert_config`; this function never warns or
    raises for a conversion problem, it lists them.

    Args:
        cfg: the 0.x config as a dict (e.g. the globals of a config file). Not modified.

    Returns:
        ``(new_cfg, problems)``: a new dict, and one line per key that could not be
        converted safely (empty when the conversion is exact).

    Example:
        >>> new, problems = convert_config_report(
        ...     dict(optimizer=dict(type='SGD', lr=0.1),
        ...          optimizer_config=dict(grad_clip='35')))
        >>> new['optim_wrapper']['type'], len(problems)
        ('OptimWrapper', 1)
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f'expected the config as a dict, got {type(cfg).__name__}; load the config file '
            'first (its top-level names as a dict) and pass that'
        )
    converter = _ConfigConverter(cfg)
    return converter.run(), converter.problems


def convert_config(cfg: Mapping[str, Any], strict: bool = False) -> dict[str, Any]:
    """Convert a 0.x (mmcv 1.x era) training config to the 1.x ``optim_wrapper`` style.

    Rules:

    * ``optimizer`` + ``optimizer_config`` (``OptimizerHook``, ``Fp16OptimizerHook``,
      ``GradientCumulative[Fp16]OptimizerHook``) + ``fp16`` become one
      ``optim_wrapper``: ``type`` is ``'AmpOptimWrapper'`` when fp16 was on, else
      ``'OptimWrapper'``; ``grad_clip`` becomes ``clip_grad``, ``cumulative_iters``
      becomes ``accumulative_counts``, ``paramwise_cfg`` moves next to the optimizer.
    * ``loss_scale``: a number stays a (static) float, ``'dynamic'`` stays; a dict in
      mmcv ``LossScaler`` names becomes GradScaler names (``scale_factor`` ->
      ``growth_factor`` and ``backoff_factor = 1 / scale_factor``, ``scale_window`` ->
      ``growth_interval``; ``mode='static'`` -> the float ``init_scale``). fp16 on
      without a loss_scale means mmcv's default, a static 512.
    * ``runner.fp16_loss_scaler`` (MMEditing/MMGeneration) becomes ``AmpOptimWrapper``
      with ``loss_scale=<that dict>``; the key leaves ``runner`` (an emptied runner goes).
    * ``optimizer = dict(generator=dict(type=...), discriminator=dict(...))`` becomes a
      ``MultiOptimWrapperConstructor`` config with one entry per submodule.
    * ``train_cfg`` ``disc_steps``/``gen_steps``/``batch_accumulation_steps`` become
      ``model.discriminator_steps = disc_steps // batch_accumulation_steps``,
      ``model.generator_steps = gen_steps`` and ``accumulative_counts`` on each wrapper;
      other train_cfg keys stay.
    * Everything else (``model`` type, ``lr_config``, ``total_epochs``, ``log_config``,
      unknown keys) is kept untouched. Model changes outside fp16 (e.g. a renamed model
      type) are not this function's business.

    Args:
        cfg: the 0.x config as a dict. It is not modified.
        strict: raise :class:`ConfigConversionError` if anything could not be
            converted safely, instead of warning.

    Returns:
        A new config dict.

    Raises:
        ConfigConversionError: with ``strict=True``, listing every problem by key.

    Warns:
        MigrationWarning: one per problem, with ``strict=False``.

    Example:
        >>> cfg = dict(optimizer=dict(type='Adam', lr=1e-3),
        ...            runner=dict(fp16_loss_scaler=dict(init_scale=512)))
        >>> convert_config(cfg)
        {'optim_wrapper': {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'Adam', \
'lr': 0.001}, 'loss_scale': {'init_scale': 512}}}
    """
    new_cfg, problems = convert_config_report(cfg)
    if problems:
        if strict:
            raise ConfigConversionError(problems)
        for text in problems:
            warnings.warn(text, MigrationWarning, stacklevel=2)
    return new_cfg


def enable_amp(cfg: Mapping[str, Any], dtype: Optional[str] = None) -> dict[str, Any]:
    """Switch a 1.x config to mixed precision: the ``--amp`` command-line switch.

    Every wrapper (the single ``optim_wrapper``, or each entry of a
    ``MultiOptimWrapperConstructor`` config) becomes ``type='AmpOptimWrapper'`` with
    ``loss_scale='dynamic'`` (a loss_scale already there is kept), and ``dtype=dtype``
    when one is given. ``'bfloat16'`` needs no loss scaling, so none is added.
    A wrapper that is already an ``AmpOptimWrapper`` is left as it is, with a warning.

    Args:
        cfg: a 1.x config (with ``optim_wrapper``). Not modified.
        dtype: ``None`` (the wrapper's default, float16), ``'float16'`` or ``'bfloat16'``.

    Returns:
        A new config dict.

    Raises:
        ValueError: no ``optim_wrapper`` (a 0.x config: run :func:`convert_config`
            first), an unknown ``dtype``, or a wrapper type other than
            ``OptimWrapper``/``AmpOptimWrapper``.

    Warns:
        MigrationWarning: for each wrapper that already was an ``AmpOptimWrapper``.

    Example:
        >>> enable_amp(dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1))))
        {'optim_wrapper': {'optimizer': {'type': 'SGD', 'lr': 0.1}, 'type': \
'AmpOptimWrapper', 'loss_scale': 'dynamic'}}
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(f'expected the config as a dict, got {type(cfg).__name__}')
    if dtype not in (None, 'float16', 'bfloat16'):
        raise ValueError(
            f"dtype must be None, 'float16' or 'bfloat16', got {dtype!r}; pass one of these "
            'names as a string'
        )
    if not isinstance(cfg.get('optim_wrapper'), Mapping):
        old = [k for k in ('optimizer', 'optimizer_config', 'fp16') if k in cfg]
        hint = f' (it has the 0.x keys {", ".join(old)})' if old else ''
        raise ValueError(
            f'the config has no optim_wrapper dict{hint}; enable_amp works on 1.x configs: '
            'run convert_config(cfg) first and pass its result'
        )
    new_cfg = copy.deepcopy(dict(cfg))
    wrapper = dict(new_cfg['optim_wrapper'])
    new_cfg['optim_wrapper'] = wrapper
    layout = _wrapper_layout(wrapper)
    if layout == 'multi':
        for key in list(wrapper):
            if key not in ('constructor', 'paramwise_cfg') and isinstance(wrapper[key], Mapping):
                wrapper[key] = dict(wrapper[key])
    for where, entry in _wrapper_entries(wrapper, layout):
        kind = entry.get('type', 'OptimWrapper')
        if kind == 'AmpOptimWrapper':
            warnings.warn(
                f'{where} is already an AmpOptimWrapper; left as it is'
                + (f' (dtype={dtype!r} not applied)' if dtype else ''),
                MigrationWarning,
                stacklevel=2,
            )
            continue
        if kind not in _WRAPPER_TYPES:
            raise ValueError(
                f"{where}.type is {kind!r}; enable_amp can only switch 'OptimWrapper' to "
                "'AmpOptimWrapper'; make that wrapper mixed-precision by hand"
            )
        entry['type'] = 'AmpOptimWrapper'
        if dtype != 'bfloat16':
            entry.setdefault('loss_scale', 'dynamic')
        if dtype is not None:
            entry['dtype'] = dtype
    return new_cfg


# --------------------------------------------------------------------------------------
# Codebase scan
# --------------------------------------------------------------------------------------

#: Top-level packages of the 0.x OpenMMLab codebases.
_MM_PACKAGES = frozenset(
    {
        'mmaction',
        'mmcls',
        'mmcv',
        'mmdet',
        'mmdet3d',
        'mmedit',
        'mmfewshot',
        'mmflow',
        'mmgen',
        'mmhuman3d',
        'mmocr',
        'mmpose',
        'mmrazor',
        'mmrotate',
        'mmseg',
        'mmselfsup',
        'mmtrack',
    }
)

#: The 0.x fp16 names that fp16utils provides with the same behaviour.
FP16_NAMES = frozenset(
    {
        'auto_fp16',
        'force_fp32',
        'wrap_fp16_model',
        'LossScaler',
        'Fp16OptimizerHook',
        'GradientCumulativeFp16OptimizerHook',
        'cast_tensor_type',
        'patch_norm_fp32',
        'patch_forward_method',
    }
)
_FP16_MODULE_LEAVES = frozenset({'fp16_utils', 'fp16'})
_DECORATORS = frozenset({'auto_fp16', 'force_fp32'})
_FP16_HOOK_TYPES = frozenset({'Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook'})
_VENV_DIR_NAMES = frozenset({'venv', 'virtualenv', 'site-packages', 'node_modules'})


@dataclass(frozen=True)
class Finding:
    """One 0.x fp16 usage found by :func:`scan`.

    Attributes:
        path: the file, as reached from the scanned path.
        line: 1-based line number.
        col: 1-based column (in characters).
        kind: one of ``import``, ``module-import``, ``star-import``,
            ``attribute-use``, ``decorator``, ``bare-decorator``,
            ``forward-decorator``, ``fp16-enabled``, ``config-fp16``,
            ``config-optimizer-hook``, ``config-runner-scaler``, ``syntax-error``.
        message: what was found.
        suggestion: the 1.x step to take.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(os.path.join(d, 'm.py'), 'w') as f:
        ...     _ = f.write('from mmcv.runner import auto_fp16' + chr(10))
        >>> [(x.line, x.kind) for x in scan(d)]
        [(1, 'import')]
    """

    path: str
    line: int
    col: int
    kind: str
    message: str
    suggestion: str

    def __str__(self) -> str:
        return f'{self.path}:{self.line}:{self.col}: [{self.kind}] {self.message}'


@dataclass(frozen=True)
class FileChange:
    """What :func:`fix_imports` did (or, with ``dry_run``, would do) to one file.

    Attributes:
        path: the file.
        diff: a unified diff of the change ('' when nothing changes).
        changed: whether the file's content changes.
        error: why the file was skipped (it does not parse or decode), else None.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(os.path.join(d, 'm.py'), 'w') as f:
        ...     _ = f.write('from mmcv.runner import force_fp32' + chr(10))
        >>> [c.changed for c in fix_imports(d, dry_run=True)]
        [True]
    """

    path: str
    diff: str
    changed: bool
    error: Optional[str] = None


def _is_mm_module(module: Optional[str]) -> bool:
    return bool(module) and module.split('.')[0] in _MM_PACKAGES  # type: ignore[union-attr]


def _is_fp16_module(module: str) -> bool:
    return _is_mm_module(module) and module.split('.')[-1] in _FP16_MODULE_LEAVES


def _iter_python_files(path: str) -> Iterator[str]:
    """The .py files under ``path`` (or ``path`` itself), sorted, skipping noise dirs."""
    if os.path.isfile(path):
        yield path
        return
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f'{path!r} is neither a file nor a directory; pass a .py file or a source folder'
        )
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith('.')
            and d != '__pycache__'
            and d not in _VENV_DIR_NAMES
            and not os.path.exists(os.path.join(root, d, 'pyvenv.cfg'))
        )
        for name in sorted(files):
            if name.endswith('.py'):
                yield os.path.join(root, name)


class _Source:
    """A Python file's text, decoded as Python would, with its encoding and lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, 'rb') as fh:
            self.raw = fh.read()
        self.encoding, _ = tokenize.detect_encoding(io.BytesIO(self.raw).readline)
        self.text = self.raw.decode(self.encoding)
        # Universal newlines, as the tokenizer sees them, but keep each line's ending.
        self.lines = io.StringIO(self.text, newline='').readlines()
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def char_col(self, lineno: int, byte_col: int) -> int:
        """0-based character column of an ast (UTF-8 byte) column."""
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ''
        return len(line.encode('utf-8')[:byte_col].decode('utf-8', errors='replace'))

    def offset(self, lineno: int, byte_col: int) -> int:
        """Index into ``text`` of an ast position."""
        return self.starts[lineno - 1] + self.char_col(lineno, byte_col)


def _load(path: str) -> tuple[Optional[_Source], Optional[ast.Module], Optional[Finding]]:
    """Read and parse a file; a Finding of kind 'syntax-error' when that fails."""
    try:
        src = _Source(path)
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        return (
            None,
            None,
            Finding(
                path,
                1,
                1,
                'syntax-error',
                f'cannot decode the file: {exc}',
                'fix the file encoding (or its coding: line); the file was skipped',
            ),
        )
    try:
        tree = ast.parse(src.text, filename=path)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, 'lineno', None) or 1
        col = getattr(exc, 'offset', None) or 1
        msg = getattr(exc, 'msg', None) or str(exc)
        return (
            src,
            None,
            Finding(
                path,
                line,
                col,
                'syntax-error',
                f'cannot parse the file: {msg}',
                'fix the syntax error and scan again; the file was skipped',
            ),
        )
    return src, tree, None


def _dotted(node: ast.AST) -> Optional[str]:
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return '.'.join(reversed(parts))
    return None


def _call_name(node: ast.AST) -> Optional[str]:
    """The last name of a decorator or callee expression (``a.b.auto_fp16`` -> auto_fp16)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _dict_keywords(node: ast.AST) -> Optional[dict[str, ast.AST]]:
    """The keys of a ``dict(...)`` call or ``{...}`` literal with constant string keys."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        return {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
    if isinstance(node, ast.Dict):
        return {
            k.value: v
            for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return None


def _alias_text(alias: ast.alias) -> str:
    return alias.name if alias.asname is None else f'{alias.name} as {alias.asname}'


_MIGRATE_HINT = 'fp16utils migrate CONFIG.py (convert_config)'


class _Scanner(ast.NodeVisitor):
    def __init__(self, src: _Source, tree: ast.Module) -> None:
        self.src = src
        self.findings: list[Finding] = []
        self.skip: set[int] = set()
        # Names bound to mm modules that hold the fp16 names (``import ... as f``).
        self.module_aliases: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_fp16_module(alias.name) and alias.asname:
                        self.module_aliases.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                if _is_mm_module(node.module):
                    for alias in node.names:
                        if alias.name in _FP16_MODULE_LEAVES:
                            self.module_aliases.add(alias.asname or alias.name)

    def add(self, node: ast.AST, kind: str, message: str, suggestion: str) -> None:
        line = node.lineno  # type: ignore[attr-defined]
        col = self.src.char_col(line, node.col_offset) + 1  # type: ignore[attr-defined]
        self.findings.append(Finding(self.src.path, line, col, kind, message, suggestion))

    # -- imports -------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _is_fp16_module(alias.name):
                bound = alias.asname or alias.name
                self.add(
                    node,
                    'module-import',
                    f'imports the 0.x fp16 module {alias.name} as {bound}',
                    'left alone by --fix: the module object is used as '
                    f'{bound}.<name>, so rewriting the import alone would break those '
                    'attribute accesses; write `from fp16utils import <names>` by hand '
                    'and use the bare names',
                )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level != 0 or not _is_mm_module(node.module):
            return
        module = node.module or ''
        if any(a.name == '*' for a in node.names):
            if _is_fp16_module(module):
                self.add(
                    node,
                    'star-import',
                    f'star import from the 0.x fp16 module {module}',
                    'left alone by --fix: a star import does not say which names the file '
                    'uses; list them: `from fp16utils import auto_fp16, force_fp32, ...`',
                )
            return
        names = [a for a in node.names if a.name in FP16_NAMES]
        if names:
            listed = ', '.join(_alias_text(a) for a in names)
            others = len(names) != len(node.names)
            self.add(
                node,
                'import',
                f'imports {listed} from {module}',
                f'use `from fp16utils import {listed}` (fp16utils scan --fix does it'
                + (', keeping the other names on the original import' if others else '')
                + '); the behaviour is the same and mmcv is no longer needed for it',
            )
        for alias in node.names:
            if alias.name in _FP16_MODULE_LEAVES:
                bound = alias.asname or alias.name
                self.add(
                    node,
                    'module-import',
                    f'imports the 0.x fp16 module {module}.{alias.name} as {bound}',
                    'left alone by --fix: the module object is used as '
                    f'{bound}.<name>, so rewriting the import alone would break those '
                    'attribute accesses; write `from fp16utils import <names>` by hand '
                    'and use the bare names',
                )

    # -- decorators ----------------------------------------------------------------

    def _decorators(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            name = _call_name(target)
            if name not in _DECORATORS:
                continue
            self.skip.add(id(target))
            if not isinstance(dec, ast.Call):
                self.add(
                    dec,
                    'bare-decorator',
                    f'@{name} without parentheses on {node.name}(): a bug in 0.x code, the '
                    'method is replaced by the decorator factory and its first call fails',
                    f'write @{name}()'
                    + (
                        ', or delete it: with AmpOptimWrapper the whole forward already '
                        'runs under autocast in optim_context'
                        if name == 'auto_fp16' and node.name == 'forward'
                        else ''
                    ),
                )
            elif name == 'auto_fp16' and node.name == 'forward':
                self.add(
                    dec,
                    'forward-decorator',
                    '@auto_fp16() on forward(): casts the whole forward to fp16',
                    'redundant in the 1.x style: AmpOptimWrapper.optim_context autocasts the '
                    'whole forward; remove it (and the fp16_enabled flag) once the config '
                    f'uses AmpOptimWrapper ({_MIGRATE_HINT}); until then it works with '
                    '`from fp16utils import auto_fp16`',
                )
            elif name == 'auto_fp16':
                self.add(
                    dec,
                    'decorator',
                    f'@auto_fp16() on {node.name}()',
                    'works unchanged with `from fp16utils import auto_fp16`; in the 1.x style '
                    'the forward runs under autocast in optim_context, so it can go once the '
                    'config uses AmpOptimWrapper',
                )
            else:
                self.add(
                    dec,
                    'decorator',
                    f'@force_fp32() on {node.name}()',
                    'works unchanged with `from fp16utils import force_fp32` (the method runs '
                    'in float32 with autocast off); keep it where the method must stay fp32 '
                    'under a whole-forward autocast',
                )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._decorators(node)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._decorators(node)
        self.generic_visit(node)

    # -- fp16_enabled and attribute uses -------------------------------------------

    _FLAG_HINT = (
        'only the 0.x decorators read fp16_enabled (wrap_fp16_model sets it); it keeps '
        'working with fp16utils; delete it together with @auto_fp16/@force_fp32 once the '
        'config uses AmpOptimWrapper'
    )

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == 'fp16_enabled':
            what = {ast.Store: 'sets', ast.Del: 'deletes'}.get(type(node.ctx), 'reads')
            self.add(node, 'fp16-enabled', f'{what} fp16_enabled', self._FLAG_HINT)
        elif node.attr in FP16_NAMES and id(node) not in self.skip:
            base = _dotted(node.value)
            if base and (base.split('.')[0] in _MM_PACKAGES or base in self.module_aliases):
                self.add(
                    node,
                    'attribute-use',
                    f'uses {base}.{node.attr}',
                    f'import it with `from fp16utils import {node.attr}` and use the bare '
                    'name; --fix does not rewrite attribute accesses',
                )
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in node.body:  # ``fp16_enabled = False`` as a class attribute
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name) and target.id == 'fp16_enabled':
                    self.add(
                        target,
                        'fp16-enabled',
                        'sets fp16_enabled (class attribute)',
                        self._FLAG_HINT,
                    )
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ('getattr', 'setattr', 'hasattr', 'delattr')
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == 'fp16_enabled'
        ):
            self.add(node, 'fp16-enabled', f'{node.func.id}(..., "fp16_enabled")', self._FLAG_HINT)
        self.generic_visit(node)

    # -- config files --------------------------------------------------------------

    def config_assignments(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if not (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                continue
            name = stmt.targets[0].id
            keys = _dict_keywords(stmt.value)
            if keys is None:
                continue
            if name == 'fp16':
                scale = keys.get('loss_scale')
                shown = ast.unparse(scale) if scale is not None else 'default 512.'
                self.add(
                    stmt,
                    'config-fp16',
                    f'config fp16 = dict(...) (loss_scale: {shown})',
                    f'{_MIGRATE_HINT} turns it into '
                    f"optim_wrapper = dict(type='AmpOptimWrapper', loss_scale=...)",
                )
            elif name == 'optimizer_config':
                hook = keys.get('type')
                if isinstance(hook, ast.Constant) and hook.value in _FP16_HOOK_TYPES:
                    self.add(
                        stmt,
                        'config-optimizer-hook',
                        f"config optimizer_config = dict(type='{hook.value}', ...)",
                        f'{_MIGRATE_HINT} folds it into an AmpOptimWrapper optim_wrapper '
                        '(grad_clip -> clip_grad, cumulative_iters -> accumulative_counts)',
                    )
            elif name == 'runner' and 'fp16_loss_scaler' in keys:
                self.add(
                    stmt,
                    'config-runner-scaler',
                    'config runner = dict(fp16_loss_scaler=...)',
                    f"{_MIGRATE_HINT} turns it into optim_wrapper type='AmpOptimWrapper' "
                    'with loss_scale=<the scaler dict>',
                )


def scan(path: str | os.PathLike[str]) -> list[Finding]:
    """Find every 0.x fp16 usage in a Python file or under a folder.

    Reported: imports of the 0.x fp16 names (``auto_fp16``, ``force_fp32``,
    ``wrap_fp16_model``, ``LossScaler``, ``Fp16OptimizerHook``, ...) from any mm*
    package; module imports of ``...fp16_utils``; ``@auto_fp16``/``@force_fp32``
    (bare ``@auto_fp16`` is reported as a bug, ``@auto_fp16()`` on ``forward`` as
    redundant under ``AmpOptimWrapper``); ``fp16_enabled``; and the config keys
    ``fp16 = dict(...)``, ``optimizer_config = dict(type='Fp16OptimizerHook', ...)``
    and ``runner = dict(fp16_loss_scaler=...)``. Hidden folders, ``__pycache__`` and
    virtual environments are skipped; a file that does not parse gives one
    ``syntax-error`` finding.

    Args:
        path: a .py file or a folder.

    Returns:
        The findings, sorted by (path, line, col).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / 'head.py').write_text('from mmcv.runner import force_fp32\\n')
        >>> [(f.line, f.kind) for f in scan(d)]
        [(1, 'import')]
    """
    findings: list[Finding] = []
    for file in _iter_python_files(os.fspath(path)):
        src, tree, error = _load(file)
        if error is not None:
            findings.append(error)
            continue
        assert src is not None and tree is not None
        scanner = _Scanner(src, tree)
        scanner.visit(tree)
        scanner.config_assignments(tree)
        findings.extend(scanner.findings)
    return sorted(findings, key=lambda f: (f.path, f.line, f.col, f.kind))


# --------------------------------------------------------------------------------------
# Import rewriting
# --------------------------------------------------------------------------------------


@dataclass
class _Alias:
    text: str
    start: int  # offsets into the file text
    end: int
    comma_end: Optional[int]  # end of the comma that follows, if any
    row: int  # the file line (1-based) the alias starts on
    end_row: int


def _import_layout(
    src: _Source, node: ast.ImportFrom
) -> tuple[tuple[int, int], list[_Alias], bool]:
    """Token-level layout of a ``from X import ...``: module span, aliases, parenthesized."""
    start = src.offset(node.lineno, node.col_offset)
    end = src.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    segment = src.text[start:end]

    def absolute(row: int, col: int) -> int:
        return start + col if row == 1 else src.starts[node.lineno - 2 + row] + col

    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(segment, newline='').readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER)
    ]
    i = 1  # after 'from'
    mod_start = absolute(*tokens[i].start)
    while not (tokens[i].type == tokenize.NAME and tokens[i].string == 'import'):
        i += 1
    mod_end = absolute(*tokens[i - 1].end)
    i += 1
    paren = tokens[i].string == '('
    if paren:
        i += 1
    aliases: list[_Alias] = []
    while i < len(tokens) and tokens[i].string != ')':
        first = tokens[i]
        parts = [first.string]
        last = first
        i += 1
        if i < len(tokens) and tokens[i].string == 'as':
            parts += ['as', tokens[i + 1].string]
            last = tokens[i + 1]
            i += 2
        comma_end = None
        if i < len(tokens) and tokens[i].string == ',':
            comma_end = absolute(*tokens[i].end)
            i += 1
        aliases.append(
            _Alias(
                ' '.join(parts),
                absolute(*first.start),
                absolute(*last.end),
                comma_end,
                node.lineno + first.start[0] - 1,
                node.lineno + last.end[0] - 1,
            )
        )
    return (mod_start, mod_end), aliases, paren


def _line_eol(line: str) -> str:
    for eol in ('\r\n', '\n', '\r'):
        if line.endswith(eol):
            return eol
    return ''


def _split_edits(
    src: _Source, node: ast.ImportFrom, fp16: list[ast.alias]
) -> list[tuple[int, int, str]]:
    """Edits that move the fp16 names of a mixed import to a new fp16utils import."""
    _, aliases, paren = _import_layout(src, node)
    move = {_alias_text(a) for a in fp16}
    edits: list[tuple[int, int, str]] = []
    start = src.offset(node.lineno, node.col_offset)
    end = src.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    end_line_no = node.end_lineno or node.lineno
    multi_line = end_line_no != node.lineno
    new_import = 'from fp16utils import ' + ', '.join(_alias_text(a) for a in fp16)

    if multi_line and (not paren or any(a.row != a.end_row for a in aliases)):
        # Backslash continuations (no comment can sit inside them) or a name split
        # over lines: write the remaining import on one line.
        kept = ', '.join(a.text for a in aliases if a.text not in move)
        edits.append((start, end, f'from {node.module} import {kept}'))
    else:
        rows: dict[int, list[_Alias]] = {}
        for alias in aliases:
            rows.setdefault(alias.row, []).append(alias)
        for row, on_line in rows.items():
            if not any(a.text in move for a in on_line):
                continue
            kept = [a for a in on_line if a.text not in move]
            first, last = on_line[0], on_line[-1]
            tail = last.comma_end if last.comma_end is not None else last.end
            line = src.lines[row - 1]
            line_start = src.starts[row - 1]
            prefix = src.text[line_start : first.start]
            suffix = src.text[tail : line_start + len(line)]
            suffix_code = suffix.split('#', 1)[0]
            if kept:
                later_kept = any(a.row > row and a.text not in move for a in aliases)
                comma = ',' if last.comma_end is not None or later_kept else ''
                edits.append((first.start, tail, ', '.join(a.text for a in kept) + comma))
            elif not prefix.strip() and not suffix_code.strip():
                # Only moved names on this line: drop it, keeping a comment if any.
                comment = suffix[len(suffix_code) :].rstrip('\r\n')
                kept_line = f'{prefix}{comment}{_line_eol(line)}' if comment else ''
                edits.append((line_start, line_start + len(line), kept_line))
            else:
                edits.append((first.start, tail, ''))

    first_line = src.lines[node.lineno - 1]
    end_line = src.lines[end_line_no - 1]
    indent = first_line[: len(first_line) - len(first_line.lstrip(' \t'))]
    line_before = src.text[src.starts[node.lineno - 1] : start]
    rest = src.text[end : src.starts[end_line_no - 1] + len(end_line)].strip()
    if not line_before.strip() and (not rest or rest.startswith('#')):
        eol = _line_eol(end_line)
        if eol:
            at = src.starts[end_line_no]
            edits.append((at, at, f'{indent}{new_import}{eol}'))
        else:  # last line of the file, without a line ending
            fallback = next((_line_eol(x) for x in src.lines if _line_eol(x)), '\n')
            at = src.starts[end_line_no - 1] + len(end_line)
            edits.append((at, at, f'{fallback}{indent}{new_import}'))
    else:  # shares its line with other statements: stay on that line
        edits.append((end, end, f'; {new_import}'))
    return edits


def _unified_diff(path: str, old: list[str], new: list[str]) -> str:
    out = []
    for line in difflib.unified_diff(old, new, fromfile=path, tofile=path):
        if not line.endswith(('\n', '\r')):
            line += '\n\\ No newline at end of file\n'
        out.append(line)
    return ''.join(out)


def _fix_file(path: str, dry_run: bool) -> FileChange:
    src, tree, error = _load(path)
    if error is not None:
        return FileChange(path, '', False, error.message)
    assert src is not None and tree is not None
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.ImportFrom) and node.level == 0 and _is_mm_module(node.module)
        ):
            continue
        fp16 = [a for a in node.names if a.name in FP16_NAMES]
        if not fp16:
            continue
        if len(fp16) == len(node.names):
            # Every name moves: swap the module name only, keeping the rest verbatim.
            (mod_start, mod_end), _, _ = _import_layout(src, node)
            edits.append((mod_start, mod_end, 'fp16utils'))
        else:
            edits.extend(_split_edits(src, node, fp16))
    if not edits:
        return FileChange(path, '', False)
    text = src.text
    for begin, finish, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:begin] + replacement + text[finish:]
    if text == src.text:
        return FileChange(path, '', False)
    new_lines = io.StringIO(text, newline='').readlines()
    diff = _unified_diff(path, src.lines, new_lines)
    if not dry_run:
        data = text.encode(src.encoding)
        tmp = f'{path}.fp16utils-tmp'
        with open(tmp, 'wb') as fh:
            fh.write(data)
        try:
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return FileChange(path, diff, True)


def fix_imports(path: str | os.PathLike[str], dry_run: bool = False) -> list[FileChange]:
    """Rewrite imports of the 0.x fp16 names from mm* packages to ``from fp16utils import``.

    Only the import statements change; everything else in each file (comments,
    formatting, encoding, line endings) stays byte for byte. A statement that
    imports only fp16 names keeps its layout with the module swapped for
    ``fp16utils``; one that mixes fp16 names with others (``from mmcv.runner import
    auto_fp16, BaseModule``) is split: the other names stay, and a new
    ``from fp16utils import auto_fp16`` line follows it. Module imports
    (``import mmcv.runner.fp16_utils as f``) and star imports are left alone: their
    uses go through attribute access that an import rewrite cannot follow (see
    :func:`scan`). Running it twice changes nothing the second time.

    Args:
        path: a .py file or a folder (hidden folders, ``__pycache__`` and virtual
            environments are skipped).
        dry_run: compute the changes and their diffs but write nothing.

    Returns:
        One :class:`FileChange` per Python file looked at (``changed`` tells which
        ones change; files that do not parse come back unchanged, with ``error`` set).

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / 'm.py'
        >>> _ = f.write_text('from mmcv.runner import BaseModule, auto_fp16  # noqa\\n')
        >>> [c.changed for c in fix_imports(f)]
        [True]
        >>> print(f.read_text(), end='')
        from mmcv.runner import BaseModule  # noqa
        from fp16utils import auto_fp16
    """
    return [_fix_file(file, dry_run) for file in _iter_python_files(os.fspath(path))]
