"""How a GPU step works with the other GPU steps of its DAG run: hand-on, queue-ahead, admission as a run."""
