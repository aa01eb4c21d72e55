"""`python -m npusim` is `npusim`."""

import sys

from .cli import main

sys.exit(main())
