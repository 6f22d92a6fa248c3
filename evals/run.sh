#!/usr/bin/env bash
# `make eval`: SmolLM2-135M-Instruct served by llama-cpp-python on the CPU (1 thread); the eval's user-worded goals
# planned, approved and run through the runner (evals/models_eval.py: the model's pass, then the rules planner's).
# With OPENAI_BASE_URL set, that server is evaluated instead.
# One run at a time (a lock in var/); the server is stopped however the run ends.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p var
exec 9>var/eval.lock
flock -n 9 || { echo "another eval is running (var/eval.lock)" >&2; exit 1; }

if [ -n "${OPENAI_BASE_URL:-}" ]; then
  exec "$PY" evals/models_eval.py
fi

PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
evals/smollm2.sh serve "$PORT" smollm2-135m > var/eval-server.log 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1 1800); do  # the install first (seconds; minutes without a wheel), then the load
  if curl -fs "http://127.0.0.1:$PORT/v1/models" > /dev/null; then break; fi
  kill -0 "$SERVER" 2>/dev/null || { cat var/eval-server.log >&2; exit 1; }
  sleep 0.5
done
OPENAI_BASE_URL="http://127.0.0.1:$PORT/v1" EVAL_MODEL=smollm2-135m "$PY" evals/models_eval.py
