// Command bcd is nodetrust's node program. See 'bcd --help'.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodetrust/nodetrust/internal/bcd/command"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := command.Execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Main("bcd", err, os.Stderr))
}
