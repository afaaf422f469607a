#!/usr/bin/env bash
# Installs what remat's build and tests need on a fresh Debian 12 machine (idempotent).
# Runs apt-get only when something is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  cmake ninja-build ccache g++ pkg-config
  libgtest-dev libbenchmark-dev
  libspdlog-dev nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas-openmp-dev zlib1g-dev libboost-context-dev
  dataset-fashion-mnist fortunes
  python3-torch python3-numpy
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

# The CUDA toolkit is optional: without it remat builds CPU-only (REMAT_CUDA=AUTO).
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bootstrap: CUDA toolkit found"
else
  echo "bootstrap: no CUDA toolkit; building CPU-only"
fi
