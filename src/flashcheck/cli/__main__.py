"""``python -m flashcheck.cli``: the ``flashcheck`` command."""

import sys

from .main import main

sys.exit(main())
