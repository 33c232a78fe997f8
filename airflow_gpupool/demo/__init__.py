"""`make demo` (``python -m airflow_gpupool.demo``): the example DAGs end to end on one machine.

:mod:`~airflow_gpupool.demo.run` sets up the embedded parts and runs the DAGs;
:mod:`~airflow_gpupool.demo.summary` prints what happened. Importing this package imports nothing.
"""
