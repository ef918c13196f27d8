"""``python -m pjrt_py``: the pjrt-py command."""

import sys

from .cli import main

sys.exit(main())
