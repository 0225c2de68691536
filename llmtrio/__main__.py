"""``python -m llmtrio``: the ``llmtrio`` command."""

import sys

from .cli import main

sys.exit(main())
