"""Collection rules for the whole checkout (doctests included)."""

from importlib.util import find_spec

#: fp16utils.mmengine imports mmengine at import time; its doctests run in the MMEngine
#: tier (.ci/mmengine) and are skipped where mmengine is not installed (a spec without
#: an origin is a namespace package, such as the folder tests/mmengine).
_spec = find_spec('mmengine')
collect_ignore = ([] if _spec is not None and _spec.origin is not None
                  else ['fp16utils/mmengine.py'])
