#!/usr/bin/env bash
# Installs what remat's build and tests need on a fresh Debian 12 machine (idempotent).
# Runs apt-get only when something is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  cmake ninja-build ccache g++ pkg-config clang-format
  libgtest-dev libbenchmark-dev
  libspdlog-dev nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas-openmp-dev zlib1g-dev libboost-context-dev
  dataset-fashion-mnist fortunes
  python3-torch python3-numpy python3-venv
  libjs-chart.js chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "bootstrap: all packages present"
fi

# Hugging Face transformers for the interop tests (tests/interop): Debian's python3 is
# externally managed, so pip installs the pinned versions of tools/requirements-interop.txt
# into a venv that sees the system's packages (torch 1.13, numpy). It is made again when
# the requirements change; tools/interop_python.sh finds it.
cd "$(dirname "$0")/.."
venv="$(bash tools/interop_python.sh --venv)"
req=tools/requirements-interop.txt
stamp="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -f "$venv/.remat-requirements" && "$(cat "$venv/.remat-requirements")" == "$stamp" ]] &&
   "$venv/bin/python" -c 'import transformers' 2>/dev/null; then
  echo "bootstrap: interop venv present ($venv)"
else
  echo "bootstrap: making the interop venv $venv (pinned transformers)"
  if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" ]]; then
    echo "bootstrap: $venv exists and is not a venv; not replacing it" >&2
    exit 1
  fi
  if /usr/bin/python3 -m venv --clear --system-site-packages "$venv" &&
     "$venv/bin/pip" install -q --disable-pip-version-check --no-input -r "$req"; then
    echo "$stamp" > "$venv/.remat-requirements"
  else
    # Without it the interop tests that need transformers report themselves skipped.
    echo "bootstrap: WARNING: could not install $req into $venv; the transformers interop tests will be skipped" >&2
  fi
fi

# Playwright for Python for the browser test of the HTML memory page (tests/browser): a
# venv of its own (tools/browser_python.sh finds it) with the pinned versions of
# tools/requirements-browser.txt. Its browsers are never downloaded (no `playwright
# install`): the test drives Debian's chromium, installed above.
bvenv="$(bash tools/browser_python.sh --venv)"
breq=tools/requirements-browser.txt
bstamp="$(sha256sum "$breq" | cut -d' ' -f1)"
if [[ -f "$bvenv/.remat-requirements" && "$(cat "$bvenv/.remat-requirements")" == "$bstamp" ]] &&
   "$bvenv/bin/python" -c 'import playwright.sync_api' 2>/dev/null; then
  echo "bootstrap: browser venv present ($bvenv)"
else
  echo "bootstrap: making the browser venv $bvenv (pinned Playwright)"
  if [[ -e "$bvenv" && ! -f "$bvenv/pyvenv.cfg" ]]; then
    echo "bootstrap: $bvenv exists and is not a venv; not replacing it" >&2
    exit 1
  fi
  if /usr/bin/python3 -m venv --clear "$bvenv" &&
     "$bvenv/bin/pip" install -q --disable-pip-version-check --no-input -r "$breq"; then
    echo "$bstamp" > "$bvenv/.remat-requirements"
  else
    echo "bootstrap: WARNING: could not install $breq into $bvenv; the browser test will be skipped" >&2
  fi
fi

# The CUDA toolkit is optional: without it remat builds CPU-only (REMAT_CUDA=AUTO).
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bootstrap: CUDA toolkit found"
else
  echo "bootstrap: no CUDA toolkit; building CPU-only"
fi
