"""The `peak-tune` command line."""

from peak_tune.cli.app import main

__all__ = ["main"]
