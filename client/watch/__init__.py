"""`minibroker watch`: a live terminal view of the cluster.

`model` (pure) holds the cluster state and the event timeline built from the controller's metadata
records, the brokers' replica descriptions (`observations`) and the local processes' states;
`events` (pure) finds the timeline's events, `rows` (pure) the rows a frame draws, and `render`
(pure) turns them into a rich renderable; `live` is the I/O loop that polls the cluster and
redraws.
"""
