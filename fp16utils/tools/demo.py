"""The demo behind ``fp16utils demo``: one small model trained four ways.

A small MLP with BatchNorm learns a synthetic task (a fixed random teacher labels
Gaussian inputs) in float32, native AMP float16 and bfloat16, and the legacy backend
(half model, float32 masters). Nothing is downloaded.
"""

from __future__ import annotations

import io
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, TextIO

import torch
from torch import nn

from .._torch import caps
from ..migrate._atomic import atomic_write
from ..optim import AmpOptimWrapper, OptimWrapper
from ..precision import precision_summary

__all__ = ['MODES', 'ModeResult', 'plot_results', 'run_demo']

#: mode name -> (wrapper kind, dtype, backend)
MODES: dict[str, tuple[str, Optional[torch.dtype], Optional[str]]] = {
    'fp32': ('plain', None, None),
    'amp float16': ('amp', torch.float16, 'native'),
    'amp bfloat16': ('amp', torch.bfloat16, 'native'),
    'legacy float16': ('amp', torch.float16, 'legacy'),
}

_CLASSES = 10
_WARMUP = 3
# (inputs, hidden width, batch) per device type: half-precision matrix products
# are slow on most CPUs, so the CPU task is kept small; accelerators get one
# large enough for tensor cores to matter.
_SIZES = {'cpu': (32, 96, 128)}
_ACCEL_SIZE = (256, 2048, 2048)


@dataclass
class ModeResult:
    """What one mode of the demo measured."""

    mode: str
    steps_per_s: float
    final_loss: float
    peak_memory_mb: Optional[float]
    scale_changes: int
    skipped_steps: int
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    speedup: float = 1.0


class _Net(nn.Module):
    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(inputs, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, _CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _task(device: torch.device, steps: int, seed: int) -> list[tuple[torch.Tensor,
                                                                     torch.Tensor]]:
    inputs, _, batch = _SIZES.get(device.type, _ACCEL_SIZE)
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(inputs, _CLASSES, generator=gen)
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, inputs, generator=gen)
        y = (torch.tanh(x @ teacher) + 0.1 * torch.randn(batch, _CLASSES, generator=gen))
        batches.append((x.to(device), y.argmax(1).to(device)))
    return batches


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _train(mode: str, device: torch.device, batches: list, seed: int,
           progress: Optional[_Progress]) -> ModeResult:
    kind, dtype, backend = MODES[mode]
    torch.manual_seed(seed)
    inputs, hidden, _ = _SIZES.get(device.type, _ACCEL_SIZE)
    model = _Net(inputs, hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapper: OptimWrapper
    if kind == 'plain':
        wrapper = OptimWrapper(optimizer)
    else:
        wrapper = AmpOptimWrapper(optimizer, dtype=dtype, backend=backend, model=model,
                                  loss_scale=dict(init_scale=2.0**16, growth_interval=50))
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[float] = []
    scales: list[float] = []
    loss_fn = nn.CrossEntropyLoss()
    start = 0.0
    for i, (x, y) in enumerate(batches):
        if i == min(_WARMUP, len(batches) - 1):
            _sync(device)
            start = time.perf_counter()
        with wrapper.optim_context(model):
            loss = loss_fn(model(x).float(), y)
        wrapper.update_params(loss)
        losses.append(loss.item())
        scales.append(getattr(wrapper, 'loss_scale', 1.0))
        if progress is not None:
            progress.advance()
    _sync(device)
    timed = len(batches) - min(_WARMUP, len(batches) - 1)
    elapsed = max(time.perf_counter() - start, 1e-9)
    history = getattr(wrapper, 'scale_history', [])
    tail = losses[-10:]
    return ModeResult(
        mode=mode,
        steps_per_s=timed / elapsed,
        final_loss=sum(tail) / len(tail),
        peak_memory_mb=(torch.cuda.max_memory_allocated(device) / 2**20
                        if device.type == 'cuda' else None),
        scale_changes=max(len(history) - 1, 0),
        skipped_steps=getattr(wrapper, 'skipped_steps', 0),
        losses=losses, scales=scales)


class _Progress:
    """A one-line progress bar on a terminal."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done, self.stream, self.label = total, 0, stream, ''

    def advance(self) -> None:
        self.done += 1
        width = 30
        filled = int(width * self.done / self.total)
        self.stream.write(f'\r[{"#" * filled}{"." * (width - filled)}] '
                          f'{self.done}/{self.total} {self.label:<16}')
        self.stream.flush()

    def close(self) -> None:
        self.stream.write('\r' + ' ' * 70 + '\r')
        self.stream.flush()


def run_demo(device: str = 'cpu', steps: int = 200, seed: int = 0, progress: bool = False,
             out: Optional[TextIO] = None, modes: Sequence[str] = tuple(MODES)
             ) -> list[ModeResult]:
    """Train the demo model in each of ``modes`` (those torch can run here); print a table."""
    out = sys.stdout if out is None else out
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f'Unknown demo mode(s) {unknown}; expected some of {list(MODES)}.')
    dev = torch.device(device)
    left_out = [(m, _why_not(m, dev.type)) for m in modes]
    for mode, why in left_out:
        if why is not None:
            out.write(f'left out {mode}: {why}\n')
    modes = [m for m, why in left_out if why is None]
    batches = _task(dev, steps, seed)
    for mode in modes:  # one-time costs (kernel loading, first allocations) stay untimed
        _train(mode, dev, batches[:_WARMUP + 2], seed, None)
    bar = _Progress(steps * len(modes), sys.stderr) if progress else None
    results = []
    for mode in modes:
        if bar is not None:
            bar.label = mode
        else:
            out.write(f'training {mode} on {device} ({steps} steps)...\n')
            out.flush()
        results.append(_train(mode, dev, batches, seed, bar))
    if bar is not None:
        bar.close()
    base = results[0].steps_per_s if results and results[0].mode == 'fp32' else None
    for r in results:
        r.speedup = r.steps_per_s / base if base else math.nan
    out.write(_table(results, device))
    return results


def _why_not(mode: str, device_type: str) -> Optional[str]:
    """Why this torch cannot run ``mode`` on the device type (None: it can)."""
    kind, dtype, backend = MODES[mode]
    if kind == 'plain' or dtype is None:
        return None
    try:
        caps.backend_for(backend, device_type, dtype)
    except ValueError as err:
        return str(err)
    return None


def _table(results: list[ModeResult], device: str) -> str:
    head = ('mode', 'steps/s', 'vs fp32', 'peak mem', 'final loss', 'scale changes',
            'skipped')
    rows = [head]
    for r in results:
        mem = f'{r.peak_memory_mb:.1f} MB' if r.peak_memory_mb is not None else '-'
        rows.append((r.mode, f'{r.steps_per_s:.1f}', f'{r.speedup:.2f}x', mem,
                     f'{r.final_loss:.4f}', str(r.scale_changes), str(r.skipped_steps)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f'device: {device} | torch {torch.__version__} | timed after an untimed '
             'warm-up of every mode',
             f'precision: {precision_summary(device)}']
    for j, row in enumerate(rows):
        lines.append('  '.join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            lines.append('  '.join('-' * w for w in widths))
    return '\n'.join(lines) + '\n'


def plot_results(results: list[ModeResult], path: str) -> None:
    """Draw loss and loss scale per step of each mode into a PNG file, written atomically."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_scale) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in results:
        ax_loss.plot(r.losses, label=r.mode)
        if any(scale != 1.0 for scale in r.scales):  # modes without loss scaling stay at 1
            ax_scale.plot(r.scales, label=r.mode)
    ax_loss.set_ylabel('loss')
    ax_loss.legend()
    ax_scale.legend()
    ax_scale.set_ylabel('loss scale (scaled modes)')
    ax_scale.set_yscale('log', base=2)
    ax_scale.set_xlabel('step')
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, format='png')
    finally:
        plt.close(fig)
    atomic_write(path, image.getvalue())
