"""What the configured model servers support, and what to set: `manage.py llm_check`."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from agents.llm.gateway import PURPOSES, model_chain
from agents.llm.openai_provider import format_probe, models_list_fetch
from agents.llm.structured import FORMATS, format_refused, model_profile, model_settings_key, provider_name
from agents.models import Agent


def chains() -> dict[str, list[str]]:
    """Each chain the settings and the agents name: chain label -> its models."""
    found: dict[str, list[str]] = {}
    for purpose in PURPOSES:
        found.setdefault(", ".join(model_chain(purpose)), []).append(purpose)
    labelled = {f"{'/'.join(purposes)}": chain.split(", ") for chain, purposes in found.items()}
    try:
        own = Agent.objects.exclude(planner_models="").values_list("name", "planner_models")
        for name, models in own:
            labelled[f"agent {name}"] = model_chain("plan", agent_models=models)
    except DatabaseError:
        pass  # no database yet: the settings' chains alone
    return labelled


class Command(BaseCommand):
    help = ("Probe the configured model servers: list /v1/models, try each structured-output format with a tiny "
            "request per model of each chain, and print what each server takes and what to set.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", action="append", default=[],
                            help="Check this model (repeatable) instead of every model of every chain.")

    def handle(self, *args: Any, **options: Any) -> None:
        labelled = {"--model": options["model"]} if options["model"] else chains()
        models: list[str] = []
        for label, chain in labelled.items():
            self.stdout.write(f"Chain {label}: {' -> '.join(chain)}")
            models += [m for m in chain if m not in models]
        failed: list[str] = []
        listed = False
        suggested: dict[str, dict[str, Any]] = {}
        for model in models:
            provider = provider_name(model)
            self.stdout.write("")
            if not settings.LLM_PROVIDERS.get(provider, {}).get("list"):
                self.stdout.write(f"{model}: served by {provider or 'no provider'} in this process, nothing to probe.")
                continue
            if not listed:
                listed = True
                self.list_models()
            key = model_settings_key(model)
            profile = model_profile(model)
            source = f"LLM_MODEL_SETTINGS[{json.dumps(key)}]" if key else "defaults (no LLM_MODEL_SETTINGS entry matches)"
            self.stdout.write(f"{model}: settings from {source}: format {profile.format}, "
                              f"context {profile.context or 'unknown'}, small {profile.small}"
                              + (f" ({profile.small_from})" if profile.small_from not in ("", "settings") else ""))
            probes = [format_probe(model, fmt) for fmt in FORMATS]
            for probe in probes:
                self.stdout.write(f"  {probe.format:<12} {probe.outcome:<9} {probe.seconds:5.1f} s  {probe.detail}")
            best = next((p.format for p in probes if p.outcome == "json"), None)
            if best is None and any(p.outcome == "answered" for p in probes):
                best = "off"
            if best is None:
                failed.append(model)
                self.stdout.write(self.style.ERROR(f"  {model} answered no request: see the errors above."))
                continue
            if any(p.format == "json_schema" and p.outcome == "refused" for p in probes):
                detail = next(p.detail for p in probes if p.format == "json_schema")
                format_refused(model, "json_schema", f"llm_check: {detail}")
            self.stdout.write(self.style.SUCCESS(f"  use format {best}") + (
                "" if best == profile.format else " (found by itself at the first call; set it to skip the probe)"))
            own = dict(settings.LLM_MODEL_SETTINGS.get(key, {})) if key else {}
            suggested[key or model] = {**own, "format": best}
        if suggested:
            self.stdout.write("")
            self.stdout.write("To set (optional: formats are found at the first call; add \"context\" and \"small\" "
                              "for a small local model):")
            self.stdout.write(f"LLM_MODEL_SETTINGS='{json.dumps(suggested)}'")
        if failed:
            raise CommandError(f"No answer from {', '.join(failed)}. Nothing was changed.")

    def list_models(self) -> None:
        base = settings.OPENAI_BASE_URL or "https://api.openai.com/v1 (the SDK's default)"
        try:
            names = models_list_fetch(settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY)
        except Exception as exc:
            self.stdout.write(f"Server {base}: /v1/models not listed ({type(exc).__name__}: {exc})")
            return
        self.stdout.write(f"Server {base} lists {len(names)} model(s): {', '.join(names) or '(none)'}")
