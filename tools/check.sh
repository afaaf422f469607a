#!/usr/bin/env bash
# Builds and runs every test: the default build (CUDA when the toolkit is present), the
# CPU-only build (REMAT_CUDA=OFF) and the AddressSanitizer + UBSan build.
# Usage: tools/check.sh [preset ...]    (default: default cpu asan)
# Tests labelled `gpu` run where a GPU exists and are reported as skipped elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

presets=("$@")
if ((${#presets[@]} == 0)); then presets=(default cpu asan); fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"  # relative paths: cache hits across clones

for p in "${presets[@]}"; do
  echo "=== [$p] configure"
  cmake --preset "$p" >/dev/null
  echo "=== [$p] build"
  start=$(date +%s)
  cmake --build --preset "$p"
  echo "=== [$p] built in $(( $(date +%s) - start )) s"
  echo "=== [$p] test"
  ctest --preset "$p"
done
echo "=== all presets passed: ${presets[*]}"
