"""AmpOptimWrapper in a plain loop: autocast, clipping, accumulation, float32 layers.

The 1.x style, without a Runner: the forward runs inside
``optim_wrapper.optim_context(model)`` (autocast on the model's device), and
``optim_wrapper.update_params(loss)`` does the rest: divide the loss for
accumulation, backward (scaled for float16), unscale, clip, step or skip a
non-finite step, zero the gradients. Here:

- ``accumulative_counts=4``: the optimizer steps every 4 iterations; with
  ``initialize_count_status`` the last, shorter window is stepped too;
- ``clip_grad=dict(max_norm=1.0)``: the gradient norm of each step is returned;
- ``fp32_modules=['head']``: the head runs in float32 under autocast, without an
  edit of the model's code.

Run: python examples/amp_wrapper.py                  # bfloat16 (fine on any CPU)
     python examples/amp_wrapper.py --dtype auto     # the native dtype of the device
     python examples/amp_wrapper.py --dtype float16  # float16 with dynamic loss scaling
"""

import argparse

import torch
from torch import nn

from fp16utils import AmpOptimWrapper, kept_fp32


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        features = self.backbone(x)
        return features, self.head(features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16', 'auto'], default='bfloat16')
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--device', default='cpu', help="'cpu', 'cuda', ...")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Regressor().to(args.device)
    optim_wrapper = AmpOptimWrapper(
        torch.optim.AdamW(model.parameters(), lr=2e-2),
        dtype=args.dtype, accumulative_counts=4, clip_grad=dict(max_norm=1.0),
        fp32_modules=['head'], model=model)
    # Tell the wrapper how many iterations there are: the last window (with the default
    # 30 iterations, 30 % 4 = 2) is divided by 2, not 4, and stepped at the last one.
    optim_wrapper.initialize_count_status(model, 0, args.iters)

    weight = torch.randn(16, 1, device=args.device) / 4
    losses = []
    for it in range(args.iters):
        x = torch.randn(32, 16, device=args.device)
        y = x @ weight
        with optim_wrapper.optim_context(model):
            features, pred = model(x)
        loss = nn.functional.mse_loss(pred, y)  # pred is float32: the head is kept in float32
        result = optim_wrapper.update_params(loss)
        losses.append(loss.item())
        if it < 5 or it == args.iters - 1:
            print(f'iter {it:2d}  stepped {result.stepped!s:5}  accumulating '
                  f'{result.accumulating!s:5}  skipped {result.skipped!s:5}  scale {result.scale}'
                  f'  grad_norm {result.grad_norm}')

    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    print(f'features {features.dtype}, head output {pred.dtype}, kept in float32: '
          f'{kept_fp32(model)}')
    print(f'summary: {optim_wrapper.dtype}, {args.iters} iterations, '
          f'{optim_wrapper.steps_taken} optimizer steps, {optim_wrapper.skipped_steps} skipped, '
          f'loss {first:.4f} -> {last:.4f}, last grad norm '
          f'{optim_wrapper.last_result.grad_norm:.3f} (clipped to 1.0)')


if __name__ == '__main__':
    main()
