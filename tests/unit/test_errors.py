"""Kafka's error codes and their exception classes (client/errors.py).

Every code has one class, found by `error_for`; a class is retriable exactly when its code is in
RETRIABLE; and each class is named as it is imported, since the CLI prints `type(err).__name__`.
"""

from __future__ import annotations

import pytest

from minibroker.client import errors
from minibroker.client.errors import (
    RETRIABLE,
    ErrorCode,
    MiniBrokerError,
    RetriableError,
    error_for,
)

CLASSES = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, MiniBrokerError)
}


@pytest.mark.parametrize("code", [c for c in ErrorCode if c != ErrorCode.NONE], ids=str)
def test_every_code_has_its_class(code: ErrorCode) -> None:
    err = error_for(int(code), "detail")
    assert err.code == code and type(err).code == code
    assert str(err) == "detail"
    assert isinstance(err, RetriableError) == (code in RETRIABLE) == err.retriable


def test_unknown_codes_are_unknown_server_errors() -> None:
    assert type(error_for(9999)) is errors.UnknownServerError


def test_classes_are_named_as_they_are_imported() -> None:
    misnamed = {name: cls.__name__ for name, cls in CLASSES.items() if cls.__name__ != name}
    assert not misnamed


def test_a_class_whose_base_contradicts_retriable_is_refused() -> None:
    with pytest.raises(TypeError, match="RETRIABLE"):

        class NotRetriable(MiniBrokerError):  # NOT_LEADER_OR_FOLLOWER is retriable
            __module__ = errors.__name__
            code = ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_classes_defined_elsewhere_refine_a_code_without_registering() -> None:
    class Elsewhere(RetriableError):
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER

    assert type(error_for(int(Elsewhere.code))) is errors.NotLeaderOrFollowerError
