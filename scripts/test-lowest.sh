#!/usr/bin/env bash
# The dependencies at the LOWEST versions pyproject.toml allows: a virtualenv
# of its own (.venv-lowest) installed with .ci/lowest-constraints.txt, then
# the tests that exercise each dependency (the conformance suite on every
# single-server backend, each backend's client and compatibility tests).
# The main test command (scripts/test.sh) runs the highest allowed versions.
# Usage: ./scripts/test-lowest.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV_LOWEST:-$ROOT/.venv-lowest}"
source "$ROOT/scripts/_venv.sh"
cd "$ROOT"
if [ -z "${AIOLOCKS_ZK_HOSTS:-}${AIOLOCKS_REDIS_URL:-}" ]; then
    bash "$ROOT/scripts/install-servers.sh"
fi
PIP_CONSTRAINT_LOWEST="$ROOT/.ci/lowest-constraints.txt"
stamp="$VENV/.aiolocks-lowest"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] \
        || [ "$PIP_CONSTRAINT_LOWEST" -nt "$stamp" ]; then
    echo "== installing aiolocks[test] at the lowest allowed versions into $VENV"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -c "$PIP_CONSTRAINT_LOWEST" -e "$ROOT[test,otel]"
    touch "$stamp"
fi
echo "== versions under test (lowest allowed)"
"$VENV/bin/python" -m pip list 2>/dev/null \
    | grep -iE '^(aiozk|redis|asyncpg|grpcio|protobuf|aetcd|anyio|prometheus.client|opentelemetry-api) '
echo "== pytest (lowest allowed versions)"
AIOLOCKS_CONFORMANCE_TOPOLOGIES=0 "$VENV/bin/python" -m pytest \
    tests/conformance/test_mutex.py tests/conformance/test_rwlock.py \
    tests/conformance/test_semaphore.py tests/conformance/test_loss.py \
    tests/conformance/test_records.py tests/conformance/test_anyio.py \
    tests/etcd/test_client.py tests/zookeeper/test_client.py \
    tests/postgres/test_asyncpg_compat.py tests/core tests/test_exports.py "$@"
