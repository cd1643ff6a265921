"""Quick start: the 0.x decorators on a small model, on whatever device is present.

Run: python examples/quickstart.py
"""

import torch
from torch import nn

from fp16utils import LossScaler, auto_fp16, force_fp32, wrap_fp16_model


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.fp16_enabled = False  # switched on by wrap_fp16_model

    @auto_fp16(apply_to=('x',))
    def forward(self, x):
        return self.body(x)

    @force_fp32(apply_to=('logits',))
    def loss(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


def main() -> None:
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    torch.manual_seed(0)
    model = wrap_fp16_model(TinyNet().to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = LossScaler(init_scale=2.0**10, scale_window=50)
    x = torch.randn(256, 32, device=device)
    target = (x[:, :4].argmax(1)).to(device)
    for step in range(100):
        logits = model(x)
        loss = model.loss(logits, target)
        opt.zero_grad()
        scaler.scale(loss).backward()
        overflow = scaler.unscale_(model.parameters())
        if not overflow:
            opt.step()
        scaler.update_scale(overflow)
        if step % 25 == 0 or step == 99:
            print(f'step {step:3d}  logits {logits.dtype}  loss {loss.item():.4f}  '
                  f'scale {scaler.loss_scale:g}')


if __name__ == '__main__':
    main()
