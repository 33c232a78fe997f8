"""GpuJobOperator's gang: its grants, the pinning of its Job's pods, how its members find each other."""
