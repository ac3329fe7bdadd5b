"""``python -m reactive``: the command line (see :mod:`reactive.cli`)."""

from .cli import main

raise SystemExit(main())
