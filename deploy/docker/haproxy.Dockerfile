# The balancer of the code-server replicas (deploy/haproxy.cfg): Debian's HAProxy on the marketing-pipelines
# image's own base, so the stack pulls nothing else. socat reaches HAProxy's admin socket, which stays inside
# the container: `docker compose exec balancer` drains a replica before it is stopped (deploy/README.md, "Docker").
FROM python:3.11-slim
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy socat \
    && rm -rf /var/lib/apt/lists/*
