"""The controller's rules as a sans-I/O state machine (docs/design.md §2, §6): elections, placement,
ISR validation, broker liveness and preferred-leader rebalancing. Nothing here does I/O."""
