#!/usr/bin/env bash
# The tests: set up .venv with the test tools, Ray and the audio packages (and Debian's chromium for the
# browser test, alsa-utils and espeak-ng for the audio tests, where missing and installable), then unit tests, notebook runs and nbval. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# sweep: Ray, so that tests/run/test_sweep.py runs a real sweep (the test extra stays the test tools alone)
scripts/bootstrap.sh xla,audio,test,sweep
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the report's browser test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "could not install chromium: the browser test will skip"
  else
    echo "chromium is missing and cannot be installed here: the browser test will skip"
  fi
fi
# Two processes side by side (compiling leaves a core idle much of the time): the notebooks under
# nbval, in order (each reads the results of the ones before, in runs/notebook), then the check of
# the report they wrote, then the unit tests that run notebooks, kernels or a browser themselves and a few files of
# compiles (BESIDE, chosen so that the two halves take about as long: docs/benchmarks/speed.md has their times);
# and the other unit tests. Extra arguments go to both. The notebooks run
# with the small parameters of tools/prepare_notebooks.py (papermill injects them; nothing else changes).
# nbval's kernels are forked from portkit's fork server, as a run's are (tests/conftest.py).
# One thread of torch (OpenMP) each: two processes of two threads on two cores wait on each other (measured
# on this 2-core machine: side by side, two threads each took two fifths longer than one each; speed.md).
export OMP_NUM_THREADS=1
BESIDE=(tests/notebooks/test_workbook_report.py tests/cli/test_cli.py tests/run/test_runner.py
        tests/stages/report/test_report_browser.py tests/zoo/test_zoo.py tests/zoo/test_zoo_caches.py
        tests/run/test_interrupt.py tests/stages/compile/test_loop_finding.py
        tests/deploy/test_deploy.py tests/stages/report/test_report_numbers.py
        tests/workloads/test_encoder_decoder.py tests/tpu_compile/test_lowerings.py tests/stages/test_audio_stages.py
        tests/notebooks/test_nbval_kernels.py tests/run/test_kernel_forks.py tests/stages/xla/test_xla_generation.py)
mkdir -p test-artifacts
rm -rf test-artifacts/notebooks
.venv/bin/python tools/prepare_notebooks.py test-artifacts/notebooks > /dev/null
.venv/bin/python -m pytest test-artifacts/notebooks "${BESIDE[@]}" --nbval-lax --nbval-current-env \
  -p no:cacheprovider "$@" > test-artifacts/notebooks.log 2>&1 &
notebooks=$!
status=0
.venv/bin/python -m pytest tests "${BESIDE[@]/#/--ignore=}" -p no:cacheprovider "$@" || status=$?
wait "$notebooks" || status=$?
echo; echo "---- notebooks (nbval), the report they wrote, and the unit tests that run notebooks: test-artifacts/notebooks.log"
cat test-artifacts/notebooks.log
exit "$status"
