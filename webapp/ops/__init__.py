"""Running Lifeboat in production: Prometheus metrics and structured logs."""
