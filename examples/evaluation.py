"""Half-precision inference by hand: a 0.x model on both backends, and a model without flags.

The detector-like model is written against the 0.x fp16 API, as mmcv 1.x codebases
are (``fp16_enabled``, ``@auto_fp16`` on the forward, ``@force_fp32`` on the box
decoding), and has a weight checkpoint saved in float32. It is evaluated three
ways, each compared with the float32 evaluation of the same checkpoint:

- native: ``wrap_fp16_model(model)`` sets the flags; ``@auto_fp16`` runs the
  forward under autocast, ``@force_fp32`` decodes in float32. This is what mmdet's
  ``init_detector`` + ``wrap_fp16_model`` + ``inference_detector`` do.
- legacy: ``wrap_fp16_model(model, backend='legacy')`` converts the model itself
  to half, its norms and the modules named in ``fp32_modules`` stay float32.
- without flags (a 1.x-style model, plain ``nn.Module`` code): the forward runs
  inside ``fp16utils.evaluation.eval_precision``, which is autocast on the model's
  device with the named modules in float32 while it is open.

Run: python examples/evaluation.py                  # bfloat16
     python examples/evaluation.py --dtype float16
"""

import argparse
import io

import torch
from torch import nn

from fp16utils import auto_fp16, force_fp32, kept_fp32, wrap_fp16_model
from fp16utils.evaluation import eval_precision


class Head(nn.Module):
    """Class scores and box deltas per location; decoding is ``@force_fp32``."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Conv2d(16, 3, 1)
        self.reg = nn.Conv2d(16, 4, 1)
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, feats):
        return self.cls(feats), self.reg(feats)

    @force_fp32(apply_to=('scores', 'deltas'))
    def decode(self, scores, deltas):
        self.decoded_in = scores.dtype
        return scores.sigmoid().flatten(1), deltas.exp().flatten(1)


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = Head()
        self.fp16_enabled = False

    @auto_fp16(apply_to=('img',))
    def forward(self, img):
        return self.head.decode(*self.head(self.backbone(img)))


class PlainDetector(Detector):
    """The same network as 1.x code has it: no flags, no decorators."""

    def __init__(self) -> None:
        super().__init__()
        del self.fp16_enabled, self.head.fp16_enabled

    def forward(self, img):
        feats = self.backbone(img)
        scores, deltas = self.head.cls(feats).float(), self.head.reg(feats).float()
        return scores.sigmoid().flatten(1), deltas.exp().flatten(1)


def load(model: nn.Module, checkpoint: bytes) -> nn.Module:
    model.load_state_dict(torch.load(io.BytesIO(checkpoint)))
    return model.eval()


def evaluate(model: nn.Module, img: torch.Tensor) -> tuple:
    """The model's outputs, and the dtype its first convolution computed in."""
    seen = []
    handle = model.backbone[0].register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    with torch.no_grad():
        outputs = model(img)
    handle.remove()
    return outputs, seen[0]


def rel_err(outputs, reference) -> float:
    return max(float((o.float() - r).abs().max() / r.abs().max())
               for o, r in zip(outputs, reference))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=('bfloat16', 'float16'), default='bfloat16')
    dtype = getattr(torch, parser.parse_args().dtype)
    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.save(Detector().eval().state_dict(), buffer)  # the float32 checkpoint
    checkpoint = buffer.getvalue()
    img = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    reference, ran32 = evaluate(load(Detector(), checkpoint), img)
    print(f'float32: backbone {ran32}')

    native = wrap_fp16_model(load(Detector(), checkpoint), dtype)
    outputs, ran = evaluate(native, img)
    err_native = rel_err(outputs, reference)
    print(f'native: backbone {ran}, decoded in {native.head.decoded_in}, '
          f'weights {native.backbone[0].weight.dtype}, relative error {err_native:.2g}')

    legacy = wrap_fp16_model(load(Detector(), checkpoint), dtype, backend='legacy',
                             fp32_modules=['head.reg'])
    outputs, ran = evaluate(legacy, img)
    err_legacy = rel_err(outputs, reference)
    print(f'legacy: backbone {ran}, weights {legacy.backbone[0].weight.dtype} '
          f'(norm {legacy.backbone[1].weight.dtype}, head.reg {legacy.head.reg.weight.dtype}), '
          f'decoded in {legacy.head.decoded_in}, relative error {err_legacy:.2g}')

    plain = load(PlainDetector(), checkpoint)
    with eval_precision(plain, dtype, fp32_modules=['head.reg']) as precision:
        outputs, ran = evaluate(plain, img)
        kept = kept_fp32(plain)
    err_plain = rel_err(outputs, reference)
    print(f'without flags: {precision.backend} {precision.dtype}, backbone {ran}, kept {kept} '
          f'(after: {kept_fp32(plain)}), relative error {err_plain:.2g}')
    print(f'summary: {dtype}, native {err_native:.2g}, legacy {err_legacy:.2g}, '
          f'without flags {err_plain:.2g}')


if __name__ == '__main__':
    main()
