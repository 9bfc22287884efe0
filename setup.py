"""Packaging glue that pyproject.toml cannot express: the repository's `conf/` tree (Hydra configs)
ships inside the wheel as the package data `scalerl_mega/conf/**.yaml`, so that an installed
`scalerl-train` works outside the repository (scalerl_mega/conf_path.py finds either copy).
Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["scalerl_mega*", "hydra_plugins*"]) + ["scalerl_mega.conf"],
    package_dir={"scalerl_mega.conf": "conf"},
    package_data={"scalerl_mega.conf": ["**/*.yaml"]},
)
