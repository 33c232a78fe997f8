"""The simulated kubelet: what a pod does from start to end, and the status, events and traces it leaves."""
