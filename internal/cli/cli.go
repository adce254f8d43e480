package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// Exit codes of fleetd and bcd.
const (
	ExitOK      = 0
	ExitFailure = 1
	// ExitUsage is a command-line mistake, or a dry run that changed
	// nothing (bcd join --reset without --yes).
	ExitUsage = 2
)

// ExitError carries the exit code a command wants; its message is
// printed unless it is empty.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return ""
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Usagef is a command-line mistake.
func Usagef(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...)}
}

// Main prints err as "<prog>: <err>" on stderr and returns the exit code.
func Main(prog string, err error, stderr io.Writer) int {
	if err == nil {
		return ExitOK
	}
	code := ExitFailure
	var ee *ExitError
	if errors.As(err, &ee) {
		code = ee.Code
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
	}
	return code
}

// NewLogger returns a text logger on w at level (debug, info, warn, error).
func NewLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	switch strings.ToLower(level) {
	case "debug":
		l = slog.LevelDebug
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// IsRoot reports whether the process runs as root.
func IsRoot() bool { return os.Geteuid() == 0 }
