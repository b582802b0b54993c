"""drainer's benchmarks: the SQL ceiling (pgbench), drainer, the Python peers, one PostgreSQL."""
