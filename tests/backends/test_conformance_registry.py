"""A backend gets the harness's contract by being registered: every name in
peak_tune.backends.BACKENDS has its tests/backends/test_<name>_conformance.py, which
runs the shared tests (tests/backends/conformance.py) with its own fixtures."""

from __future__ import annotations

import importlib
import inspect

import pytest

from peak_tune.backends import BACKENDS
from tests.backends import conformance

FIXTURES = {"backend", "spec", "build_dir", "size", "kernel"}
SHARED = {name for name, value in vars(conformance).items()
          if name.startswith("test_") and inspect.isfunction(value)}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_runs_the_conformance_suite(name: str) -> None:
    module = importlib.import_module(f"tests.backends.test_{name}_conformance")
    found = vars(module)
    assert SHARED <= set(found), f"{name}: shared tests missing: {SHARED - set(found)}"
    fixtures = {n for n, v in found.items() if hasattr(v, "_pytestfixturefunction")
                or type(v).__name__ == "FixtureFunctionDefinition"}
    assert FIXTURES <= fixtures, f"{name}: fixtures missing: {FIXTURES - fixtures}"
