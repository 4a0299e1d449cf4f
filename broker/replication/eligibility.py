"""Which brokers may join an ISR: the broker-registration view the leader consults.

Pure: no I/O. The leader asks two questions of the cluster's registrations, as this broker last
saw them in metadata (KIP-841/903): a broker's registered epoch, and whether a replica on it is
ISR-eligible. `BrokerView` is that question; `BrokerEligibilityView` the plain implementation the
shell (or the simulation) keeps current from RegisterBroker/BrokerChange records.

Concurrency contract: single-threaded; the owner updates it between core calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from minibroker.broker.replication.events import UNKNOWN_BROKER_EPOCH


class BrokerView(Protocol):
    """The cluster's broker registrations as this broker last saw them in metadata."""

    def broker_epoch(self, broker_id: int) -> int:
        """The registered broker epoch, or -1 when the broker is unknown."""
        ...

    def is_isr_eligible(self, broker_id: int, broker_epoch: int) -> bool:
        """KIP-841/903: registered, unfenced, not in controlled shutdown, and `broker_epoch`
        equal to the registered one (or -1: no fetch accepted from it in this leadership yet;
        a fetch itself must carry the registered epoch, reads.broker_epoch_problem)."""
        ...


@dataclass(slots=True)
class BrokerEligibility:
    """The part of a broker's registration that decides its ISR eligibility (KIP-841/903).

    A projection, not the registration: the metadata image's full record is
    `minibroker.metadata.image.BrokerRegistration` (host, port, rack, incarnation, ...).
    """

    broker_epoch: int
    fenced: bool = False
    in_controlled_shutdown: bool = False


class BrokerEligibilityView:
    """A plain BrokerView the shell keeps current from RegisterBroker/BrokerChange records."""

    def __init__(self, brokers: dict[int, BrokerEligibility] | None = None) -> None:
        self._brokers: dict[int, BrokerEligibility] = dict(brokers or {})

    def update(
        self,
        broker_id: int,
        broker_epoch: int,
        *,
        fenced: bool = False,
        in_controlled_shutdown: bool = False,
    ) -> None:
        self._brokers[broker_id] = BrokerEligibility(broker_epoch, fenced, in_controlled_shutdown)

    def remove(self, broker_id: int) -> None:
        self._brokers.pop(broker_id, None)

    def broker_epoch(self, broker_id: int) -> int:
        registration = self._brokers.get(broker_id)
        return registration.broker_epoch if registration is not None else UNKNOWN_BROKER_EPOCH

    def is_isr_eligible(self, broker_id: int, broker_epoch: int) -> bool:
        registration = self._brokers.get(broker_id)
        if registration is None or registration.fenced or registration.in_controlled_shutdown:
            return False
        return broker_epoch in (UNKNOWN_BROKER_EPOCH, registration.broker_epoch)
