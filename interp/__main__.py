"""``python -m interp`` (what ``torchrun -m interp`` runs on every rank): the ``interp`` command line."""

import sys

from .cli import main

sys.exit(main())
