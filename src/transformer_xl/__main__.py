"""``python -m transformer_xl`` (also what ``torchrun -m transformer_xl`` runs)."""

import sys

try:
    from transformer_xl.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: the same one line as transformer_xl.cli.main prints
    sys.stderr.write("txl: interrupted\n")
    sys.exit(130)

sys.exit(main())
