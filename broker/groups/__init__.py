"""Consumer groups: Kafka's group coordinator (offsets, membership)."""
