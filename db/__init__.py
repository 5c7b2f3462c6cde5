"""Results database (SQLAlchemy models, store, Alembic migrations)."""
