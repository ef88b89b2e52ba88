#!/usr/bin/env bash
# The tests: set up .venv with the test tools (and Debian's chromium for the browser test, where
# missing and installable), then unit tests, notebook runs and nbval. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh xla,test
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the report's browser test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "could not install chromium: the browser test will skip"
  else
    echo "chromium is missing and cannot be installed here: the browser test will skip"
  fi
fi
exec .venv/bin/python -m pytest tests notebooks --nbval-lax --nbval-current-env -p no:cacheprovider "$@"
