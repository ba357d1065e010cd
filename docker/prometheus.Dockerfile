# Prometheus for docker-compose.yml's `metrics` profile, built from local
# material: Debian's package on the base image scripts/build_image.sh makes.
FROM drover-base:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--config.file=/etc/prometheus/prometheus.yml", \
            "--storage.tsdb.path=/var/lib/prometheus/metrics2"]
