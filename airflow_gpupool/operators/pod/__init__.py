"""The parts of a GPU pod's life the operators are built from: reserve and wait, pin, lease, tries, fail fast."""
