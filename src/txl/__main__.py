"""``python -m txl`` (also what ``torchrun -m txl`` runs)."""

import sys

try:
    from txl.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: the same one line as txl.cli.main prints
    sys.stderr.write("txl: interrupted\n")
    sys.exit(130)

sys.exit(main())
