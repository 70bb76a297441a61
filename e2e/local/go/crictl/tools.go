//go:build tools

// Package tools pins crictl, which the local stack uses to stop the real
// node's pods through the CRI (so their networks are torn down too).
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
