"""Alembic environment for the tuner's own tables (version table ``tuner_alembic_version``)."""

from alembic import context
from sqlalchemy import create_engine

from sparse_mla_tuner.db.models import Base

config = context.config
target_metadata = Base.metadata
VERSION_TABLE = config.get_main_option("version_table") or "tuner_alembic_version"


def include_name(name, type_, parent_names):
    # Optuna's tables share the database: leave them alone
    return type_ != "table" or name.startswith("tuner_")


def run_migrations(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as con:
        run_migrations(con)
