#!/usr/bin/env bash
# The test suite on Python 3.12 and 3.13 too (pyenv's interpreters), each in
# its own virtualenv (.venv-3.12, .venv-3.13). Usage: ./scripts/test-pythons.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
status=0
for version in 3.12 3.13; do
    python=""
    if command -v pyenv >/dev/null 2>&1; then
        prefix="$(pyenv root)/versions"
        match="$(ls -d "$prefix/$version".* 2>/dev/null | sort -V | tail -n 1 || true)"
        [ -n "$match" ] && python="$match/bin/python"
    fi
    [ -z "$python" ] && python="$(command -v "python$version" || true)"
    if [ -z "$python" ]; then
        echo "!! Python $version not found (pyenv install $version)"; status=1; continue
    fi
    echo "==== Python $version ($python)"
    PYTHON="$python" VENV="$ROOT/.venv-$version" bash "$ROOT/scripts/test.sh" "$@" || status=1
done
exit $status
