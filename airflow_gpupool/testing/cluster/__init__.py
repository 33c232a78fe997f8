"""The emulated cluster's nodes and pools, and the controllers acting on them: scheduler, Jobs, autoscaler."""
