"""``python -m txl`` (also what ``torchrun -m txl`` runs)."""

import sys

from txl._cli import main

sys.exit(main())
