"""Process plumbing shared by every minibroker process (Kafka keeps the like in server-common):
configuration files and overrides, structured logging, the event-loop runner, metrics serving.

Lives under client/ because broker and controller may depend on client and not on each other
(docs/design.md §1). Nothing here knows about replication.
"""
