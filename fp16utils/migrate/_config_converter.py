"""The 0.x -> 1.x config conversion pass behind :func:`~fp16utils.migrate.convert_config`.

:class:`ConfigConverter` reads the 0.x optimizer keys (``optimizer``, MMEditing's
``optimizers``, the GAN ``train_cfg`` steps; ``fp16``, ``optimizer_config`` and
``runner.fp16_loss_scaler`` through :class:`~._legacy_keys.LegacyKeys`, by the codebase's
rules) of a deep copy of the config, builds the ``optim_wrapper``, lists every key it
could not convert safely in ``problems`` and every value whose meaning changes in
``notes``, and sets ``test_fp16`` when the codebase's test script ran in half precision.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Optional

from .._args.spec import MMCV_LOSS_SCALE, is_positive_int
from ._codebase import constructor_in_1x
from ._legacy_keys import MISSING as _MISSING
from ._legacy_keys import LegacyKeys
from ._loss_scale import convert_loss_scale
from ._wrapper_layout import wrapper_entries, wrapper_layout

__all__ = ['ConfigConverter']

_GAN_STEP_KEYS = ('disc_steps', 'gen_steps', 'batch_accumulation_steps')

#: MMEditing 0.x models whose mmagic 1.x counterparts take one wrapper per submodule
#: (an OptimWrapperDict) even with one optimizer; the others take a single wrapper.
_MMEDIT_DICT_MODELS = frozenset({'SRGAN', 'ESRGAN', 'RealESRGAN', 'RealBasicVSR', 'DIC',
                                 'TTSR', 'GLEAN', 'CycleGAN', 'Pix2Pix'})
#: Submodule names that mmagic 1.x reads under other keys, per model type.
_MMAGIC_KEYS = {'Pix2Pix': {'generator': 'generators', 'discriminator': 'discriminators'}}


def _optimizer_layout(opt: Any) -> Optional[str]:
    """'single' for ``dict(type=...)``, 'multi' for ``dict(name=dict(type=...), ...)``."""
    if not isinstance(opt, Mapping) or not opt:
        return None
    if 'type' in opt:
        return 'single'
    if all(isinstance(v, Mapping) and 'type' in v for v in opt.values()):
        return 'multi'
    return None


class ConfigConverter(LegacyKeys):
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

    def _wrapper_entry(
        self, opt: Mapping[str, Any], where: str, amp: bool, extras: dict[str, Any],
        typed: bool = False
    ) -> dict[str, Any]:
        """Build one wrapper dict (single wrapper or one entry of a multi config)."""
        optimizer = dict(opt)
        entry: dict[str, Any] = {}
        if amp or typed or where == 'optimizer':
            entry['type'] = 'AmpOptimWrapper' if amp else 'OptimWrapper'
        paramwise = optimizer.pop('paramwise_cfg', _MISSING)
        constructor = optimizer.pop('constructor', _MISSING)
        entry['optimizer'] = optimizer
        entry.update(extras)
        if paramwise is not _MISSING:
            entry['paramwise_cfg'] = self._paramwise(paramwise, where)
        self._float_betas(optimizer, where)
        if constructor is not _MISSING and constructor != 'DefaultOptimizerConstructor':
            entry['constructor'] = constructor
            self._named_constructor(constructor, where)
        return entry

    def _paramwise(self, paramwise: Any, where: str) -> Any:
        """``paramwise_cfg`` without ``_delete``, the misspelt ``_delete_`` mmcv ignored."""
        if not isinstance(paramwise, Mapping) or '_delete' not in paramwise:
            return paramwise
        self.notes.append(
            f'{where}.paramwise_cfg._delete: {paramwise["_delete"]!r} dropped; a misspelling of '
            "_delete_ that mmcv's Config merged as an ordinary option and mmcv's "
            'DefaultOptimizerConstructor never read (the base paramwise_cfg options were '
            "merged in 0.x as here); 1.x constructors may refuse it; write _delete_=True "
            'in the 0.x config if the base options were meant to go; see '
            'docs/migration/upstream.md#conversion-fixes'
        )
        return {k: v for k, v in paramwise.items() if k != '_delete'}

    def _float_betas(self, optimizer: dict[str, Any], where: str) -> None:
        """Write int ``betas`` (mmgen's ``(0, 0.99)``) as floats: torch 2 Adam refuses ints."""
        betas = optimizer.get('betas')
        if not isinstance(betas, (list, tuple)) or not any(type(b) is int for b in betas):
            return
        new = type(betas)(float(b) if type(b) is int else b for b in betas)
        optimizer['betas'] = new
        self.notes.append(
            f'{where}.betas: {tuple(betas)!r} written as {tuple(new)!r}, the same values as '
            "floats; recent torch releases' Adam refuses an int beta (\"betas must be either "
            'both floats or both Tensors\"); see docs/migration/upstream.md#conversion-fixes'
        )

    def _named_constructor(self, name: Any, where: str) -> None:
        """Say what becomes of a named 0.x constructor, kept in ``optim_wrapper.constructor``."""
        found = constructor_in_1x(self.codebase, name) if isinstance(name, str) else None
        see = 'see docs/migration/convert-config.md#named-constructors'
        if found is not None and found[0] == name:
            self.notes.append(
                f'{where}.constructor: {name!r} kept as optim_wrapper.constructor with its '
                f'paramwise_cfg; {found[1]} ships a 1.x constructor of this name (upstream\'s '
                f'configs use it), found when its registry is in scope (default_scope or '
                f'custom_imports); {see}'
            )
        elif found is not None:
            self.problem(
                f'{where}.constructor: {name!r} kept as optim_wrapper.constructor, but '
                f'{found[1]} renamed it {found[0]!r} and reads other paramwise_cfg options: '
                f'set optim_wrapper.constructor={found[0]!r} and port paramwise_cfg; {see}'
            )
        else:
            known = f' for {self.codebase}' if self.codebase else ' (the codebase is unknown)'
            self.problem(
                f'{where}.constructor: {name!r} kept as optim_wrapper.constructor, but no 1.x '
                f'constructor of this name is known{known}; 1.x constructors build optimizer '
                f'wrappers and have another interface: port it to an OptimWrapper '
                f'constructor registered under this name; {see}'
            )

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
        if 'custom_imports' in out:
            self.notes.append(
                'custom_imports: kept; MMEngine imports these modules too, and what they '
                'register must now go into the 1.x registries (mmengine.registry or the 1.x '
                "codebase's), not mmcv's; see docs/migration/convert-config.md#custom-imports"
            )
        key = 'optimizer'
        if 'optimizers' in out and 'optimizer' not in out:
            key = 'optimizers'  # MMEditing 0.x: read by its build_optimizers
        anchor = next(
            (k for k in (key, 'optimizer_config', 'fp16', 'runner') if k in out), None
        )
        wrapper: Optional[dict[str, Any]] = None
        layout: Optional[str] = None

        has_legacy = any(k in out for k in (key, 'optimizer_config', 'fp16')) or (
            isinstance(out.get('runner'), Mapping) and 'fp16_loss_scaler' in out['runner']
        )
        opt = out.get(key, _MISSING)
        opt_layout = _optimizer_layout(opt) if opt is not _MISSING else None

        if 'optim_wrapper' in out:
            if has_legacy:
                self.problem(
                    'optim_wrapper: the config already has an optim_wrapper and also 0.x '
                    f'keys ({key}/optimizer_config/fp16/runner.fp16_loss_scaler); the 0.x '
                    'keys were left untouched; merge them by hand'
                )
            wrapper = out['optim_wrapper'] if isinstance(out['optim_wrapper'], dict) else None
            layout = wrapper_layout(wrapper) if wrapper is not None else None
        elif opt is None and self.codebase == 'mmgen':
            self.drop.add(key)  # MMEngine would ignore it
            self.problem(
                f'{key}: None (left out): the mmgen 0.x model builds its own optimizers '
                '(SinGAN, PGGAN, StyleGAN-v1 read lr and betas from its train_cfg), so there '
                'is no optimizer to convert and no optim_wrapper was written; mmagic 1.x '
                'configures these '
                "models with optim_wrapper=dict(constructor='SinGANOptimWrapperConstructor' "
                "or 'PGGANOptimWrapperConstructor', generator=dict(optimizer=...), "
                'discriminator=dict(optimizer=...)): write it by hand; see '
                'docs/migration/upstream.md#conversion-fixes'
            )
        elif opt is not _MISSING and opt_layout is None:
            self.problem(
                f"{key}: expected dict(type='SGD', ...) or one dict with a 'type' per "
                f'submodule (generator=dict(type=...), ...), got {opt!r}; the optimizer and '
                'fp16 keys were left untouched; fix the optimizer and convert again'
            )
        elif has_legacy:
            wrapper, layout = self._convert_optimizer(opt, opt_layout, key)

        self._gan_steps(wrapper, layout)

        result: dict[str, Any] = {}
        for name, val in out.items():
            if name == anchor and wrapper is not None and 'optim_wrapper' not in out:
                result['optim_wrapper'] = wrapper
            if name in self.drop:
                continue
            result[name] = val
        if wrapper is not None and 'optim_wrapper' not in result:
            result['optim_wrapper'] = wrapper
        return result

    def _loss_scale(self, fp16_scale: Any, hook: dict[str, Any], runner_scale: Any) -> Any:
        """The one loss scale of the wrapper(s), from wherever the 0.x config set it."""
        candidates = [
            (where, val)
            for where, val in (
                (self.fp16_where, fp16_scale),
                ('optimizer_config.loss_scale', hook.get('loss_scale', _MISSING)),
                ('runner.fp16_loss_scaler', runner_scale),
            )
            if val is not _MISSING
        ]
        if not candidates:
            return MMCV_LOSS_SCALE  # Fp16OptimizerHook's default: a static 512
        converted = []
        for where, val in candidates:
            notes: list[str] = []  # GradScaler's own arguments (mmgen's runner) keep their meaning
            faithful = self.faithful and where != 'runner.fp16_loss_scaler'
            new = convert_loss_scale(val, where, self.problems, notes, faithful,
                                     deepspeed=where == 'fp16')  # DeepSpeed's block
            if where == 'fp16' and new == {}:
                new = 'dynamic'  # DeepSpeed's block with GradScaler's defaults

            converted.append((where, new, notes if where != 'runner.fp16_loss_scaler' else []))
        chosen_where, chosen, chosen_notes = converted[0]
        self.notes.extend(chosen_notes)
        for where, val, _ in converted[1:]:
            if val != chosen:
                self.problem(
                    f'{where}: {val!r} differs from {chosen_where} ({chosen!r}); '
                    f'the {chosen_where} value was used; keep one loss scale'
                )
        return chosen

    def _convert_optimizer(
        self, opt: Any, opt_layout: Optional[str], key: str = 'optimizer'
    ) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        fp16_key_on, fp16_scale = self._read_fp16()
        runner_on, runner_scale = self._read_runner()
        hook = self._read_hook(fp16_elsewhere=fp16_key_on or runner_on)
        amp = fp16_key_on or runner_on or hook['fp16']
        self._fp16_not_read(amp)

        extras: dict[str, Any] = {}
        if amp:
            scale = fp16_scale if fp16_key_on else _MISSING
            extras['loss_scale'] = self._loss_scale(scale, hook, runner_scale)
        if 'clip_grad' in hook:
            extras['clip_grad'] = hook['clip_grad']
        if 'accumulative_counts' in hook:
            extras['accumulative_counts'] = hook['accumulative_counts']

        if opt_layout is not None:
            self.drop.add(key)
        if key == 'optimizers':
            return self._mmedit_optimizers(opt, opt_layout, amp, extras)
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

    def _mmedit_optimizers(
        self, opt: Any, opt_layout: Optional[str], amp: bool, extras: dict[str, Any]
    ) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """MMEditing's ``optimizers`` as mmagic 1.x writes the same models' optim_wrapper.

        One optimizer (``dict(type=...)``, or only ``generator`` for a model without a
        discriminator) is one wrapper built by ``DefaultOptimWrapperConstructor``; several
        are a ``MultiOptimWrapperConstructor`` config, each entry typed.
        """
        model = self.out.get('model')
        kind = model.get('type') if isinstance(model, Mapping) else None
        has_disc = isinstance(model, Mapping) and model.get('discriminator') is not None
        if opt_layout == 'multi' and len(opt) == 1 and not has_disc and \
                kind not in _MMEDIT_DICT_MODELS:
            ((name, sub),) = opt.items()
            entry = self._wrapper_entry(sub, f'optimizers.{name}', amp, extras, typed=True)
            return {'constructor': 'DefaultOptimWrapperConstructor', **entry}, 'single'
        if opt_layout == 'single':
            entry = self._wrapper_entry(opt, 'optimizers', amp, extras, typed=True)
            return {'constructor': 'DefaultOptimWrapperConstructor', **entry}, 'single'
        if opt_layout == 'multi':
            wrapper: dict[str, Any] = {'constructor': 'MultiOptimWrapperConstructor'}
            renames = _MMAGIC_KEYS.get(kind, {}) if isinstance(kind, str) else {}
            for name, sub in opt.items():
                new = renames.get(name, name)
                if new != name:
                    self.notes.append(
                        f'optimizers.{name}: written as optim_wrapper.{new}, the key mmagic '
                        f"1.x's {kind} reads; see "
                        'docs/migration/convert-config.md#mmedit-optimizers'
                    )
                wrapper[new] = self._wrapper_entry(
                    sub, f'optimizers.{name}', amp, copy.deepcopy(extras), typed=True
                )
            return wrapper, 'multi'
        return None, None
