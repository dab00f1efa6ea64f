#!/usr/bin/env bash
# Run pytest from the project venv, one worker process per core (pytest-xdist; every test computes on one torch
# thread, tests/conftest.py; an idle worker takes tests queued for another, so that long tests do not leave it
# idle); "no tests collected" (exit 5) is a failure, not a silent pass. PYTEST_VENV picks another environment
# (make test-hf4: .venv-hf4).
set -uo pipefail
cd "$(dirname "$0")/.."
"${PYTEST_VENV:-.venv}/bin/python" -m pytest -q -n auto --dist worksteal "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing the run" >&2
    exit 1
fi
exit "$rc"
