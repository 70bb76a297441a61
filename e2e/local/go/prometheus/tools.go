//go:build tools

// Package tools pins the Prometheus server the local stack builds. Debian's
// package leaves out Kubernetes service discovery, which the stack needs to
// find the real node's pods; the stack builds it with only that discovery
// (build tags remove_all_sd,enable_kubernetes_sd). promtool, from the same
// version, checks the Helm chart's alerting rules.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
