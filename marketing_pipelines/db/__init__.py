"""The application database: tables, engine, Alembic migrations and the shared lease/claim helpers."""
