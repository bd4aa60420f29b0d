"""The one piece of packaging pyproject.toml cannot express: folders shipped under another name.

`contracts/build.mjs` writes contracts/build/*.json; the wheel ships that directory as the package
`protocol.contracts`, so an installed veriloco deploys and checks the same build as a checkout. The
example run configs (examples/*.toml) ship as `veriloco.examples`, which `veriloco run init` writes
out (veriloco/runinit.py), so a pip-only user has a commented config to start from.
Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["veriloco*", "devnet*", "protocol*", "dilocox*", "trainer*", "verifier*", "coordinator*", "public*"]),
        "protocol.contracts",
        "veriloco.examples",
    ],
    package_dir={"protocol.contracts": "contracts/build", "veriloco.examples": "examples"},
)
