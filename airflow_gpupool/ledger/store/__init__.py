"""A write's transaction and what it carries: connections, the capacity copy, the queue gate, a grant taken out of the rows, schema migrations."""
