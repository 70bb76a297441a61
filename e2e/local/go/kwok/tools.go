//go:build tools

// Package tools pins the kwok command the local stack builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
