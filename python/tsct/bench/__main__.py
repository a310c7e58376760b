"""``python -m tsct.bench``: the same as the ``tsct-bench`` command."""

from tsct.bench.cli import main

raise SystemExit(main())
