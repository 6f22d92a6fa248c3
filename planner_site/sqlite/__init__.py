"""Django's SQLite backend, creating the database file's folder when it first connects (so importing the
settings creates nothing, and a fresh checkout needs no setup step before `migrate`)."""
