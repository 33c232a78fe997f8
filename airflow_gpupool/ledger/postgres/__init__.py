"""PostgreSQL only: the concurrent path's connections, LISTEN/NOTIFY, and the SQL functions kept in sql/."""
