#!/usr/bin/env bash
# Creates the PostgreSQL roles and the two empty databases of a deployment (deploy/README.md, step 1).
#
# Four LOGIN roles, a pair per database: a migration role that owns the database and everything in it
# (deploy/migrate.sh runs as it, once per release), and an application role that the code servers, run
# workers, daemon and webserver connect as, with SELECT/INSERT/UPDATE/DELETE on the tables and no
# right to create, alter or drop anything. The tables themselves are created by deploy/migrate.sh.
#
# Run it as an administrator of the server: a superuser, or a role with CREATEROLE and CREATEDB (a
# managed service's admin user), which this script makes a member of the two migration roles so it may
# create databases owned by them and set their privileges. Safe to run again: what exists is brought to
# the state below (passwords reset to the given ones, ownership and privileges re-applied).
#
# Parameters (environment variables; defaults in brackets):
#   PGHOST [127.0.0.1]  PGPORT [5432]   the server
#   PGADMIN_USER [postgres]             the administrator it connects as; its password, if any, from
#   PGADMIN_DB [postgres]               PGPASSWORD or ~/.pgpass (libpq's usual places)
#   MARKETING_DB [marketing]            the application database (MARKETING_DATABASE_URL)
#   MARKETING_MIGRATOR [marketing_migrator]   MARKETING_MIGRATOR_PASSWORD (required)
#   MARKETING_APP_USER [marketing_app]        MARKETING_APP_PASSWORD (required)
#   DAGSTER_DB [dagster]                Dagster's storage (DAGSTER_PG_DB in deploy/dagster.yaml)
#   DAGSTER_MIGRATOR [dagster_migrator]       DAGSTER_MIGRATOR_PASSWORD (required)
#   DAGSTER_APP_USER [dagster_app]            DAGSTER_APP_PASSWORD (required)
#   PSQL [psql]                         the psql to use
#
# Example:
#   MARKETING_MIGRATOR_PASSWORD=... MARKETING_APP_PASSWORD=... DAGSTER_MIGRATOR_PASSWORD=... \
#   DAGSTER_APP_PASSWORD=... PGHOST=db.internal deploy/provision.sh
#
# The passwords reach the server in CREATE/ALTER ROLE statements: a server that logs DDL
# (log_statement = ddl or all) writes them to its log.

set -euo pipefail

export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}"
PGADMIN_USER="${PGADMIN_USER:-postgres}"
PGADMIN_DB="${PGADMIN_DB:-postgres}"
MARKETING_DB="${MARKETING_DB:-marketing}"
MARKETING_MIGRATOR="${MARKETING_MIGRATOR:-marketing_migrator}"
MARKETING_APP_USER="${MARKETING_APP_USER:-marketing_app}"
DAGSTER_DB="${DAGSTER_DB:-dagster}"
DAGSTER_MIGRATOR="${DAGSTER_MIGRATOR:-dagster_migrator}"
DAGSTER_APP_USER="${DAGSTER_APP_USER:-dagster_app}"
PSQL="${PSQL:-psql}"

die() {
  echo "provision.sh: $*" >&2
  exit 2
}

for name in MARKETING_MIGRATOR_PASSWORD MARKETING_APP_PASSWORD DAGSTER_MIGRATOR_PASSWORD DAGSTER_APP_PASSWORD; do
  [[ -n "${!name:-}" ]] || die "$name is empty or unset: every role needs a password (see the top of this script)"
done

# Names and passwords travel as psql variables, quoted by psql (:'x' a literal, :"x" an identifier) or
# by format(%I, %L): a name or password with quotes or spaces cannot change the statements.
admin_psql() {
  local db="$1"
  shift
  "$PSQL" --no-psqlrc --quiet --set=ON_ERROR_STOP=1 -U "$PGADMIN_USER" -d "$db" "$@"
}

# A LOGIN role with this password, created or brought up to date. An administrator that is not a
# superuser is made a member that inherits the role's privileges (USAGE), which CREATE DATABASE ... OWNER,
# ALTER DEFAULT PRIVILEGES FOR ROLE and pg_restore's ALTER ... OWNER need. (From PostgreSQL 16 the creator
# of a role holds only ADMIN OPTION on it by default, see createrole_self_grant, which USAGE does not count.)
ensure_role() {
  local role="$1" password="$2"
  admin_psql "$PGADMIN_DB" -v role="$role" -v password="$password" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
ALTER ROLE :"role" WITH LOGIN PASSWORD :'password';
SELECT format('GRANT %I TO %I', :'role', current_user)
WHERE NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
  AND NOT pg_has_role(current_user, :'role', 'USAGE') \gexec
SQL
}

# The database, owned by its migration role; only the owner and the application role may connect.
ensure_database() {
  local db="$1" owner="$2" app="$3" database_privileges="$4"
  admin_psql "$PGADMIN_DB" -v db="$db" -v owner="$owner" -v app="$app" <<SQL
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
ALTER DATABASE :"db" OWNER TO :"owner";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT $database_privileges ON DATABASE :"db" TO :"app";
SQL
}

# Inside the database: only the owner creates in schema public (PostgreSQL 15 makes public owned by
# pg_database_owner, i.e. the migration role), the application role may use it, and every table and
# sequence the migration role creates from now on is readable and writable by the application role.
ensure_schema_privileges() {
  local db="$1" owner="$2" app="$3"
  admin_psql "$db" -v owner="$owner" -v app="$app" <<'SQL'
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO :"app";
SQL
}

ensure_role "$MARKETING_MIGRATOR" "$MARKETING_MIGRATOR_PASSWORD"
ensure_role "$MARKETING_APP_USER" "$MARKETING_APP_PASSWORD"
ensure_role "$DAGSTER_MIGRATOR" "$DAGSTER_MIGRATOR_PASSWORD"
ensure_role "$DAGSTER_APP_USER" "$DAGSTER_APP_PASSWORD"

# TEMPORARY for the application: `events load` and event ingestion stage rows in a temporary table
# (COPY into CREATE TEMP TABLE), and REVOKE ALL FROM PUBLIC takes away the TEMPORARY every role has by default.
ensure_database "$MARKETING_DB" "$MARKETING_MIGRATOR" "$MARKETING_APP_USER" "CONNECT, TEMPORARY"
ensure_database "$DAGSTER_DB" "$DAGSTER_MIGRATOR" "$DAGSTER_APP_USER" "CONNECT"
ensure_schema_privileges "$MARKETING_DB" "$MARKETING_MIGRATOR" "$MARKETING_APP_USER"
ensure_schema_privileges "$DAGSTER_DB" "$DAGSTER_MIGRATOR" "$DAGSTER_APP_USER"

echo "provisioned: $MARKETING_DB (owner $MARKETING_MIGRATOR, app $MARKETING_APP_USER)," \
  "$DAGSTER_DB (owner $DAGSTER_MIGRATOR, app $DAGSTER_APP_USER) on $PGHOST:$PGPORT"
