"""Kafka's binary protocol on a second listener (issue 18).

codec.py: kio's generated types; handlers.py: what each API does; server.py: the listener.
"""
