"""``python -m raymodel.cli``: the ``raymodel`` command."""

from raymodel.cli import main

raise SystemExit(main())
