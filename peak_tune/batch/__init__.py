"""Batch files: many studies (kernels x devices x dtypes x sizes) run from one TOML file.
"""
