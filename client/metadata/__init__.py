"""Cluster metadata shared by controller, brokers and tools: the record types of the controller's
metadata log (`records`), the image they build (`image`), and their protobuf form (`wire`)."""
