"""Skip-aware LR scheduler and EMA: skipped steps do not advance them.

Two batches of this run hold a nan, so their optimizer steps are skipped (the
weights and the optimizer state stay as they were). A scheduler stepped every
iteration, and an EMA model updated every iteration, would still advance on
those two iterations. Wrapped with ``skip_aware(obj, optim_wrapper)``, they
advance only after a step the optimizer really took, so the run ends with the
same learning rate, scheduler state and EMA weights as a run that never saw the
two bad batches: bit for bit.

Run: python examples/schedulers_ema.py                  # bfloat16
     python examples/schedulers_ema.py --dtype float16  # float16, dynamic loss scale
"""

import argparse

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.optim.swa_utils import AveragedModel

from fp16utils import AmpOptimWrapper, skip_aware

BAD = (6, 13)  # the iterations whose batch holds a nan


def ema_of(model: nn.Module) -> AveragedModel:
    return AveragedModel(model, avg_fn=lambda avg, new, n: 0.9 * avg + 0.1 * new)


def train(batches, dtype: str, follow: bool) -> dict:
    """Train on ``batches``; ``follow``: the scheduler and EMA are skip-aware."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    # float16: a start scale that fits this model's gradients, so that the only skips
    # are the bad batches (bfloat16 needs no loss scale and ignores it).
    optim_wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    dtype=dtype, loss_scale=dict(init_scale=2.0**10))
    scheduler, ema = StepLR(optim_wrapper.optimizer, step_size=4, gamma=0.5), ema_of(model)
    if follow:
        scheduler, ema = skip_aware(scheduler, optim_wrapper), skip_aware(ema, optim_wrapper)
    for x, y in batches:
        with optim_wrapper.optim_context(model):
            pred = model(x)
        optim_wrapper.update_params(nn.functional.mse_loss(pred.float(), y))
        scheduler.step()  # every iteration, as a training loop does
        ema.update_parameters(model)
    return dict(skipped=optim_wrapper.skipped_steps, last_epoch=scheduler.last_epoch,
                lr=scheduler.get_last_lr()[0], model=model.state_dict(),
                ema=ema.module.state_dict(), n_averaged=int(ema.n_averaged))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16', 'auto'], default='bfloat16')
    args = parser.parse_args()

    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(20):
        x = torch.randn(16, 8, generator=g)
        batches.append((x, x.sum(1, keepdim=True) / 4))
    poisoned = [(torch.full_like(x, float('nan')), y) if i in BAD else (x, y)
                for i, (x, y) in enumerate(batches)]
    clean = [b for i, b in enumerate(batches) if i not in BAD]

    followed = train(poisoned, args.dtype, follow=True)
    plain = train(poisoned, args.dtype, follow=False)
    reference = train(clean, args.dtype, follow=False)  # never saw the bad batches
    for name, run in (('skip_aware', followed), ('plain', plain), ('no bad batches', reference)):
        print(f"{name:15s} skipped {run['skipped']}  scheduler last_epoch {run['last_epoch']:2d}"
              f"  lr {run['lr']:.5f}  EMA updates {run['n_averaged']}")
    identical = (followed['last_epoch'] == reference['last_epoch']
                 and followed['lr'] == reference['lr']
                 and same(followed['model'], reference['model'])
                 and same(followed['ema'], reference['ema']))
    print(f"summary: {followed['skipped']} steps skipped; skip_aware scheduler and EMA "
          f'identical to the run without the bad batches: {identical}; plain ones drifted: '
          f"{not same(plain['ema'], reference['ema'])}")


if __name__ == '__main__':
    main()
