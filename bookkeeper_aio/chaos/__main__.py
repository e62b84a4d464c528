"""``python -m bookkeeper_aio.chaos``."""

import sys

from .run import main

sys.exit(main())
