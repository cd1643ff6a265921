"""Optimizer-hook subclasses written the way 0.x codebases write them against mmcv 1.x.

Each factory takes the base class (this package's hook, or mmcv's own) and returns a
subclass whose methods use only what mmcv's hooks give (``self.loss_scaler``,
``self.clip_grads``, ``self._scale_update_param``, ``self.copy_grads_to_fp32``,
``self.every_n_iters``, ...), as the hooks found in 0.x detection and segmentation
codebases do. The same code runs on both, for the differential tests.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch


class ThisRunner:
    """What both hook families read from a runner, on top of ``tests/_runner.MiniRunner``.

    mmcv's ``Hook.is_last_iter`` reads the private ``_max_iters`` of mmcv's runners.
    """

    @property
    def _max_iters(self) -> int:
        return self.max_iters  # type: ignore[attr-defined]


def native_style(base: type) -> type:
    """mmcv's torch >= 1.6 ``after_train_iter``, copied into a subclass that logs group norms."""

    class GroupNormFp16Hook(base):  # type: ignore[misc, valid-type]
        def after_train_iter(self, runner: Any) -> None:
            runner.model.zero_grad()
            runner.optimizer.zero_grad()
            self.loss_scaler.scale(runner.outputs['loss']).backward()
            self.loss_scaler.unscale_(runner.optimizer)
            norms = {f'grad_norm_{name}': float(torch.cat(
                [p.grad.flatten() for p in module.parameters() if p.grad is not None]).norm())
                for name, module in runner.model.named_children()}
            runner.log_buffer.update(norms, runner.outputs['num_samples'])
            if self.grad_clip is not None:
                grad_norm = self.clip_grads(runner.model.parameters())
                if grad_norm is not None:
                    runner.log_buffer.update({'grad_norm': float(grad_norm)},
                                             runner.outputs['num_samples'])
            self.loss_scaler.step(runner.optimizer)
            self.loss_scaler.update(self._scale_update_param)
            runner.meta.setdefault('fp16', {})['loss_scaler'] = self.loss_scaler.state_dict()

    return GroupNormFp16Hook


def legacy_style(base: type) -> type:
    """mmcv's torch < 1.6 ``after_train_iter`` (float32 masters), copied into a subclass."""

    class MasterWeightsFp16Hook(base):  # type: ignore[misc, valid-type]
        def after_train_iter(self, runner: Any) -> None:
            runner.model.zero_grad()
            runner.optimizer.zero_grad()
            scaled_loss = runner.outputs['loss'] * self.loss_scaler.loss_scale
            scaled_loss.backward()
            fp32_weights: List[Any] = []
            for param_group in runner.optimizer.param_groups:
                fp32_weights += param_group['params']
            self.copy_grads_to_fp32(runner.model, fp32_weights)
            has_overflow = self.loss_scaler.has_overflow(fp32_weights)
            if not has_overflow:
                for param in fp32_weights:
                    if param.grad is not None:
                        param.grad.div_(self.loss_scaler.loss_scale)
                if self.grad_clip is not None:
                    grad_norm = self.clip_grads(fp32_weights)
                    if grad_norm is not None:
                        runner.log_buffer.update({'grad_norm': float(grad_norm)},
                                                 runner.outputs['num_samples'])
                runner.optimizer.step()
                self.copy_params_to_fp16(runner.model, fp32_weights)
            self.loss_scaler.update_scale(has_overflow)
            if has_overflow:
                runner.logger.warning('Check overflow, downscale loss scale '
                                      f'to {self.loss_scaler.cur_scale}')
            runner.meta.setdefault('fp16', {})['loss_scaler'] = self.loss_scaler.state_dict()

    return MasterWeightsFp16Hook


def cumulative_native_style(base: type) -> type:
    """mmcv's torch >= 1.6 cumulative ``after_train_iter``, with a counter of updates."""

    class CountingCumulativeHook(base):  # type: ignore[misc, valid-type]
        updates: List[int]

        def after_train_iter(self, runner: Any) -> None:
            if not self.initialized:
                self._init(runner)
                self.updates = []
            loss = runner.outputs['loss'] / self._get_loss_factor(runner)
            self.loss_scaler.scale(loss).backward()
            if self.every_n_iters(runner, self.cumulative_iters) or self.is_last_iter(runner):
                self.loss_scaler.unscale_(runner.optimizer)
                if self.grad_clip is not None:
                    grad_norm = self.clip_grads(runner.model.parameters())
                    if grad_norm is not None:
                        runner.log_buffer.update({'grad_norm': float(grad_norm)},
                                                 runner.outputs['num_samples'])
                self.loss_scaler.step(runner.optimizer)
                self.loss_scaler.update(self._scale_update_param)
                runner.meta.setdefault('fp16', {})['loss_scaler'] = self.loss_scaler.state_dict()
                runner.model.zero_grad()
                runner.optimizer.zero_grad()
                self.updates.append(runner.iter)

    return CountingCumulativeHook


def own_init_style(base: type, make_scaler: Callable[..., Any]) -> type:
    """A subclass whose ``__init__`` sets mmcv's attributes itself, without ``super().__init__``.

    ``make_scaler(**kwargs)`` makes the GradScaler (mmcv calls ``torch.cuda.amp.GradScaler``).
    """

    class OwnInitFp16Hook(base):  # type: ignore[misc, valid-type]
        def __init__(self, grad_clip: Any = None, coalesce: bool = True,
                     bucket_size_mb: int = -1, loss_scale: Any = 512.,
                     distributed: bool = True) -> None:
            self.grad_clip = grad_clip
            self.coalesce = coalesce
            self.bucket_size_mb = bucket_size_mb
            self.distributed = distributed
            self._scale_update_param = None
            if loss_scale == 'dynamic':
                self.loss_scaler = make_scaler()
            elif isinstance(loss_scale, float):
                self._scale_update_param = loss_scale
                self.loss_scaler = make_scaler(init_scale=loss_scale)
            elif isinstance(loss_scale, dict):
                self.loss_scaler = make_scaler(**loss_scale)
            else:
                raise ValueError(f'loss_scale must be of type float, dict, or "dynamic", '
                                 f'got {loss_scale}')

    return OwnInitFp16Hook


def clip_override_style(base: type) -> type:
    """Overrides ``clip_grads`` only: clips the first layer's gradients, records the calls."""

    class FirstLayerClipHook(base):  # type: ignore[misc, valid-type]
        def clip_grads(self, params: Any) -> Any:
            params = list(params)
            self.__dict__.setdefault('clip_calls', []).append(params)
            return super().clip_grads(params[:2])

    return FirstLayerClipHook


def before_run_style(base: type) -> type:
    """Extends ``before_run`` as 0.x hooks do: after the base, a submodule's flag is cleared."""

    class PartlyFp16Hook(base):  # type: ignore[misc, valid-type]
        def __init__(self, custom_fp16: Any = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.custom_fp16 = custom_fp16 or {}

        def before_run(self, runner: Any) -> None:
            super().before_run(runner)
            for name, enabled in self.custom_fp16.items():
                runner.model.get_submodule(name).fp16_enabled = enabled

    return PartlyFp16Hook
