"""What the ledger shows: snapshots and read views, the history, the cluster invariants."""
