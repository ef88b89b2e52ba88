#!/usr/bin/env bash
# The main job: set up .venv, then run the whole workbook on the default model (MiniLM, real
# pretrained weights) for Trainium and TPU. Extra arguments go to `portkit run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh xla,audio
exec .venv/bin/portkit run --model minilm --target neuron --target tpu --out runs/minilm "$@"
