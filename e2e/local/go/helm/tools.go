//go:build tools

// Package tools pins the helm command the local stack builds to lint and
// render the chart.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
