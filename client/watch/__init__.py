"""`minibroker watch`: a live terminal view of the cluster.

`model` (pure) holds the cluster state and the event timeline built from the controller's metadata
records, the brokers' replica descriptions and the local processes' states; `render` (pure) turns
the model into a rich renderable; `live` is the I/O loop that polls the cluster and redraws.
"""
