"""Build hook for the one compiled module; everything else is declared in pyproject.toml.

`minibroker.client.records._encoder` (the producer's record encoding, in C) is optional: without
a C compiler the package still installs and `BatchBuilder` uses its pure Python path. `make
install` checks that it built, so the dev and CI path never falls back silently.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "minibroker.client.records._encoder",
            sources=["client/records/_encoder.c"],
            optional=True,
        )
    ]
)
