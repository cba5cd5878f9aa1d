import sys

from .supervised import as_supervised

as_supervised()  # before the rest is imported (shim/supervised.py)

from .cli import main  # noqa: E402

sys.exit(main())
