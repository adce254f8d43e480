// Command nodetrust-load measures a nodetrust control plane under load:
// joins, live sessions, renewals and revocations of simulated nodes, beside
// the crypto floor. See docs/performance.md and 'nodetrust-load --help'.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodetrust/nodetrust/internal/load"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := load.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
