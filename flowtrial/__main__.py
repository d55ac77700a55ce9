"""``python -m flowtrial``: the same as the ``flowtrial`` command."""

from .cli import main

main()
