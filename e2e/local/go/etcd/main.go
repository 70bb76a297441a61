// Command etcd runs the etcd server from its published Go module, so the local
// stack gets an etcd that Kubernetes 1.37 accepts without a prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
