"""``python -m llmtrio``: the ``llmtrio`` command."""

import sys

from ._cli import main

sys.exit(main())
