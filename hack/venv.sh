#!/usr/bin/env bash
# Create or reuse the project's virtualenv outside the repo, keyed by the Python
# version and a hash of pyproject.toml, so a dependency change builds a fresh one and
# an unchanged one is reused (torch alone is several GB). Prints the venv path.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_ROOT="${GPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob}"
PYTHON="${PYTHON:-python3}"
pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
# Key on the dependency lists only, so editing other pyproject settings keeps the venv.
key=$("$PYTHON" - "$here/pyproject.toml" <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = [project.get("dependencies", []), project.get("optional-dependencies", {})]
print(hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:12])
PY
)
VENV="$CACHE_ROOT/venv-py$pyver-$key"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/venv.lock"
flock 9
if [[ ! -f "$VENV/.complete" ]]; then
  echo "[venv] creating $VENV (first run downloads torch, several minutes)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip setuptools wheel >&2
  "$VENV/bin/pip" install --quiet -e "$here[trainer,integrations,test,lint]" >&2
  touch "$VENV/.complete"
fi
# The editable install points at one checkout; repoint it when this checkout differs.
if [[ "$(cat "$VENV/.checkout" 2>/dev/null)" != "$here" ]]; then
  "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e "$here" >&2
  echo "$here" >"$VENV/.checkout"
fi
echo "$VENV"
