"""``python -m pjrt_py``: the pjrt-py command."""

import sys

from .cli.app import main

if __name__ == "__main__":  # importing the module (as doc tools do) runs nothing
    sys.exit(main())
