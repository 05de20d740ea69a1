"""``python -m tritonshm``: the same as the ``tritonshm`` command."""

import sys

from .cli import main

sys.exit(main())
