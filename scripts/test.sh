#!/usr/bin/env bash
# The test command: installs what is missing (Python packages; ZooKeeper,
# Java, Redis, etcd, PostgreSQL and pgbouncer from Debian packages), then
# runs ruff, mypy --strict, the
# docs site build (mkdocs --strict: a broken page or link fails), the
# packaging check (wheel and sdist that `twine check --strict` accepts) and
# pytest. The tests start their own servers on free ports.
# Usage: ./scripts/test.sh [pytest args...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
if [ -z "${AIOLOCKS_ZK_HOSTS:-}${AIOLOCKS_REDIS_URL:-}" ]; then
    bash "$ROOT/scripts/install-servers.sh"
fi
ensure_venv "[dev]"
echo "== ruff check"
"$VENV/bin/python" -m ruff check .
echo "== mypy --strict aiolocks tests examples benchmarks"
"$VENV/bin/python" -m mypy --strict aiolocks tests examples benchmarks
echo "== mkdocs build --strict"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
"$VENV/bin/python" -m mkdocs build --strict --quiet --site-dir "$SCRATCH/site"
echo "== build wheel + sdist, twine check --strict"
"$VENV/bin/python" -m build --wheel --sdist --outdir "$SCRATCH/dist" "$ROOT" >"$SCRATCH/build.log" 2>&1 \
    || { cat "$SCRATCH/build.log"; exit 1; }
"$VENV/bin/python" -m twine check --strict "$SCRATCH"/dist/*
echo "== pytest"
# Warnings are errors (pyproject.toml): a socket or connection left unclosed
# fails the run, in whichever test the garbage collector reports it.
"$VENV/bin/python" -m pytest "$@"
