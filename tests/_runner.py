"""Test helpers for the training tests: a minimal mmcv-like runner and tiny models.

The test files load it by path (``importlib``), so it works whether or not
the tests folder is a package.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from fp16utils import auto_fp16

Batch = Tuple[torch.Tensor, torch.Tensor]


class LogBuffer:
    """Records ``update(vars, count)`` calls, as mmcv's LogBuffer receives them."""

    def __init__(self) -> None:
        self.records: List[Tuple[Dict[str, float], int]] = []

    def update(self, vars: Dict[str, float], count: int = 1) -> None:
        self.records.append((dict(vars), count))


class MiniRunner:
    """The smallest runner an mmcv optimizer hook needs.

    Each iteration computes ``outputs = {'loss': forward(model, batch),
    'num_samples': len(batch[0])}`` and calls ``after_train_iter`` on every hook;
    ``before_run`` is called at the start of :meth:`run`.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 hooks: Sequence[Any] = (), max_iters: int = 1,
                 meta: Optional[dict] = None, logger: Optional[logging.Logger] = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.hooks = list(hooks)
        self.max_iters = max_iters
        self.meta = meta
        self.logger = logger or logging.getLogger('mini_runner')
        self.log_buffer = LogBuffer()
        self.iter = 0
        self.outputs: Optional[dict] = None

    def call_hook(self, name: str) -> None:
        for hook in self.hooks:
            getattr(hook, name)(self)

    def run(self, data: Sequence[Batch], forward: Callable[[nn.Module, Batch], torch.Tensor],
            until: Optional[int] = None) -> None:
        """Train on ``data[self.iter:]`` up to ``until`` (default ``max_iters``) iterations."""
        stop = self.max_iters if until is None else until
        self.call_hook('before_run')
        while self.iter < stop:
            batch = data[self.iter]
            self.call_hook('before_train_iter')
            self.outputs = {'loss': forward(self.model, batch), 'num_samples': len(batch[0])}
            self.call_hook('after_train_iter')
            self.iter += 1
        self.call_hook('after_run')

    def save_checkpoint(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({'state_dict': self.model.state_dict(),
                    'optimizer': self.optimizer.state_dict(),
                    'meta': self.meta, 'iter': self.iter}, buffer)
        return buffer.getvalue()

    def resume(self, checkpoint: bytes) -> None:
        ckpt = torch.load(io.BytesIO(checkpoint))  # weights_only: plain data
        self.model.load_state_dict(ckpt['state_dict'])
        self.optimizer.load_state_dict(ckpt['optimizer'])
        self.meta = ckpt['meta']
        self.iter = ckpt['iter']


class Net(nn.Module):
    """A tiny MLP whose forward is ``@auto_fp16(out_fp32=True)`` (inert until wrapped)."""

    def __init__(self, seed: int = 0, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fp16_enabled = False
        self.fc1 = nn.Linear(8, width)
        self.fc2 = nn.Linear(width, 4)

    @auto_fp16(out_fp32=True)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def mse(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean squared error of ``model`` on ``batch``, in float32."""
    x, y = batch
    return (model(x).float() - y).pow(2).mean()


def make_data(n: int, batch_size: int = 4, seed: int = 1) -> List[Batch]:
    """``n`` batches of (x: [batch_size, 8], y: [batch_size, 4]) with small values."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, 8, generator=gen) * 0.5,
             torch.randn(batch_size, 4, generator=gen) * 0.5) for _ in range(n)]


def overflow_batch(batch_size: int = 4) -> Batch:
    """A batch whose forward overflows float16 (gradients become inf/nan)."""
    return torch.full((batch_size, 8), 1e5), torch.zeros(batch_size, 4)


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    """Clones of every parameter, buffer, optimizer parameter and optimizer state tensor."""
    out = {f'model.{k}': v.detach().clone() for k, v in model.state_dict().items()}
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group['params']):
            out[f'opt.{gi}.{pi}'] = p.detach().clone()
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out[f'opt.{gi}.{pi}.{key}'] = value.detach().clone()
    return out


def assert_identical(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    """Same keys, and every tensor bit-identical (dtype, shape and values)."""
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def state_tensors(optimizer: torch.optim.Optimizer) -> int:
    """How many tensors the optimizer state holds (to check that a snapshot saw some)."""
    return sum(isinstance(v, torch.Tensor) for s in optimizer.state.values() for v in s.values())


class DeformConv2d(nn.Module):
    """Stands in for mmcv.ops.DeformConv2d: what the paramwise constructors look for
    (its class name and module, and a ``conv_offset`` sub-module)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2, 2, 1, 1))
        self.bias = nn.Parameter(torch.zeros(2))
        self.conv_offset = nn.Conv2d(2, 2, 1)


DeformConv2d.__module__ = 'mmcv.ops.deform_conv'
