"""Readers of the 0.x keys that switch mixed precision on, by the codebase's rules.

``fp16`` (read or ignored per codebase, see :mod:`._codebase`), ``runner.fp16_loss_scaler``
(MMGeneration/MMEditing) and ``optimizer_config`` (mmcv's optimizer hooks). Mixed into
:class:`~._config_converter.ConfigConverter`; each reader drops or keeps its key and
says what it could not convert in ``problems`` and what changes meaning in ``notes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .._args.keys import FP16_HOOK_ARGS, unknown_keys_message
from .._args.spec import is_positive_int
from ._codebase import CODEBASES, FP16_RULES, Fp16Rule
from ._deepspeed_keys import BLOCK_KEYS, is_deepspeed_block, read_block

__all__ = ['MISSING', 'LegacyKeys']

MISSING: Any = object()

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
_RULES = 'see docs/migration/convert-config.md#codebase-rules'


class LegacyKeys:
    """The readers of ``fp16``, ``runner.fp16_loss_scaler`` and ``optimizer_config``."""

    out: dict[str, Any]
    problems: list[str]
    notes: list[str]
    drop: set[str]
    codebase: Optional[str]
    test_fp16: bool
    #: Where the ``fp16`` key's loss scale was read: ``'fp16'`` for DeepSpeed's block.
    fp16_where: str = 'fp16.loss_scale'

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _keep_rest(self, key: str, rest: Mapping[str, Any], **head: Any) -> None:
        """Leave ``head`` + ``rest`` (what was not converted) under ``key``; no rest: drop it."""
        if rest:
            self.out[key] = {**head, **rest}
        else:
            self.drop.add(key)

    def _fp16_rule(self) -> Optional[Fp16Rule]:
        """The codebase's rule for ``fp16`` (mmdet3d's segmentors follow mmseg's), or None."""
        if self.codebase is None:
            return None
        model = self.out.get('model')
        if (self.codebase == 'mmdet3d' and isinstance(model, Mapping)
                and model.get('type') == 'EncoderDecoder3D'):
            return FP16_RULES['mmseg']._replace(
                train_text="training (train_segmentor) does not read fp16; only "
                           "optimizer_config type='Fp16OptimizerHook' turns it on")
        return FP16_RULES[self.codebase]

    def _read_fp16(self) -> tuple[bool, Any]:
        """Read (and drop) the ``fp16`` key: (does training read it as on, loss_scale)."""
        if 'fp16' not in self.out:
            return False, MISSING
        fp16 = self.out['fp16']
        self.drop.add('fp16')  # MMEngine ignores it: never written back
        if fp16 is None:
            return False, MISSING
        if not isinstance(fp16, Mapping):
            self.problem(
                f'fp16: expected dict(loss_scale=...) or None, got {fp16!r}; dropped and '
                'fp16 NOT enabled; fix the key, or call enable_amp() on the result'
            )
            return False, MISSING
        rule = self._fp16_rule()
        block = is_deepspeed_block(fp16)  # DeepSpeed's fp16 block: enabled, hysteresis, ...
        known = ('loss_scale',) + (BLOCK_KEYS if block else ())
        unknown = [k for k in fp16 if k not in known]
        misspelt = [k for k in unknown if k not in FP16_HOOK_ARGS]
        if misspelt:
            refused = ('; Fp16OptimizerHook(**fp16), as this codebase builds it, refuses it '
                       'too' if rule is None or rule.train_text.endswith('**fp16)') else '')
            self.problem(
                unknown_keys_message('fp16', misspelt, FP16_HOOK_ARGS + known[1:])
                + f'{refused}: it was dropped with the fp16 key; fix it in the 0.x config and '
                'migrate again'
            )
        hook_args = sorted(k for k in unknown if k in FP16_HOOK_ARGS)
        if hook_args:
            read = "loss_scale and DeepSpeed's block keys are" if block else 'loss_scale is'
            self.problem(
                f'fp16: {", ".join(hook_args)} not understood (only {read}); dropped with the '
                'fp16 key; set them on optim_wrapper by hand'
            )
        scale = fp16.get('loss_scale', MISSING)
        if block:
            said = self.notes if rule is None or rule.train else []  # else not read at all
            enabled, scale, self.fp16_where = read_block(fp16, self.problems, said)
            if not enabled:
                self.test_fp16 = False
                if rule is None or rule.train:  # else _fp16_not_read says it
                    self.notes.append(
                        "fp16: enabled=False (DeepSpeed's switch) turns mixed precision off: "
                        'training stays float32 (OptimWrapper, unless optimizer_config names '
                        'an fp16 hook) and val_cfg/test_cfg get no fp16; the fp16 key was '
                        'dropped; see docs/migration/convert-config.md#deepspeed')
                return False, MISSING
        if rule is None:  # said, not a problem: most codebases read fp16 this way
            self.test_fp16 = True
            self.notes.append(
                "fp16: the codebase could not be told, so this key was read as mmdet, mmcls, "
                'mmpose, mmocr and mmrotate 0.x read it: training in AmpOptimWrapper, '
                'val_cfg/test_cfg fp16=True; mmseg 0.x training ignores it (float32 unless '
                "optimizer_config type='Fp16OptimizerHook'), mmedit and mmgen ignore it "
                f'altogether: pass --codebase ({", ".join(CODEBASES)}); {_RULES}'
            )
            return True, scale
        self.test_fp16 = rule.test
        return rule.train, scale

    def _fp16_not_read(self, amp: bool) -> None:
        """Say that the codebase's training ignored ``fp16`` (what the result does instead)."""
        fp16 = self.out.get('fp16')
        rule = self._fp16_rule()
        if not isinstance(fp16, Mapping) or rule is None or rule.train:
            return
        test = ('its tools/test.py ran the model in half precision: val_cfg/test_cfg '
                'fp16=True' if rule.test else 'its tools/test.py ignored it too')
        if amp:
            ignored = ('; its loss_scale was not used (optimizer_config.loss_scale was)'
                       if 'loss_scale' in fp16 else '')
            self.notes.append(
                f'fp16: {self.codebase} 0.x {rule.train_text}; mixed precision here comes '
                f'from optimizer_config (AmpOptimWrapper){ignored}; {test}; {_RULES}'
            )
            return
        self.notes.append(
            f'fp16: {self.codebase} 0.x {rule.train_text}, so this config trained in '
            f'float32 and optim_wrapper stays OptimWrapper; {test}; for mixed-precision '
            f"training set optim_wrapper type='AmpOptimWrapper' (migrate --amp); {_RULES}"
        )

    def _read_runner(self) -> tuple[bool, Any]:
        """Read ``runner.fp16_loss_scaler`` (MMEditing/MMGeneration 0.x)."""
        runner = self.out.get('runner')
        if not isinstance(runner, Mapping):
            return False, MISSING
        if runner.get('use_apex_amp'):
            self.problem(
                'runner.use_apex_amp: apex AMP has no 1.x config equivalent and was left '
                'untouched; AmpOptimWrapper (native torch AMP) replaces it: remove the key '
                'and call enable_amp() on the converted config'
            )
        if 'fp16_loss_scaler' not in runner:
            return False, MISSING
        scaler = runner['fp16_loss_scaler']
        self._keep_rest('runner', {k: v for k, v in runner.items() if k != 'fp16_loss_scaler'})
        if not scaler:  # the 0.x runners enable the scaler only when it is truthy
            return False, MISSING
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
