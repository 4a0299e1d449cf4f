"""The controller quorum: KIP-595 Raft over the metadata log (docs/design.md §6.1)."""
