package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/localapi"
)

// Exit codes of bcd run besides the instance's own.
const (
	exitCannotRun = 126 // the daemon refused the start, or the program would not start
	exitNotFound  = 127 // no such program
)

// endedWait bounds how long bcd run waits for the daemon to confirm that
// it forgot an ended instance's key.
const endedWait = 10 * time.Second

func runCommand() *cobra.Command {
	var (
		api  apiFlags
		name string
	)
	c := &cobra.Command{
		Use:   "run [--name NAME] -- COMMAND [ARG...]",
		Short: "Start an instance with a key of its own, for the life of its process",
		Long: `run asks bcd node for a start of an instance: the daemon makes a key pair for
this start, writes it to a key file (mode 0600) and names the file in a
runtime configuration, which the program finds through the environment
variable NODETRUST_RUNTIME. The program signs its calls to the daemon with
that key (the Go library: localapi.FromEnv). run holds the start for the
life of the process: when the program ends, or run itself is killed, the
daemon forgets the key and removes the files, and a restart gets a new key.

NAME is the instance's sender id (default: the program's name and a random
suffix); an instance of that name must not run already. run exits with the
program's exit status (128 + the signal for a killed program). It forwards
SIGTERM, SIGHUP and SIGQUIT to the program; SIGINT reaches it from the
terminal. When bcd node stops, the start ends and run sends the program
SIGTERM: its key is gone, so it must be started again.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := exec.LookPath(args[0])
			if err != nil {
				return &cli.ExitError{Code: exitNotFound, Err: fmt.Errorf("cannot run %s: %w", args[0], err)}
			}
			// Signals are bcd run's to forward: the start must outlive
			// them until the program has ended.
			ctx, cancel := context.WithCancel(context.WithoutCancel(cmd.Context()))
			defer cancel()
			client, err := api.dialCLI(ctx)
			if err != nil {
				return err
			}
			defer client.Close()
			stream, started, err := startInstance(ctx, client, localapi.StartRequest{Name: name, Command: args[0]})
			if err != nil {
				return &cli.ExitError{Code: exitCannotRun, Err: err}
			}
			code, err := runInstance(stream, started, path, args, cmd)
			if err != nil {
				return &cli.ExitError{Code: exitCannotRun, Err: err}
			}
			if code != 0 {
				return &cli.ExitError{Code: code}
			}
			return nil
		},
	}
	api.register(c.Flags())
	c.Flags().StringVar(&name, "name", "", "the instance's name, which is its sender id")
	c.Flags().SetInterspersed(false)
	return c
}

// startInstance opens the Run stream and asks for a start, signed as the
// command line.
func startInstance(ctx context.Context, client *localapi.Client, req localapi.StartRequest) (localv1.LocalAPI_RunClient, *localv1.Started, error) {
	env, err := client.Envelope(localapi.Call{Service: localapi.ServiceInstances, Method: localapi.MethodStart, Request: req})
	if err != nil {
		return nil, nil, err
	}
	b, err := env.MarshalBinary()
	if err != nil {
		return nil, nil, err
	}
	stream, err := client.Run(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Start{Start: b}}); err != nil {
		return nil, nil, fmt.Errorf("ask bcd node for a start: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, fmt.Errorf("ask bcd node for a start: %w", err)
	}
	if r := first.GetRefused(); r != nil {
		return nil, nil, localapi.ReplyError(r)
	}
	started := first.GetStarted()
	if started == nil {
		return nil, nil, errors.New("bcd node answered the start with neither a start nor a refusal")
	}
	return stream, started, nil
}

// runInstance runs the program of a start and returns its exit status.
// When the program ends it tells the daemon, and waits until the daemon has
// forgotten the key.
func runInstance(stream localv1.LocalAPI_RunClient, started *localv1.Started, path string, args []string, cmd *cobra.Command) (int, error) {
	child := exec.Command(path, args[1:]...)
	child.Args[0] = args[0]
	child.Env = append(os.Environ(), localapi.EnvRuntime+"="+started.GetRuntimeFile())
	child.Stdin, child.Stdout, child.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	child.SysProcAttr = childAttrs()
	// The parent-death signal is tied to the thread that starts the
	// child: keep this goroutine on it while the child runs.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := child.Start(); err != nil {
		_ = stream.CloseSend()
		return 0, fmt.Errorf("start %s: %w", args[0], err)
	}
	_ = stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Pid{Pid: int64(child.Process.Pid)}})

	ended := make(chan error, 1) // nil: the daemon confirmed the end
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			if m.GetEnded() != nil {
				ended <- nil
				return
			}
		}
	}()
	waited := make(chan struct{})
	go func() { _ = child.Wait(); close(waited) }()

	daemonGone := false
loop:
	for {
		select {
		case sig := <-sigs:
			if sig != os.Interrupt {
				_ = child.Process.Signal(sig)
			}
		case err := <-ended:
			daemonGone = true
			fmt.Fprintf(cmd.ErrOrStderr(), "bcd: bcd node ended the start of %s (%v): its key is gone; stopping it, start it again with bcd run\n", started.GetSender(), err)
			_ = child.Process.Signal(syscall.SIGTERM)
			ended = nil
		case <-waited:
			break loop
		}
	}
	code := exitCode(child.ProcessState)
	if !daemonGone {
		if err := stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Exited{Exited: &localv1.Exited{Code: int32(code)}}}); err == nil {
			select {
			case <-ended:
			case <-time.After(endedWait):
			}
		}
	}
	_ = stream.CloseSend()
	return code, nil
}

// exitCode is the exit status of a process, or 128 + the signal that
// killed it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
