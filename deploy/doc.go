// Package deploy holds sluice's Kubernetes deployment: plain manifests (one
// directory per component under deploy/) and Helm charts (deploy/charts/).
// It has no code; its tests lint and render every chart with the real helm
// (scripts/helm-build.sh), check the sluice chart against the agent's flags,
// and dry-run every rendered object and manifest against a real
// kube-apiserver.
package deploy
