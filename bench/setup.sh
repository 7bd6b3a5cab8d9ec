#!/usr/bin/env bash
# Installs the benchmark's peers away from the project's own environment:
#   bench/.venv          Python peers + matplotlib + echomq (editable)
#   bench/.venv-arq      arq alone (it pins redis-py < 6)
#   bench/node/          BullMQ on Node (npm bullmq + ioredis)
# Usage: bash bench/setup.sh   (from anywhere; idempotent)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${PYTHON:-python3}"

# Two venvs: arq (latest 0.28) needs redis-py < 6, while the newest bullmq-py, celery/kombu
# and taskiq-redis need redis-py >= 6.2 / 6.4 / 8; so arq gets its own venv and every other
# Python peer (and echomq) shares bench/.venv with the newest redis-py.
if [ ! -x "$here/.venv/bin/python" ]; then
  "$py" -m venv "$here/.venv"
fi
"$here/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$here/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade \
  rq saq 'dramatiq[redis]' huey 'celery[redis]' taskiq taskiq-redis bullmq matplotlib hiredis
"$here/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root"

if [ ! -x "$here/.venv-arq/bin/python" ]; then
  "$py" -m venv "$here/.venv-arq"
fi
"$here/.venv-arq/bin/python" -m pip install -q --disable-pip-version-check --upgrade arq

if command -v npm >/dev/null 2>&1; then
  (cd "$here/node" && npm install --no-audit --no-fund --loglevel=error)
else
  echo "setup: npm not found; the BullMQ (Node) rows will be reported as not run" >&2
fi
for v in .venv .venv-arq; do
  echo "$v:"
  "$here/$v/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -i -E '^(rq|arq|saq|dramatiq|huey|celery|kombu|taskiq|taskiq-redis|bullmq|redis|hiredis|matplotlib|echomq) '
done
(cd "$here/node" && npm ls --depth=0 2>/dev/null) || true
