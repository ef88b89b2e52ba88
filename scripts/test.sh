#!/usr/bin/env bash
# The tests: set up .venv with the test tools, then unit tests, notebook runs and nbval.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh xla,test
exec .venv/bin/python -m pytest tests notebooks --nbval-lax --nbval-current-env -p no:cacheprovider "$@"
