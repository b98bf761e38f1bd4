"""``python -m faststream_retry``: the ``faststream-retry`` command."""

from faststream_retry.cli import main

main()
