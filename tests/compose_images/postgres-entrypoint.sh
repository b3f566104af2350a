#!/bin/sh
# What the official postgres image's entrypoint does that deploy/compose.yaml relies on:
# POSTGRES_USER, POSTGRES_DB and POSTGRES_PASSWORD_FILE make the database on first start,
# PGDATA keeps it, the server runs as the postgres user, and pg_isready answers on the socket.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        install -o postgres -m 600 "$POSTGRES_PASSWORD_FILE" /var/run/postgresql/.pwfile
    fi
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile=/var/run/postgresql/.pwfile \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start >/dev/null
    if [ -n "${POSTGRES_DB:-}" ]; then
        createdb -h /var/run/postgresql -U "${POSTGRES_USER:-postgres}" "$POSTGRES_DB"
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
rm -f /var/run/postgresql/.pwfile
exec "$@" -k /var/run/postgresql
