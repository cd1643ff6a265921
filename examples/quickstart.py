"""Quick start: a model written for the 0.x fp16 API trains in bfloat16 on the CPU.

The model marks its forward with ``@auto_fp16`` and its loss with ``@force_fp32``,
as mmcv 1.x codebases do; ``wrap_fp16_model`` switches them on. bfloat16 has the
range of float32, so the loop needs no loss scaler: it is a plain PyTorch loop.

Run: python examples/quickstart.py
"""

import torch
from torch import nn

from fp16utils import auto_fp16, force_fp32, wrap_fp16_model


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.fp16_enabled = False  # switched on by wrap_fp16_model

    @auto_fp16(apply_to=('x',))  # x is cast, the forward runs under autocast
    def forward(self, x):
        return self.body(x)

    @force_fp32(apply_to=('logits',))  # logits come back to float32, autocast is off
    def loss(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


def main() -> None:
    torch.manual_seed(0)
    model = wrap_fp16_model(TinyNet(), dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(256, 32)
    target = x[:, :4].argmax(1)  # a learnable rule: the largest of the first 4 inputs
    losses = []
    for step in range(60):
        logits = model(x)
        loss = model.loss(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 20 == 0:
            print(f'step {step:2d}  logits {logits.dtype}  loss {loss.dtype} {loss.item():.4f}')
    print(f'summary: logits {logits.dtype}, loss {loss.dtype}, '
          f'loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps')


if __name__ == '__main__':
    main()
