"""A 0.x model in a plain training loop: float16 with a LossScaler, or bfloat16 without.

The model is written against the 0.x fp16 API (``fp16_enabled``, ``@auto_fp16`` on
the forward, ``@force_fp32`` on the loss), as in mmcv 1.x codebases. The loop is
the one mmcv's ``Fp16OptimizerHook`` runs, written out:

- float16: scale the loss, backward, unscale the gradients and check them for
  inf/nan in one pass, step only when they are finite, then let the scaler back
  off or grow. The scaler starts at mmcv's default (2**32), so the first steps
  overflow and are skipped until the scale fits float16's range.
- bfloat16: the range of float32, no scaler; a plain ``loss.backward()`` and step.

Run: python examples/legacy_loop.py                  # bfloat16
     python examples/legacy_loop.py --dtype float16  # float16 + LossScaler
"""

import argparse
import math

import torch
from torch import nn

from fp16utils import LossScaler, auto_fp16, force_fp32, wrap_fp16_model


class Classifier(nn.Module):
    """A backbone and a head, each switched on by ``wrap_fp16_model``."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        self.fp16_enabled = False

    @auto_fp16(apply_to=('x',))
    def forward(self, x):
        return self.head(self.backbone(x))

    @force_fp32(apply_to=('logits',))
    def loss(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


def train(dtype: torch.dtype, steps: int, device: str) -> dict:
    torch.manual_seed(0)
    model = wrap_fp16_model(Classifier().to(device), dtype=dtype)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    # float16 needs a loss scale: its smallest normal number is 6e-5, and small
    # gradients would underflow to 0. bfloat16 has float32's exponent range.
    scaler = LossScaler(scale_window=20) if dtype == torch.float16 else None
    x = torch.randn(256, 32, device=device)
    target = x[:, :4].argmax(1)
    losses, skipped, untouched = [], 0, True
    for _ in range(steps):
        logits = model(x)
        loss = model.loss(logits, target)  # float32, whatever the forward ran in
        optimizer.zero_grad()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            overflow = scaler.unscale_(params)  # one fused check, one device sync
            if overflow:  # gradients hold inf/nan: leave the weights alone
                before = [p.detach().clone() for p in params]
                skipped += 1
            else:
                optimizer.step()
            scaler.update_scale(overflow)
            if overflow:
                untouched &= all(torch.equal(a, p) for a, p in zip(before, params))
        losses.append(loss.item())
    return dict(logits=logits.dtype, loss=loss.dtype, losses=losses, skipped=skipped,
                untouched=untouched, scale=None if scaler is None else scaler.loss_scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16'], default='bfloat16')
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--device', default='cpu', help="'cpu', 'cuda', ...")
    args = parser.parse_args()
    out = train(getattr(torch, args.dtype), args.steps, args.device)
    losses = out['losses']
    if out['scale'] is not None:
        print(f"skipped {out['skipped']} of {args.steps} steps, weights unchanged on each: "
              f"{out['untouched']}; loss scale 2**32 -> 2**{math.log2(out['scale']):g}")
    print(f"summary: {args.dtype}, logits {out['logits']}, loss {out['loss']}, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, skipped {out['skipped']}")


if __name__ == '__main__':
    main()
