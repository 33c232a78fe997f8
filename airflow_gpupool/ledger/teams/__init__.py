"""Teams sharing the pool: quotas and headroom stored, admission by quota in fair order, usage, preemption victims, runs admitted as a whole."""
