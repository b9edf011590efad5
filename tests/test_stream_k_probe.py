"""benchmarks/stream_k_probe.py without a GPU: the variants it times are stream-k's own
source with one line edited or one tuning value changed, so the edit must still find its
line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from peak_tune.catalog.loaders import load_devices

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def probe(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("stream_k_probe")


def test_each_variant_differs_from_stream_k_by_its_one_edit(probe: ModuleType) -> None:
    h100 = load_devices([ROOT / "backends" / "devices"])["h100"]
    found = {name: (context, overrides) for name, context, overrides in probe.variants(h100, 64)}
    stream_k = found["stream-k"][0]
    assert "stream-k" not in found["persistent"][0].applied
    whole = found["stream-k whole runs"][0].source.splitlines()
    changed = [(a, b) for a, b in zip(stream_k.source.splitlines(), whole, strict=True)
               if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("#define PT_SK_MIN_RUN 64 ")
    upwards, overrides = found["stream-k upwards"]
    assert upwards is stream_k and overrides == {"SK_DOWNWARDS": 0}
    assert probe.values(upwards, {**probe.BASE, **overrides})["SK_DOWNWARDS"] == 0


def test_a_source_without_the_line_is_refused_by_name(probe: ModuleType) -> None:
    h100 = load_devices([ROOT / "backends" / "devices"])["h100"]
    stream_k = next(c for name, c, _ in probe.variants(h100, 64) if name == "stream-k")
    with pytest.raises(SystemExit, match="no longer has 'return i - 1;'"):
        probe.edited(stream_k, "return i - 1;", "return i;")
