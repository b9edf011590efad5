"""What LLM calls cost: a price table of US dollars per million prompt (input) and
completion (output) tokens per model name, from the built-in prices.toml, extended or
overridden by a user's file of the same shape. Model names match exactly; a model in
neither table has an unknown cost (None), never zero."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peak_tune.errors import UserError

__all__ = ["BUILTIN_PRICES", "Price", "load_prices", "price_for"]

BUILTIN_PRICES = Path(__file__).with_name("prices.toml")


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok
                + completion_tokens * self.output_per_mtok) / 1e6


def load_prices(extra: str = "") -> dict[str, Price]:
    """The built-in table, then `extra` (a TOML file path) on top; UserError for a
    missing or malformed file."""
    table = _parse(BUILTIN_PRICES)
    if extra:
        table.update(_parse(Path(extra)))
    return table


def price_for(model: str, extra: str = "") -> Price | None:
    return load_prices(extra).get(model)


def _parse(path: Path) -> dict[str, Price]:
    if not path.is_file():
        raise UserError(f"price table {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"price table {path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(data) - {"models"})
    models = data.get("models", {})
    if unknown or not isinstance(models, dict):
        raise UserError(f"price table {path}: expected only [models.\"NAME\"] tables, "
                        f"found {', '.join(unknown) or 'models = ' + repr(models)}")
    return {name: _price(path, name, entry) for name, entry in models.items()}


def _price(path: Path, name: str, entry: Any) -> Price:
    where = f"price table {path}: models.{name!r}"
    if not isinstance(entry, dict) or set(entry) != {"input", "output"}:
        got = sorted(entry) if isinstance(entry, dict) else entry
        raise UserError(f"{where} needs exactly `input` and `output` (USD per million "
                        f"tokens), found {got}")
    values = []
    for key in ("input", "output"):
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < 0:
            raise UserError(f"{where}.{key} = {value!r} is not a non-negative number")
        values.append(float(value))
    return Price(values[0], values[1])
