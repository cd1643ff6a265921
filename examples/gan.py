"""A GAN with two optimizers: one AmpOptimWrapper per sub-model in an OptimWrapperDict.

``build_optim_wrapper`` reads the multi-optimizer config of MMEngine-based GAN
codebases (``constructor='MultiOptimWrapperConstructor'``, one entry per
sub-model) and returns an ``OptimWrapperDict``. Each entry steps on its own:
the discriminator's update never touches the generator's loss scale or counters.
The dict's ``state_dict()`` holds every entry's optimizer and loss-scaler state.

The generator learns to map noise to points around (2, -1).

Run: python examples/gan.py                  # bfloat16
     python examples/gan.py --dtype float16  # each entry with its own dynamic loss scale
"""

import argparse

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits as bce

from fp16utils import build_optim_wrapper


class TinyGAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16', 'auto'], default='bfloat16')
    parser.add_argument('--iters', type=int, default=100)
    args = parser.parse_args()

    torch.manual_seed(0)
    gan = TinyGAN()
    optim_wrapper = build_optim_wrapper(gan, dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(type='AmpOptimWrapper', dtype=args.dtype,
                       optimizer=dict(type='Adam', lr=1e-2, betas=(0.5, 0.999))),
        discriminator=dict(type='AmpOptimWrapper', dtype=args.dtype,
                           optimizer=dict(type='Adam', lr=1e-2, betas=(0.5, 0.999)))))
    g_wrapper, d_wrapper = optim_wrapper['generator'], optim_wrapper['discriminator']
    center = torch.tensor([2.0, -1.0])

    def fake_mean() -> torch.Tensor:
        with torch.no_grad():
            return gan.generator(torch.randn(512, 8)).mean(0)

    start = (fake_mean() - center).norm().item()
    for it in range(args.iters):
        real = center + 0.1 * torch.randn(64, 2)
        noise = torch.randn(64, 8)
        # Discriminator step: real points are 1, generated points are 0.
        with d_wrapper.optim_context(gan.discriminator):
            fake = gan.generator(noise).detach()
            d_real, d_fake = gan.discriminator(real), gan.discriminator(fake)
        loss_d = (bce(d_real.float(), torch.ones_like(d_real, dtype=torch.float32))
                  + bce(d_fake.float(), torch.zeros_like(d_fake, dtype=torch.float32)))
        d_wrapper.update_params(loss_d)
        # Generator step: make the discriminator say 1 for generated points. The
        # discriminator is frozen meanwhile, or this backward would leave gradients in
        # its parameters, which its next step would add to its own.
        gan.discriminator.requires_grad_(False)
        with g_wrapper.optim_context(gan.generator):
            d_out = gan.discriminator(gan.generator(noise))
        loss_g = bce(d_out.float(), torch.ones_like(d_out, dtype=torch.float32))
        g_wrapper.update_params(loss_g)
        gan.discriminator.requires_grad_(True)
        if it % 25 == 0:
            print(f'iter {it:3d}  loss_d {loss_d.item():.3f}  loss_g {loss_g.item():.3f}  '
                  f'discriminator output {d_out.dtype}')

    state = optim_wrapper.state_dict()
    end = (fake_mean() - center).norm().item()
    print(f'{type(optim_wrapper).__name__}: lr {optim_wrapper.get_lr()}')
    print(f"state_dict: {sorted(state)}, each with {sorted(state['generator'])}")
    print(f'summary: {g_wrapper.dtype}, generator steps {g_wrapper.steps_taken}, '
          f'discriminator steps {d_wrapper.steps_taken}, loss scales '
          f'{g_wrapper.loss_scale:g}/{d_wrapper.loss_scale:g}, '
          f'distance to the real mean {start:.3f} -> {end:.3f}')


if __name__ == '__main__':
    main()
