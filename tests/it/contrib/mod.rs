//! What contrib/ ships, run for real: the bash and Python clients, the mutual-exclusion
//! checker, and the Grafana dashboard and Prometheus alert rules against a real /metrics.

mod bash;
mod breaks;
mod observability;
mod python;
mod verify;
