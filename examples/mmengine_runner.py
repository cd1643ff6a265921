"""MMEngine's Runner trains with fp16utils' AmpOptimWrapper (the plug-in), on the CPU.

``import fp16utils.mmengine`` registers this package's wrappers in MMEngine's
registries under names of their own (``Fp16utilsAmpOptimWrapper``, ...); in a
config, ``custom_imports`` does the same. The Runner then trains, logs the loss
scale, schedules the learning rate and writes checkpoints as with MMEngine's own
wrappers, and ``dtype='bfloat16'`` runs on a CPU too (MMEngine's own
``AmpOptimWrapper`` needs a GPU).

Run: python examples/mmengine_runner.py          # a Runner built in Python
     python examples/mmengine_runner.py --config examples/mmengine_config.py
"""

import argparse
import tempfile

import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from mmengine.runner import Runner
from torch import nn

import fp16utils.mmengine  # noqa: F401  (registers the wrappers and constructors)


@MODELS.register_module()
class ToyRegressor(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 1)

    def forward(self, inputs, target, mode='tensor'):
        pred = self.head(self.backbone(inputs))
        if mode == 'loss':  # the Runner's train_step runs this inside optim_context
            return dict(loss=nn.functional.mse_loss(pred.float(), target))
        return pred


@DATASETS.register_module()
class ToyDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True) / 4

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return dict(inputs=self.x[i], target=self.y[i])


def python_runner(work_dir: str) -> Runner:
    """The Runner built in Python: the wrapper is named by its registered type."""
    return Runner(
        model=ToyRegressor(), work_dir=work_dir,
        train_dataloader=dict(dataset=dict(type='ToyDataset'), batch_size=8, num_workers=0,
                              sampler=dict(type='InfiniteSampler', shuffle=True),
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=24),
        optim_wrapper=dict(type='Fp16utilsAmpOptimWrapper', dtype='bfloat16',
                           optimizer=dict(type='AdamW', lr=1e-2),
                           clip_grad=dict(max_norm=5.0)),
        param_scheduler=dict(type='MultiStepLR', milestones=[16], gamma=0.1, by_epoch=False),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=8),
                           checkpoint=dict(type='CheckpointHook', interval=24, by_epoch=False)),
        log_processor=dict(by_epoch=False), randomness=dict(seed=0),
        env_cfg=dict(dist_cfg=dict(backend='gloo')))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', help='an MMEngine config file to build the Runner from')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        if args.config:
            cfg = Config.fromfile(args.config)
            cfg.work_dir = work_dir
            runner = Runner.from_cfg(cfg)
        else:
            runner = python_runner(work_dir)
        runner.train()
        hub = runner.message_hub
        losses = hub.get_scalar('train/loss').data[0].tolist()
        scales = hub.get_scalar('train/loss_scale').data[0].tolist()
    wrapper = runner.optim_wrapper
    decays = sorted({g['weight_decay'] for g in wrapper.optimizer.param_groups})
    print(f"lr after the schedule {wrapper.get_lr()['lr'][-1]:g}, "
          f'{len(wrapper.optimizer.param_groups)} param groups, weight decays {decays}')
    print(f'summary: {type(wrapper).__name__}, {wrapper.dtype}, {len(losses)} iterations, '
          f'loss {sum(losses[:4]) / 4:.4f} -> {sum(losses[-4:]) / 4:.4f}, loss scale logged '
          f'{scales[-1]:g}, skipped {wrapper.skipped_steps}')


if __name__ == '__main__':
    main()
