"""``python -m labq.cli``: the same ``labq`` as the installed command."""

import sys

from labq.cli import main

sys.exit(main())
