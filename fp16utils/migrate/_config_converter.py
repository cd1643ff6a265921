"""The 0.x -> 1.x config conversion pass behind :func:`~fp16utils.migrate.convert_config`.

:class:`ConfigConverter` reads the 0.x keys (``fp16``, ``optimizer``, ``optimizer_config``,
``runner.fp16_loss_scaler``, the GAN ``train_cfg`` steps) of a deep copy of the config,
builds the ``optim_wrapper``, and lists every key it could not convert safely.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Optional

from .._args.keys import FP16_HOOK_ARGS, unknown_keys_message
from .._args.spec import MMCV_LOSS_SCALE, is_positive_int
from ._loss_scale import convert_loss_scale
from ._wrapper_layout import wrapper_entries, wrapper_layout

__all__ = ['ConfigConverter']

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

_GAN_STEP_KEYS = ('disc_steps', 'gen_steps', 'batch_accumulation_steps')


def _optimizer_layout(opt: Any) -> Optional[str]:
    """'single' for ``dict(type=...)``, 'multi' for ``dict(name=dict(type=...), ...)``."""
    if not isinstance(opt, Mapping) or not opt:
        return None
    if 'type' in opt:
        return 'single'
    if all(isinstance(v, Mapping) and 'type' in v for v in opt.values()):
        return 'multi'
    return None


class ConfigConverter:
    """One conversion of a deep copy of a config: :meth:`run`, then read ``problems``."""

    def __init__(self, cfg: Mapping[str, Any], codebase: Optional[str] = None,
                 faithful: bool = False) -> None:
        self.out: dict[str, Any] = copy.deepcopy(dict(cfg))  # the copy being converted
        self.problems: list[str] = []  # one line per key not converted safely
        self.notes: list[str] = []  # one line per value whose meaning changes
        self.drop: set[str] = set()  # keys left out of the result
        self.codebase = codebase
        self.faithful = faithful
        self.test_fp16 = False  # the codebase's test script ran the model in half

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _keep_rest(self, key: str, rest: Mapping[str, Any], **head: Any) -> None:
        """Leave ``head`` + ``rest`` (what was not converted) under ``key``; no rest: drop it."""
        if rest:
            self.out[key] = {**head, **rest}
        else:
            self.drop.add(key)

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
        misspelt = [k for k in unknown if k not in FP16_HOOK_ARGS]
        if misspelt:  # Fp16OptimizerHook(**fp16) refuses these in 0.x training too
            self.problem(
                unknown_keys_message('fp16', misspelt, FP16_HOOK_ARGS)
                + '; Fp16OptimizerHook(**fp16), as mmdet 2.x builds it, refuses it too: fix the '
                'key in the 0.x config and migrate again (it was left in the fp16 key)'
            )
        hook_args = sorted(k for k in unknown if k in FP16_HOOK_ARGS)
        if hook_args:
            self.problem(
                f'fp16: {", ".join(hook_args)} not understood (only loss_scale is); '
                'left in the fp16 key; port them by hand'
            )
        self._keep_rest('fp16', unknown)
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
        self._keep_rest('runner', {k: v for k, v in runner.items() if k != 'fp16_loss_scaler'})
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
                if is_positive_int(val):
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
        self._keep_rest('optimizer_config', leftover, type=hook_type)
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
        bad = [k for k, v in values.items() if not is_positive_int(v)]
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
            entries = wrapper_entries(wrapper, layout) if wrapper is not None else []
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
        self._keep_rest('train_cfg', new_train_cfg)

    # -- the whole pass -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Convert: the new config, in the key order of the old one; see ``problems``."""
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
            layout = wrapper_layout(wrapper) if wrapper is not None else None
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
            converted = [(w, convert_loss_scale(v, w, self.problems)) for w, v in candidates]
            if converted:
                chosen_where, chosen = converted[0]
                for where, val in converted[1:]:
                    if val != chosen:
                        self.problem(
                            f'{where}: {val!r} differs from {chosen_where} ({chosen!r}); '
                            f'the {chosen_where} value was used; keep one loss scale'
                        )
            else:
                chosen = MMCV_LOSS_SCALE
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

