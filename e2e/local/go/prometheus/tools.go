//go:build tools

// Package tools pins the Prometheus server the local stack builds. Debian's
// package leaves out Kubernetes service discovery, which the stack needs to
// find the real node's pods; the stack builds it with only that discovery
// (build tags remove_all_sd,enable_kubernetes_sd).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
