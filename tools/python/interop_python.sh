#!/usr/bin/env bash
# The Python of remat's interop tests (tests/interop) and tools: $REMAT_INTEROP_PYTHON when
# set, else the venv tools/bootstrap.sh makes (Debian's python3 with its torch, plus the
# pinned transformers of tools/python/requirements-interop.txt), else Debian's /usr/bin/python3
# (the tests that need transformers then skip, saying so).
#   tools/python/interop_python.sh --venv        prints the venv's folder
#   tools/python/interop_python.sh ARGS...       runs that Python with ARGS
set -euo pipefail
venv="${REMAT_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/remat/py-interop}"
if [[ "${1:-}" == "--venv" ]]; then
  echo "$venv"
  exit 0
fi
if [[ -n "${REMAT_INTEROP_PYTHON:-}" ]]; then
  py="$REMAT_INTEROP_PYTHON"
elif [[ -x "$venv/bin/python" ]]; then
  py="$venv/bin/python"
else
  py=/usr/bin/python3
fi
exec "$py" "$@"
