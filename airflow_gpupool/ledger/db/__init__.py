"""The database's shapes: engines and transient retries, tables, SQL statements, row types and the rows made into them."""
