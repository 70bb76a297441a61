// Command coredns is CoreDNS with only the plugins the local stack's cluster
// DNS needs; CoreDNS's own main links all of them.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins handle a query in, as in CoreDNS's plugin.cfg.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes", "forward"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
