"""A write's transaction and what it carries: connections, the capacity copy, the queue gate, a reservation taken out of the rows or ended, schema migrations."""
