"""Adds the root catalog folders (transforms/, seeds/, backends/) to the wheel as
peak_tune/_catalog/<name>; everything else is in pyproject.toml."""

from setuptools import find_packages, setup

CATALOGS = ("transforms", "seeds", "backends")

setup(
    packages=find_packages(include=["peak_tune*"])
    + [f"peak_tune._catalog.{name}" for name in CATALOGS],
)
