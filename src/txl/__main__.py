"""``python -m txl`` (also what ``torchrun -m txl`` runs)."""

import sys

from txl.cli import main

sys.exit(main())
