# The Debian base with the host's CA bundle, for building deploy/Dockerfile where PyPI is
# reached through a TLS-inspecting proxy (uv reads SSL_CERT_FILE) (tests only).
ARG BASE
FROM ${BASE}
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
