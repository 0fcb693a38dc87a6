"""Django's PostgreSQL backend, with the pool's check of a connection made without a query and a
transaction's BEGIN sent with its first pipeline (`base`)."""
