"""A 0.x dense head: an @auto_fp16 forward, a @force_fp32 loss, the fp16_enabled flag."""
from mmcv.runner import auto_fp16, force_fp32
from torch import nn


class AnchorHead(nn.Module):
    def __init__(self, in_channels=8, num_classes=4):
        super().__init__()
        self.cls = nn.Linear(in_channels, num_classes)
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, feats):
        return self.cls(feats)

    @force_fp32(apply_to=('scores',))
    def loss(self, scores, labels):
        return nn.functional.cross_entropy(scores, labels)
