"""Grants made and ended: the serialized and concurrent paths, a grant's pod and checkpoints, failed tries."""
