#!/bin/sh
# Every Fairlane container starts here. Configuration comes from the environment:
#   service NAME [ARGS...]   runs `python -m services.NAME --nats $FAIRLANE_NATS_URL ARGS`
#                            (--postgres $FAIRLANE_POSTGRES_DSN for the projector and the api,
#                            --gpus $FAIRLANE_GPUS for the executor where it is set);
#   anything else            runs as given (`fairlane ...`, a shell).
# FAIRLANE_POSTGRES_PASSWORD_FILE becomes PGPASSWORD (asyncpg reads it when the DSN has no
# password), so the password is in no compose file, image or `docker inspect`; the NATS
# credentials file is named by FAIRLANE_NATS_CREDENTIALS and read by the program itself.
set -eu
if [ -n "${FAIRLANE_POSTGRES_PASSWORD_FILE:-}" ]; then
    PGPASSWORD=$(cat "$FAIRLANE_POSTGRES_PASSWORD_FILE")
    export PGPASSWORD
fi
if [ "${1:-}" = service ]; then
    name=${2:?usage: service NAME [ARGS...]}
    shift 2
    set -- python -m "services.$name" --nats "${FAIRLANE_NATS_URL:?FAIRLANE_NATS_URL is not set}" "$@"
    case $name in
    projector | api)
        set -- "$@" --postgres "${FAIRLANE_POSTGRES_DSN:?FAIRLANE_POSTGRES_DSN is not set}"
        ;;
    executor)
        if [ -n "${FAIRLANE_GPUS:-}" ]; then set -- "$@" --gpus "$FAIRLANE_GPUS"; fi
        ;;
    esac
fi
exec "$@"
