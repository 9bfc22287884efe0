"""Packaging glue that pyproject.toml cannot express: the repository's `conf/` tree (Hydra configs)
ships inside the wheel as the package data `scalerl_mega/conf/**.yaml`, so that an installed
`scalerl-train` works outside the repository (scalerl_mega/conf_path.py finds either copy).
Every directory of conf/ is listed as a package of its own (`scalerl_mega.conf.<group>`): setuptools
warns about each unlisted one ("Package would be ignored", ~840 lines on `make setup`).
Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

CONF_PACKAGES = ["scalerl_mega.conf"] + [f"scalerl_mega.conf.{p}" for p in find_namespace_packages(where="conf")]

setup(
    packages=find_namespace_packages(include=["scalerl_mega*", "hydra_plugins*"]) + CONF_PACKAGES,
    package_dir={"scalerl_mega.conf": "conf"},
    package_data={p: ["*.yaml"] for p in CONF_PACKAGES},
)
