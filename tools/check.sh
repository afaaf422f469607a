#!/usr/bin/env bash
# Builds and runs every test: the default build (CUDA when the toolkit is present), the
# CPU-only build (REMAT_CUDA=OFF) and the AddressSanitizer + UBSan build.
# Usage: tools/check.sh [preset ...]    (default: format check, then default cpu asan)
#        tools/check.sh --format        (only the format check: every C++ and CUDA file as
#                                        .clang-format says; fix with the command it prints)
# Tests labelled `gpu` run where a GPU exists and are reported as skipped elsewhere (by the
# default preset: the asan preset leaves them out, and the op cases' shuffled-lanes rerun,
# a logic check the default preset makes; CMakePresets.json, its test preset's filter).
# The asan preset also runs the device executor tests on the tiny test configs only
# (REMAT_TEST_MODELS=tiny; tests/test_device_exec.cpp), not on the shipped ones scaled down.
set -euo pipefail
cd "$(dirname "$0")/.."

format_check() {
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
  echo "=== format: ${#files[@]} files against .clang-format ($(clang-format --version))"
  if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/remat-format.$$; then
    head -40 /tmp/remat-format.$$
    rm -f /tmp/remat-format.$$
    echo "=== format check failed; fix with: git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i"
    exit 1
  fi
  rm -f /tmp/remat-format.$$
}

if [[ "${1:-}" == "--format" ]]; then format_check; exit 0; fi
presets=("$@")
if ((${#presets[@]} == 0)); then
  presets=(default cpu asan)
  format_check
fi

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
