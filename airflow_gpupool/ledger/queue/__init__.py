"""The waiting path: the write cycle, incremental service, waiting reads, holds and hand-over, gangs, why a request waits."""
