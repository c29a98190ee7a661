"""``python -m flows.cli``: the ``flows`` command."""

import sys

from flows.cli.app import main

sys.exit(main())
