"""The one piece of packaging pyproject.toml cannot express: the committed contract artifacts.

`contracts/build.mjs` writes contracts/build/*.json; the wheel ships that directory as the package
`protocol.contracts`, so an installed veriloco deploys and checks the same build as a checkout.
Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["veriloco*", "devnet*", "protocol*", "trainer*", "verifier*", "coordinator*"]),
        "protocol.contracts",
    ],
    package_dir={"protocol.contracts": "contracts/build"},
)
