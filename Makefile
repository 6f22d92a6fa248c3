# Two commands for a fresh machine: `make run` and `make test`. Everything else is set up by them.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# A Python >= 3.12 that actually runs: python3.13/python3.12 on PATH, then pyenv's versions.
PYTHON_BOOT := $(shell for p in python3.13 python3.12 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then command -v $$p; exit; fi; done; \
	  root=$$(pyenv root 2>/dev/null); for v in $$(ls -r $$root/versions 2>/dev/null); do \
	  p=$$root/versions/$$v/bin/python3; if [ -x $$p ] && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then echo $$p; exit; fi; done)

.PHONY: run test lint docs bench eval trial mutate setup password clean check-python

check-python:
	@if [ -z "$(PYTHON_BOOT)" ]; then echo "This project needs Python >= 3.12 (Django 6.1). Install python3.12 or newer (OS package, pyenv or python.org) and run make again." >&2; exit 1; fi

$(STAMP): pyproject.toml | check-python
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --if-empty
	$(PY) manage.py serve --port $${PORT:-8000}

password: $(STAMP)
	$(PY) manage.py changepassword $${USERNAME:-admin}

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy .
	cd clients/python && ../../$(PY) -m mypy planner_client

# The documentation site (docs/, Sphinx + Furo + MyST), built strictly: a warning (a broken link, a page in no
# table of contents) fails the build. Open var/docs-html/index.html.
docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -q -b html docs var/docs-html

# The suite runs twice: embedded (SQLite + in-memory layer) and scale-out (PostgreSQL + Redis). The two passes
# share nothing (their own databases, channel prefixes, ports and temporary folders), so they run side by side,
# a core each; the scale-out pass's report follows the embedded one's, and either failing fails the target.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy .
	cd clients/python && ../../$(PY) -m mypy planner_client
	$(PY) manage.py makemigrations --check --dry-run
	$(MAKE) --no-print-directory docs
	@mkdir -p var
	@$(PY) tests/scaleout_pass.py -p no:cacheprovider > var/test-scaleout.log 2>&1 & scaleout=$$!; \
	  trap 'kill $$scaleout 2>/dev/null' INT TERM; \
	  echo "The scale-out pass runs beside this one; its report follows (var/test-scaleout.log)."; \
	  $(VENV)/bin/pytest; embedded=$$?; \
	  wait $$scaleout; scaleout_rc=$$?; \
	  cat var/test-scaleout.log; \
	  echo "embedded pass: exit $$embedded; scale-out pass: exit $$scaleout_rc"; \
	  test $$embedded -eq 0 -a $$scaleout_rc -eq 0

bench: $(STAMP)
	$(PY) -m tests.bench

# A real model on the CPU (not part of `make test`): see README "Real models". OPENAI_BASE_URL=... evaluates that server.
eval: $(STAMP)
	evals/run.sh

# Mutation testing of the seeds' rule modules (docs/mutation.md), not part of `make test`: mutmut changes the code one
# small break at a time and runs the guarding tests against each; tests/mutation_report.py writes
# var/mutation-report.md, row by row of docs/seeds.md, and fails on a survivor nobody explained.
# MUTATE picks mutants by mutmut's names: `module.path*` for a whole module, `module.x_<function>__mutmut_*` for
# one function. The default: every module or function a row of docs/seeds.md cites as a seed rule's code, within
# about an hour on two shared cores (docs/mutation.md says which, and how long the last run took).
MUTATE ?= goals.system* agents.persona* agents.world* \
	$(foreach f,persona_cycle persona_record persona_prepare persona_state persona_step_choose plan_replan \
	  plans_waiting persona_milestones_check,runtime.cycle.x_$(f)__mutmut_*) \
	$(foreach f,plan_attempts reflection_helps,planning.planner.x_$(f)__mutmut_*) \
	$(foreach f,_check_loops _loop _check_dependencies,planning.engine.validate.x_$(f)__mutmut_*) \
	$(foreach f,steps_runnable steps_blocked,planning.engine.schedule.x_$(f)__mutmut_*) \
	planning.engine.parse.x_plan_parse__mutmut_* \
	$(foreach f,goal_complexity should_plan,planning.engine.complexity.x_$(f)__mutmut_*) \
	planning.engine.diff.x_plan_diff__mutmut_*
mutate: $(STAMP)
	rm -rf mutants
	@mkdir -p var && date +%s > var/mutate-started
	nice -n 19 $(VENV)/bin/mutmut run $(foreach m,$(MUTATE),'$(m)')
	$(PY) tests/mutation_report.py --started "$$(cat var/mutate-started)" --command "make mutate$(if $(filter command line environment,$(origin MUTATE)), MUTATE='$(MUTATE)')"

clean:
	rm -rf $(VENV) var mutants

# The product tried in Chromium as a new user tries it, its pages' claims checked against the files (not part of
# `make test`): SmolLM2-135M-Instruct as the README sets it up, or TRIAL_MODEL=offline for the built-in rules.
trial: $(STAMP)
	nice -n 5 $(PY) evals/browser_trial.py
