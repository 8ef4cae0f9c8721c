# The balancer of the code-server replicas (deploy/haproxy.cfg): Debian's HAProxy on the marketing-pipelines
# image's own base, so the stack pulls nothing else.
FROM python:3.11-slim
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/*
