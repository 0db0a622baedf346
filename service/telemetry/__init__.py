"""What the service tells its operators: request records and access lines, Prometheus
metrics, OpenTelemetry spans, per-stage timings and the log format."""
