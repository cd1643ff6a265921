"""The ``fp16utils`` command: :mod:`.cli` (the parser and the sub-commands), :mod:`.help`
(their texts), :mod:`.run` (``fp16utils run``) and :mod:`.demo` (``fp16utils demo``)."""
