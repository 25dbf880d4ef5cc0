"""``python -m batchfit``: the same as the ``batchfit`` command."""

from batchfit.cli import main

raise SystemExit(main())
