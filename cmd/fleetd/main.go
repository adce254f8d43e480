// Command fleetd is nodetrust's control plane. See 'fleetd --help'.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/command"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := command.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Main("fleetd", err, os.Stderr))
}
