"""peak-tune: tune kernels by searching sequences of natural-language transformations."""

__version__ = "0.1.0"
