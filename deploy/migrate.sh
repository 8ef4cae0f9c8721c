#!/usr/bin/env bash
# Brings both databases to the schema of the installed release (deploy/README.md, step 2), as their
# migration roles: once per release, before any code server, daemon or webserver of that release starts.
#
#   1. `marketing-pipelines db upgrade`: the application schema (Alembic), as MARKETING_MIGRATOR.
#   2. `dagster instance migrate`: Dagster's storage, as DAGSTER_MIGRATOR. On an empty database the
#      instance creates its tables when it loads (dagster-postgres' should_autocreate_tables, true in the
#      instance file written here), then migrate brings them to the installed Dagster's revision; on an
#      existing one it only migrates. Either way the database is complete afterwards. (With table creation
#      off, migrate on an empty database fails: relation "event_logs" does not exist.)
#   3. GRANTs on every existing table and sequence to the application roles: provision.sh's default
#      privileges cover what the migration roles create from then on; this covers anything older.
#
# Safe to run again: each step does nothing when there is nothing to do.
#
# The image has neither psql nor this script: its `migrate` command (deploy/container/migrate, the Docker stack's
# one-shot service) runs the same three steps there, with the migration roles' credentials given as files.
#
# A release that changes the application schema is not a rolling one: every new process of the old code
# (each run worker) refuses a schema newer than it knows, and the new code refuses an older one. Stop the
# daemon and let running runs finish before this script, start the new code servers after it
# (deploy/README.md, "Upgrading").
#
# Parameters (environment variables; defaults in brackets; the names match deploy/provision.sh):
#   PGHOST [127.0.0.1]  PGPORT [5432]
#   MARKETING_DB [marketing]  MARKETING_MIGRATOR [marketing_migrator]  MARKETING_MIGRATOR_PASSWORD
#   MARKETING_APP_USER [marketing_app]
#   DAGSTER_DB [dagster]      DAGSTER_MIGRATOR [dagster_migrator]      DAGSTER_MIGRATOR_PASSWORD
#   DAGSTER_APP_USER [dagster_app]
#   MARKETING_PIPELINES [marketing-pipelines]  DAGSTER [dagster]  PSQL [psql]   the commands to run
# A password may be empty only where the server does not ask for one (trust or peer authentication).
# TLS and other connection options: libpq's variables (e.g. PGSSLMODE=verify-full) reach psql and both
# Python clients (psycopg2), so they are not parameters here.
#
# Example:
#   MARKETING_MIGRATOR_PASSWORD=... DAGSTER_MIGRATOR_PASSWORD=... PGHOST=db.internal deploy/migrate.sh

set -euo pipefail

export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}"
MARKETING_DB="${MARKETING_DB:-marketing}"
MARKETING_MIGRATOR="${MARKETING_MIGRATOR:-marketing_migrator}"
MARKETING_MIGRATOR_PASSWORD="${MARKETING_MIGRATOR_PASSWORD:-}"
MARKETING_APP_USER="${MARKETING_APP_USER:-marketing_app}"
DAGSTER_DB="${DAGSTER_DB:-dagster}"
DAGSTER_MIGRATOR="${DAGSTER_MIGRATOR:-dagster_migrator}"
DAGSTER_MIGRATOR_PASSWORD="${DAGSTER_MIGRATOR_PASSWORD:-}"
DAGSTER_APP_USER="${DAGSTER_APP_USER:-dagster_app}"
MARKETING_PIPELINES="${MARKETING_PIPELINES:-marketing-pipelines}"
DAGSTER="${DAGSTER:-dagster}"
PSQL="${PSQL:-psql}"

# Percent-encodes one URL component byte by byte (RFC 3986 unreserved characters stay).
urlencode() {
  local LC_ALL=C text="$1" out="" char i
  for ((i = 0; i < ${#text}; i++)); do
    char="${text:i:1}"
    case "$char" in
      [A-Za-z0-9._~-]) out+="$char" ;;
      *) out+=$(printf '%%%02X' "'$char") ;;
    esac
  done
  printf '%s' "$out"
}

upgrade_application_schema() {
  # The password goes through libpq's PGPASSWORD, not the URL: it needs no escaping and stays out of
  # anything that prints the URL.
  local url
  url="postgresql://$(urlencode "$MARKETING_MIGRATOR")@$(urlencode "$PGHOST"):$PGPORT/$(urlencode "$MARKETING_DB")"
  echo "== application schema ($MARKETING_DB as $MARKETING_MIGRATOR)"
  MARKETING_DATABASE_URL="$url" PGPASSWORD="$MARKETING_MIGRATOR_PASSWORD" "$MARKETING_PIPELINES" db upgrade
}

# An instance file holding only the storage, as the migration role: the runtime copy of
# deploy/dagster.yaml may turn table creation off, and migrating needs nothing else from it.
write_migration_instance() {
  cat >"$1/dagster.yaml" <<'YAML'
storage:
  postgres:
    postgres_db:
      hostname: { env: DAGSTER_PG_HOST }
      port: { env: DAGSTER_PG_PORT }
      username: { env: DAGSTER_PG_USER }
      password: { env: DAGSTER_PG_PASSWORD }
      db_name: { env: DAGSTER_PG_DB }
      scheme: postgresql+psycopg2
    should_autocreate_tables: true
telemetry:
  enabled: false
YAML
}

migrate_dagster_storage() {
  local home
  home="$(mktemp -d)"
  # shellcheck disable=SC2064  # expand now; EXIT, not RETURN: set -e leaves without returning
  trap "rm -rf '$home'" EXIT
  write_migration_instance "$home"
  echo "== Dagster storage ($DAGSTER_DB as $DAGSTER_MIGRATOR)"
  env DAGSTER_HOME="$home" DAGSTER_PG_HOST="$PGHOST" DAGSTER_PG_PORT="$PGPORT" DAGSTER_PG_DB="$DAGSTER_DB" \
    DAGSTER_PG_USER="$DAGSTER_MIGRATOR" DAGSTER_PG_PASSWORD="$DAGSTER_MIGRATOR_PASSWORD" \
    "$DAGSTER" instance migrate
}

# As the owner: grants on what exists now, which default privileges (set for objects created later) miss.
grant_to_application() {
  local db="$1" owner="$2" password="$3" app="$4"
  echo "== grants in $db to $app"
  PGPASSWORD="$password" "$PSQL" --no-psqlrc --quiet --set=ON_ERROR_STOP=1 -U "$owner" -d "$db" -v app="$app" <<'SQL'
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO :"app";
SQL
}

upgrade_application_schema
migrate_dagster_storage
grant_to_application "$MARKETING_DB" "$MARKETING_MIGRATOR" "$MARKETING_MIGRATOR_PASSWORD" "$MARKETING_APP_USER"
grant_to_application "$DAGSTER_DB" "$DAGSTER_MIGRATOR" "$DAGSTER_MIGRATOR_PASSWORD" "$DAGSTER_APP_USER"
echo "migrated: $MARKETING_DB and $DAGSTER_DB are current; $MARKETING_APP_USER and $DAGSTER_APP_USER may use them"
