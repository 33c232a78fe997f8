"""The emulated Kubernetes API server: its store, reads, writes, watches, discovery and admission rules."""
