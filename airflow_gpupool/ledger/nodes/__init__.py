"""The inventory and its health: nodes synced, the agent's report, heartbeats, quarantine."""
