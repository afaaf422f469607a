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
  openmpi-bin libopenmpi-dev
  gcc-12-locales sentencepiece libsentencepiece-dev
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

cd "$(dirname "$0")/.."

# ensure_venv WHAT VENV REQUIREMENTS IMPORT SYSTEM_SITE: a venv at VENV with the pinned
# versions of REQUIREMENTS (pip from PyPI), made again when the requirements change (their
# hash is stamped in the venv); SYSTEM_SITE=yes lets it see Debian's packages (torch,
# numpy). Where pip fails, a warning: the tests that need it report themselves skipped.
ensure_venv() {
  local what=$1 venv=$2 req=$3 import=$4 system_site=$5 stamp
  stamp="$(sha256sum "$req" | cut -d' ' -f1)"
  if [[ -f "$venv/.remat-requirements" && "$(cat "$venv/.remat-requirements")" == "$stamp" ]] &&
     "$venv/bin/python" -c "import $import" 2>/dev/null; then
    echo "bootstrap: $what venv present ($venv)"
    return
  fi
  echo "bootstrap: making the $what venv $venv ($req)"
  if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" ]]; then
    echo "bootstrap: $venv exists and is not a venv; not replacing it" >&2
    exit 1
  fi
  local flags=(--clear)
  if [[ $system_site == yes ]]; then flags+=(--system-site-packages); fi
  if /usr/bin/python3 -m venv "${flags[@]}" "$venv" &&
     "$venv/bin/pip" install -q --disable-pip-version-check --no-input -r "$req"; then
    echo "$stamp" > "$venv/.remat-requirements"
  else
    echo "bootstrap: WARNING: could not install $req into $venv; the tests that need $import will be skipped" >&2
  fi
}

# Hugging Face transformers for the interop tests (tests/interop): Debian's python3 is
# externally managed, so pip installs them into a venv that sees the system's torch 1.13
# and numpy; tools/python/interop_python.sh finds it.
ensure_venv interop "$(bash tools/python/interop_python.sh --venv)" tools/python/requirements-interop.txt transformers yes

# Playwright for Python for the browser test of the HTML memory page (tests/browser), in a
# venv of its own (tools/python/browser_python.sh finds it). Its browsers are never downloaded
# (no `playwright install`): the test drives Debian's chromium, installed above.
ensure_venv browser "$(bash tools/python/browser_python.sh --venv)" tools/python/requirements-browser.txt playwright.sync_api no

# The CUDA toolkit is optional: without it remat builds CPU-only (REMAT_CUDA=AUTO).
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bootstrap: CUDA toolkit found"
else
  echo "bootstrap: no CUDA toolkit; building CPU-only"
fi
