#!/usr/bin/env bash
# Run the flash-sale demo (memory:// unless --url is given).
# Usage: ./scripts/demo.sh [--url URL] [--workers N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ensure_venv ""
exec "$VENV/bin/aiolocks" demo "$@"
