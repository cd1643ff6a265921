"""``python -m fp16utils``: the same as the ``fp16utils`` command."""

import sys

from .tools.cli import main

sys.exit(main())
