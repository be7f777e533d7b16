"""``python -m bertforge``: the same as the ``bertforge`` command."""

import sys

from bertforge.cli import main

sys.exit(main())
