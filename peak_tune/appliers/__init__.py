"""Appliers by name. A new applier is one module plus one line here."""

from __future__ import annotations

import importlib
import os

from peak_tune.appliers.base import Applier
from peak_tune.errors import UserError

__all__ = ["APPLIERS", "default_applier", "make_applier"]

APPLIERS: dict[str, str] = {
    "llm": "peak_tune.appliers.llm:LLMApplier",
    "reference": "peak_tune.appliers.reference:ReferenceApplier",
}


def make_applier(name: str) -> Applier:
    if name not in APPLIERS:
        raise UserError(f"unknown applier {name!r} (available: {', '.join(sorted(APPLIERS))})")
    module_name, class_name = APPLIERS[name].split(":")
    applier: Applier = getattr(importlib.import_module(module_name), class_name)()
    return applier


def default_applier() -> str:
    """llm when an endpoint is configured (a model and a key), else the offline one."""
    configured = os.environ.get("OPENAI_MODEL") and os.environ.get("OPENAI_API_KEY")
    return "llm" if configured else "reference"
