"""``python -m echomq`` is the ``echomq`` command."""

from echomq.cli import main

main()
