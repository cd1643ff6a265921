"""An mmcv 1.x training script, unchanged, trained by fp16utils in place of mmcv's fp16 code.

Everything below the patch is an mmcv 1.x codebase as it was written: a model
with ``fp16_enabled``, ``@auto_fp16`` / ``@force_fp32`` from ``mmcv.runner``, an
``IterBasedRunner``, and ``optimizer_config=dict(type='Fp16OptimizerHook', ...)``
built from mmcv's ``HOOKS`` registry. ``fp16utils.patch_mmcv()`` (or starting the
script with ``fp16utils run``) puts fp16utils' decorators and hooks in mmcv's
place, so it trains on today's torch, on the CPU too. The run saves a checkpoint
at iteration 6, and a second runner resumes from it with the loss scale and the
skip count of the first.

Run: python examples/mmcv_runner.py                                 # bfloat16
     fp16utils run --dtype float16 examples/mmcv_runner.py          # float16, loss scale
"""

import copy
import tempfile

import mmcv.runner

import fp16utils

# Started with `fp16utils run`, mmcv is patched already (with its --dtype and --backend).
# Started with `python`, patch it here: before any module binds mmcv's fp16 names.
if mmcv.runner.auto_fp16 is not fp16utils.auto_fp16:
    fp16utils.patch_mmcv(dtype='bfloat16')

import torch  # noqa: E402
from mmcv.runner import BaseModule, IterBasedRunner, auto_fp16, force_fp32  # noqa: E402
from mmcv.utils import get_logger  # noqa: E402
from torch import nn  # noqa: E402


class ToyDetectorHead(BaseModule):
    """A model as mmcv 1.x codebases write them: the fp16 flag and mmcv's decorators."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16_enabled = False  # Fp16OptimizerHook switches it on (wrap_fp16_model)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    @auto_fp16(apply_to=('x',))
    def forward(self, x):
        return self.body(x)

    @force_fp32(apply_to=('pred',))
    def loss(self, pred, target):
        return nn.functional.mse_loss(pred, target)

    def train_step(self, data_batch, optimizer):
        x, target = data_batch
        pred = self(x)
        loss = self.loss(pred, target)
        self.dtypes = (pred.dtype, loss.dtype)  # for the summary below
        return dict(loss=loss, num_samples=len(x), log_vars=dict(loss=loss.item()))


def run(work_dir: str, max_iters: int, resume_from=None) -> IterBasedRunner:
    torch.manual_seed(0)
    model = ToyDetectorHead()
    x = torch.randn(64, 16)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :4] * 2),
                                       batch_size=8, shuffle=True)
    runner = IterBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                             work_dir=work_dir, logger=get_logger('mmcv_runner_example'),
                             max_iters=max_iters, meta=dict())
    runner.register_training_hooks(
        lr_config=dict(policy='step', step=[9], by_epoch=False),
        # What a 0.x config says; HOOKS['Fp16OptimizerHook'] is fp16utils' hook now.
        optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=dict(init_scale=2.0**20),
                              grad_clip=dict(max_norm=35, norm_type=2)),
        checkpoint_config=dict(interval=6, by_epoch=False),
        log_config=dict(interval=4, hooks=[dict(type='TextLoggerHook', by_epoch=False)]))
    if resume_from:
        runner.resume(resume_from)  # brings runner.meta['fp16'] back (the patch's resume)
        runner.restored = dict(iter=runner.iter, fp16=copy.deepcopy(runner.meta['fp16']))
    runner.run([data], [('train', max_iters)])
    return runner


def main() -> None:
    with tempfile.TemporaryDirectory() as work_dir:
        first = run(work_dir, max_iters=12)
        hook = next(h for h in first.hooks if type(h).__name__ == 'Fp16OptimizerHook')
        second = run(work_dir, max_iters=12, resume_from=f'{work_dir}/iter_6.pth')
        resumed = next(h for h in second.hooks if type(h).__name__ == 'Fp16OptimizerHook')
    losses = first.log_buffer.val_history['loss']
    print(f'the hook: {type(hook).__module__}.{type(hook).__name__}; forward output '
          f'{first.model.dtypes[0]}, loss {first.model.dtypes[1]}')
    restored = second.restored
    print(f"resumed at iteration {restored['iter']} with meta['fp16'] = {restored['fp16']}")
    print(f'summary: {hook.dtype}, {first.iter} iterations, loss {losses[0]:.4f} -> '
          f'{losses[-1]:.4f}, skipped {hook.skipped_steps}, loss scale {hook.loss_scale:g}; '
          f"resumed at iteration {restored['iter']}, reached {second.iter} with loss scale "
          f'{resumed.loss_scale:g}, skipped {resumed.skipped_steps}')


if __name__ == '__main__':
    main()
