"""Save and resume an AmpOptimWrapper run: the resumed run is bit-identical.

The checkpoint holds ``model.state_dict()``, ``optim_wrapper.state_dict()`` and the
iteration. The wrapper's state carries, beside the optimizer's: the loss scaler
(``'loss_scaler'``), the skip count and scale history (``'fp16_stats'``) and, when
saved in the middle of an accumulation window, the gradients accumulated so far
(``'pending_window'``). It loads with ``torch.load(..., weights_only=True)``, the
default from torch 2.6 on.

This run accumulates 2 iterations per step, skips one step (a batch holding an inf)
before the checkpoint, and saves after iteration 9, in the middle of a window. A
model and wrapper built anew from the checkpoint then finish the run, and end with
the same weights, optimizer state, loss scale and skip count as a run that never
stopped.

Run: python examples/save_resume.py                  # bfloat16
     python examples/save_resume.py --dtype float16  # float16: the loss scale is restored
"""

import argparse
import os
import pickle
import tempfile

import torch
from torch import nn

from fp16utils import AmpOptimWrapper

ITERS, SAVE_AFTER, BAD = 16, 9, 3


def build(dtype: str, seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optim_wrapper = AmpOptimWrapper(
        torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=dtype,
        loss_scale=dict(init_scale=2.0**10), accumulative_counts=2)
    return model, optim_wrapper


def load_checkpoint(path: str) -> dict:
    """Load with ``weights_only=True``: tensors and plain Python data only.

    That is torch's default from 2.6 on, and all these states need. torch 1.13's
    weights-only loader reads no Python floats (the loss scale, the learning rate);
    there, a checkpoint you wrote yourself loads with ``weights_only=False``.
    """
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        print(f'torch.load(weights_only=True) cannot read it here ({type(err).__name__}); '
              'loading it with weights_only=False (only for files you trust)')
        return torch.load(path, weights_only=False)


def train(model, optim_wrapper, batches, start: int, stop: int) -> None:
    for x, y in batches[start:stop]:
        with optim_wrapper.optim_context(model):
            pred = model(x)
        optim_wrapper.update_params(nn.functional.mse_loss(pred.float(), y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16', 'auto'], default='bfloat16')
    parser.add_argument('--work-dir', help='where the checkpoint goes (default: a temporary '
                        'folder, removed at the end)')
    args = parser.parse_args()

    g = torch.Generator().manual_seed(1)
    batches = []
    for i in range(ITERS):
        x = torch.randn(16, 8, generator=g)
        batches.append((x * float('inf') if i == BAD else x, x.sum(1, keepdim=True) / 4))

    # The run that never stops.
    model, optim_wrapper = build(args.dtype, seed=0)
    optim_wrapper.initialize_count_status(model, 0, ITERS)
    train(model, optim_wrapper, batches, 0, ITERS)

    # The run that stops after iteration SAVE_AFTER and saves a checkpoint.
    first, first_wrapper = build(args.dtype, seed=0)
    first_wrapper.initialize_count_status(first, 0, ITERS)
    train(first, first_wrapper, batches, 0, SAVE_AFTER)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(args.work_dir or tmp, 'iter_9.pth')
        torch.save({'model': first.state_dict(), 'optim_wrapper': first_wrapper.state_dict(),
                    'iter': SAVE_AFTER}, path)
        del first, first_wrapper

        # Resume: new objects (another initialisation, to show that it is overwritten).
        checkpoint = load_checkpoint(path)
    resumed, resumed_wrapper = build(args.dtype, seed=123)
    resumed.load_state_dict(checkpoint['model'])
    resumed_wrapper.load_state_dict(checkpoint['optim_wrapper'])
    # As MMEngine's loop does after a resume: the iteration reached, and the total.
    resumed_wrapper.initialize_count_status(resumed, checkpoint['iter'], ITERS)
    print(f"checkpoint after iteration {checkpoint['iter']}: "
          f"{sorted(checkpoint['optim_wrapper'])}")
    print(f'restored: skipped steps {resumed_wrapper.skipped_steps}, loss scale '
          f"{resumed_wrapper.loss_scale:g}, the unfinished window's gradients saved: "
          f"{'pending_window' in checkpoint['optim_wrapper']}")
    train(resumed, resumed_wrapper, batches, SAVE_AFTER, ITERS)

    weights = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                      resumed.state_dict().values()))
    moments = all(torch.equal(sa[k], sb[k])
                  for sa, sb in zip(optim_wrapper.optimizer.state.values(),
                                    resumed_wrapper.optimizer.state.values()) for k in sa)
    print(f'summary: {optim_wrapper.dtype}, skipped {optim_wrapper.skipped_steps} / '
          f'{resumed_wrapper.skipped_steps} (uninterrupted / resumed), loss scale '
          f'{optim_wrapper.loss_scale:g} / {resumed_wrapper.loss_scale:g}, resumed run '
          f'bit-identical to the uninterrupted one: {weights and moments}')


if __name__ == '__main__':
    main()
