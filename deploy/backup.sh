#!/usr/bin/env bash
# Dumps the application database and Dagster's database to a folder, one pg_dump custom-format file each
# (deploy/README.md, "Backups and restore"): <folder>/<database>.dump.
#
# Each dump is a consistent snapshot of its own database, but the two are taken one after the other: a
# run that ends in between shows as running in one and finished in the other. Restore both from the
# same folder; an execution or agent run left RUNNING is taken back when its lease expires, as after a
# crash.
#
# Not in the dumps: Dagster's compute logs and the IO managers' files, which live under DAGSTER_HOME on
# the machines that ran the work (Dagster's default, which deploy/dagster.yaml keeps).
#
# Parameters (environment variables; defaults in brackets):
#   PGHOST [127.0.0.1]  PGPORT [5432]
#   MARKETING_DB [marketing]  DAGSTER_DB [dagster]
#   BACKUP_USER [postgres]            who dumps both databases: a role that may read all their tables (a
#                                     superuser, or a member of both migration roles)
#   MARKETING_BACKUP_USER, DAGSTER_BACKUP_USER [BACKUP_USER]   per database instead, e.g. each database's
#                                     migration role, which owns its tables
#   Passwords: PGPASSWORD, or ~/.pgpass lines per user (libpq's usual places).
#   BACKUP_DIR [./backups/<UTC time>]  created if missing, readable by its owner only
#   PG_DUMP [pg_dump]                 a pg_dump as new as the server
#
# Example:
#   BACKUP_DIR=/var/backups/marketing/$(date -u +%F) PGHOST=db.internal deploy/backup.sh

set -euo pipefail

export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}"
BACKUP_USER="${BACKUP_USER:-postgres}"
MARKETING_BACKUP_USER="${MARKETING_BACKUP_USER:-$BACKUP_USER}"
DAGSTER_BACKUP_USER="${DAGSTER_BACKUP_USER:-$BACKUP_USER}"
MARKETING_DB="${MARKETING_DB:-marketing}"
DAGSTER_DB="${DAGSTER_DB:-dagster}"
BACKUP_DIR="${BACKUP_DIR:-./backups/$(date -u +%Y%m%dT%H%M%SZ)}"
PG_DUMP="${PG_DUMP:-pg_dump}"

# The dumps hold every row (webhook payloads, transcripts): nobody but the owner reads them.
umask 077
mkdir -p "$BACKUP_DIR"

# Written under a temporary name and renamed once complete: a file named <db>.dump is never a partial dump.
dump() {
  local db="$1" user="$2" target="$BACKUP_DIR/$1.dump"
  "$PG_DUMP" --format=custom --username="$user" --dbname="$db" --file="$target.partial"
  mv "$target.partial" "$target"
  echo "$target"
}

dump "$MARKETING_DB" "$MARKETING_BACKUP_USER"
dump "$DAGSTER_DB" "$DAGSTER_BACKUP_USER"
