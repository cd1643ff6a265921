"""The ``fp16utils`` command: :mod:`.cli` (the parser, the sub-commands), :mod:`.env`,
:mod:`.help` (their texts), :mod:`.run` (``fp16utils run``) and :mod:`.demo`."""
