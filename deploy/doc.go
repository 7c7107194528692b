// Package deploy holds no code: its directory carries the deployment
// artefacts (Dockerfile, Kubernetes manifests, Grafana dashboard, Prometheus
// rules, see docs/deploy.md), and its tests check them against the gateway:
// the manifests parse and carry the probes, security context, shared
// secrets and service account they must, the Kustomization lists every
// manifest, the ConfigMap's config and the Redis example of docs/deploy.md
// pass policy.Parse, every metric the dashboard and the rules query is
// served by a running gateway, and a real Prometheus scrapes it.
package deploy
