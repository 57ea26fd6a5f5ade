"""`python -m toolkit.cli ...`: the `toolkit` command."""

import sys

from .main import main

sys.exit(main())
