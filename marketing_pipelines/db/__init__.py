"""The application database: tables, engine, Alembic migrations, campaigns and the `AppDatabase` resource."""
