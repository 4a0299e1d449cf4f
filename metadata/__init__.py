"""minibroker.metadata: the cluster metadata model shared by the controller, the brokers and the
tools (`watch`, the launcher): the record types of the controller's metadata log (`records`), the
image they build (`image`), and their protobuf form (`wire`). It sits beside broker/, controller/
and client/ rather than inside one of them, since all three use it; it imports none of the
broker, controller or deploy packages (tests/unit/test_layering.py)."""
