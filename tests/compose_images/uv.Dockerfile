# uv from the uv wheel, laid out as the official ghcr.io/astral-sh/uv image is (tests only).
FROM scratch
COPY uv /uv
