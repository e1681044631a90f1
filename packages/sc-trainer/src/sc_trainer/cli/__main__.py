"""``python -m sc_trainer.cli``: the ``sc-demo`` command."""

import sys

from . import demo_main

sys.exit(demo_main())
