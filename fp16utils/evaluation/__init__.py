"""Half-precision evaluation: a model's forwards in the precision its training configured.

- :func:`eval_precision` / :class:`EvalPrecision`: the context an evaluation runs its
  forwards in: autocast on the model's device, or a half model's inputs cast to its
  dtype; ``fp32_modules`` in float32 while it is open.
- :func:`configured_precision`: the dtype, backend and float32 modules a run's
  optimizer wrapper (built, or its config) configured.
- :func:`keeping_weight_dtypes`: conv-BN fusion (mmcv's ``fuse_conv_bn``) that keeps a
  half model half.
- :mod:`~fp16utils.evaluation.mmengine_loops`: ``Fp16utilsValLoop`` and
  ``Fp16utilsTestLoop``, MMEngine's loops made of the above (imported by
  :mod:`fp16utils.mmengine`; nothing here imports MMEngine).

torch only: no framework is imported by this package itself.
"""

from .configured import configured_precision
from .context import EvalPrecision, eval_precision
from .fuse import keeping_weight_dtypes

__all__ = ['EvalPrecision', 'configured_precision', 'eval_precision', 'keeping_weight_dtypes']
