"""ACLs (Kafka's AclControlManager): CreateAcls, DeleteAcls and DescribeAcls.

Pure. An ACL is stored as an AccessControlEntryRecord under a fresh id; DeleteAcls writes one
RemoveAccessControlEntryRecord per ACL any of its filters matches. Kafka's rules:
- each creation is judged alone (AclBinding.validate: no UNKNOWN/ANY/MATCH value, a non-empty
  name, the CLUSTER resource named kafka-cluster, a TYPE:NAME principal); an invalid one is
  INVALID_REQUEST and writes nothing, the others are created;
- creating an ACL identical to a stored one is a success that writes nothing;
- every filter of a DeleteAcls is matched against the ACLs as they were before the request, so an
  ACL two filters match is reported under both and removed once; a filter with an UNKNOWN value
  is INVALID_REQUEST (for that filter only);
- DescribeAcls answers the ACLs one filter matches (INVALID_REQUEST for UNKNOWN values).
Authorization of these commands is the service's (ALTER / DESCRIBE on the CLUSTER).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.client.errors import ErrorCode
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.messages import Outcome
from minibroker.metadata.acl import AclBinding, AclBindingFilter, AclError
from minibroker.metadata.image import acl_record
from minibroker.metadata.records import RemoveAccessControlEntryRecord


@dataclass(frozen=True, slots=True)
class AclCreationResult:
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class AclDeletionResult:
    """One filter's answer: the ACLs it matched (all removed), or its error."""

    error: ErrorCode
    message: str = ""
    matching: tuple[AclBinding, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeAclsResult:
    error: ErrorCode
    message: str = ""
    bindings: tuple[AclBinding, ...] = ()


def _sorted(bindings: list[AclBinding]) -> tuple[AclBinding, ...]:
    return tuple(
        sorted(
            bindings,
            key=lambda b: (
                b.resource_type,
                b.resource_name,
                b.pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            ),
        )
    )


class AclControl(ControlBase):
    """CreateAcls, DeleteAcls, DescribeAcls."""

    def _new_acl_id(self) -> str:
        while True:
            acl_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            if acl_id not in self.image.acls:
                return acl_id

    def create_acls(
        self, bindings: Sequence[AclBinding], now_ms: int
    ) -> Outcome[tuple[AclCreationResult, ...]]:
        results = []
        for binding in bindings:
            try:
                binding.validate()
            except AclError as err:
                results.append(AclCreationResult(ErrorCode.INVALID_REQUEST, str(err)))
                continue
            if not self.image.acls.contains_binding(binding):
                acl_id = self._new_acl_id()
                self._append(acl_record(acl_id, binding), now_ms)
                self._event(
                    "acl_created",
                    id=acl_id,
                    resource=binding.pattern_str(),
                    entry=binding.entry_str(),
                )
            results.append(AclCreationResult(ErrorCode.NONE))
        return self._done(tuple(results))

    def delete_acls(
        self, filters: Sequence[AclBindingFilter], now_ms: int
    ) -> Outcome[tuple[AclDeletionResult, ...]]:
        results = []
        doomed: dict[str, AclBinding] = {}
        for flt in filters:
            try:
                flt.validate()
            except AclError as err:
                results.append(AclDeletionResult(ErrorCode.INVALID_REQUEST, str(err)))
                continue
            matched = list(self.image.acls.select(flt))
            doomed.update(matched)
            results.append(AclDeletionResult(ErrorCode.NONE, "", _sorted([b for _, b in matched])))
        for acl_id in sorted(doomed):
            self._append(RemoveAccessControlEntryRecord(acl_id), now_ms)
            binding = doomed[acl_id]
            self._event(
                "acl_deleted", id=acl_id, resource=binding.pattern_str(), entry=binding.entry_str()
            )
        return self._done(tuple(results))

    def describe_acls(self, flt: AclBindingFilter) -> DescribeAclsResult:
        try:
            flt.validate()
        except AclError as err:
            return DescribeAclsResult(ErrorCode.INVALID_REQUEST, str(err))
        return DescribeAclsResult(
            ErrorCode.NONE, "", _sorted([b for _, b in self.image.acls.select(flt)])
        )


__all__ = ["AclControl", "AclCreationResult", "AclDeletionResult", "DescribeAclsResult"]
