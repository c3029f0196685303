#!/bin/sh
# Minimal docker-entrypoint.sh for the Debian postgres stand-in: first start initialises
# $PGDATA with POSTGRES_USER (superuser), POSTGRES_PASSWORD and POSTGRES_DB, and listens
# on all addresses with password (scram-sha-256) auth for other hosts.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec runuser -u postgres -- "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        postgres -D "$PGDATA" -c listen_addresses='' -k /var/run/postgresql &
        pid=$!
        until pg_isready -q -h /var/run/postgresql -U "$POSTGRES_USER"; do sleep 0.2; done
        psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
        kill -INT "$pid"; wait "$pid" || true
    fi
    echo "initialised $PGDATA: user $POSTGRES_USER, database $POSTGRES_DB"
fi
[ "${1:-}" = postgres ] && shift && set -- postgres -D "$PGDATA" "$@"
exec "$@"
