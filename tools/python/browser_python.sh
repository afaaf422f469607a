#!/usr/bin/env bash
# The Python of remat's browser test (tests/browser, ctest label browser): $REMAT_BROWSER_PYTHON
# when set, else the venv tools/bootstrap.sh makes (Debian's python3 plus the pinned
# Playwright of tools/python/requirements-browser.txt), else /usr/bin/python3 (the test then
# reports itself skipped, saying that Playwright is missing).
#   tools/python/browser_python.sh --venv        prints the venv's folder
#   tools/python/browser_python.sh ARGS...       runs that Python with ARGS
set -euo pipefail
venv="${REMAT_BROWSER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/remat/py-browser}"
if [[ "${1:-}" == "--venv" ]]; then
  echo "$venv"
  exit 0
fi
if [[ -n "${REMAT_BROWSER_PYTHON:-}" ]]; then
  py="$REMAT_BROWSER_PYTHON"
elif [[ -x "$venv/bin/python" ]]; then
  py="$venv/bin/python"
else
  py=/usr/bin/python3
fi
exec "$py" "$@"
