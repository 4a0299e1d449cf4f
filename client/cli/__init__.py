"""The client-side `minibroker` subcommands (Kafka's tools): each module offers `register(sub)`.

The one `minibroker` command is assembled in `minibroker.deploy.cli`.
"""
