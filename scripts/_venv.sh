# Sourced by the scripts: make sure $VENV exists with aiolocks installed.
# Usage: ensure_venv <extras>   (extras: "" or "[dev]")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
    local extras="${1:-}"
    if ! "$PYTHON" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 14) else 1)' 2>/dev/null; then
        echo "aiolocks needs Python 3.11-3.13; $PYTHON is $("$PYTHON" --version 2>&1)." >&2
        echo "Set PYTHON=/path/to/python3.11 and run again." >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== creating $VENV with $("$PYTHON" --version)"
        "$PYTHON" -m venv "$VENV"
    fi
    local stamp="$VENV/.aiolocks-installed$extras"
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        echo "== installing aiolocks$extras into $VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q -e "$ROOT$extras"
        touch "$stamp"
    fi
}
