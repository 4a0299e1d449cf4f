"""Build script for minibroker's optional C extensions; everything else is in pyproject.toml.

Each extension is optional: without a C compiler the install still succeeds and the pure Python
module it speeds up is used (MINIBROKER_PURE_CODEC=1 forces that even when it is built).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "minibroker.client.records._decoder",
            ["client/records/_decoder.c"],
            optional=True,
        ),
    ],
)
