"""The `peak-tune` command line."""

from peak_tune.cli.main import main

__all__ = ["main"]
