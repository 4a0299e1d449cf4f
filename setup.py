"""Build script for minibroker's C extensions; everything else is declared in pyproject.toml.

`minibroker.client.records._encoder` (the producer's record encoding, `ByteCount`, murmur2) and
`_decoder` (the consumer's record decoding) are optional: without a C compiler the package still
installs and the pure Python modules they speed up are used (`MINIBROKER_PURE_CODEC=1` forces that
even when they are built). `make install` checks that both built, so the dev and CI path never
falls back silently.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "minibroker.client.records._encoder",
            sources=["client/records/_encoder.c"],
            optional=True,
        ),
        Extension(
            "minibroker.client.records._decoder",
            sources=["client/records/_decoder.c"],
            optional=True,
        ),
    ],
)
