package netreport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/pki/netreport"
)

// DefaultCommand runs lldpd's client for every interface's neighbours.
var DefaultCommand = []string{"lldpctl", "-f", "json"}

// DefaultTimeout bounds one run of lldpctl.
const DefaultTimeout = 10 * time.Second

// maxStderr bounds what of lldpctl's standard error an error quotes.
const maxStderr = 512

// Reader reads the machine's LLDP neighbours: from File when it is set,
// else by running Command (lldpctl -f json by default).
type Reader struct {
	// File holds lldpctl -f json's output, saved by another program.
	File string
	// Command is the program and its arguments; DefaultCommand when
	// empty.
	Command []string
	// Timeout bounds the command's run; DefaultTimeout when zero.
	Timeout time.Duration
}

// Neighbors returns every neighbour the source lists (see ParseLLDPCtl).
func (r Reader) Neighbors(ctx context.Context) ([]netreport.Neighbor, error) {
	var data []byte
	var err error
	if r.File != "" {
		data, err = readBounded(r.File)
	} else {
		data, err = r.run(ctx)
	}
	if err != nil {
		return nil, err
	}
	return ParseLLDPCtl(data)
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read the LLDP neighbours: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxInput+1))
	if err != nil {
		return nil, fmt.Errorf("read the LLDP neighbours from %s: %w", path, err)
	}
	if len(data) > MaxInput {
		return nil, fmt.Errorf("read the LLDP neighbours: %s is more than %d bytes", path, MaxInput)
	}
	return data, nil
}

// run runs the command with bounded time and output.
func (r Reader) run(ctx context.Context) ([]byte, error) {
	argv := r.Command
	if len(argv) == 0 {
		argv = DefaultCommand
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("read the LLDP neighbours: %s is not installed (install lldpd, or save lldpctl -f json's output to a file and name it): %w", argv[0], err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, argv[1:]...)
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &capWriter{buf: &stderr, max: maxStderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("read the LLDP neighbours: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("read the LLDP neighbours: start %s: %w", argv[0], err)
	}
	data, readErr := io.ReadAll(io.LimitReader(out, MaxInput+1))
	if len(data) > MaxInput {
		cancel()
		_ = cmd.Wait()
		return nil, fmt.Errorf("read the LLDP neighbours: %s printed more than %d bytes", argv[0], MaxInput)
	}
	waitErr := cmd.Wait()
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("read the LLDP neighbours: %s did not finish within %s: %w", argv[0], timeout, ctx.Err())
	case waitErr != nil:
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = "no message"
		}
		return nil, fmt.Errorf("read the LLDP neighbours: %s failed (%v): %s (is lldpd running?)", argv[0], waitErr, msg)
	case readErr != nil:
		return nil, fmt.Errorf("read the LLDP neighbours: %w", readErr)
	}
	return data, nil
}

// capWriter keeps the first max bytes written and discards the rest, so a
// chatty program never blocks on its standard error.
type capWriter struct {
	buf *bytes.Buffer
	max int
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// Choose picks the neighbour a report is about: the one heard on iface, or,
// when iface is empty, the only one heard at all. Several neighbours on one
// interface, or several interfaces and none named, are errors that list
// what was heard: a report never guesses the uplink.
func Choose(ns []netreport.Neighbor, iface string) (netreport.Neighbor, error) {
	var match []netreport.Neighbor
	for _, n := range ns {
		if iface == "" || n.Interface == iface {
			match = append(match, n)
		}
	}
	switch {
	case len(ns) == 0:
		return netreport.Neighbor{}, errors.New("no LLDP neighbour heard on any interface: is the switch port's LLDP on, and has lldpd run for 30 s?")
	case len(match) == 1:
		return match[0], nil
	case len(match) == 0:
		return netreport.Neighbor{}, fmt.Errorf("no LLDP neighbour heard on %s; heard on: %s", iface, interfaces(ns))
	case iface == "":
		return netreport.Neighbor{}, fmt.Errorf("LLDP neighbours heard on several interfaces (%s): name the uplink", interfaces(ns))
	}
	return netreport.Neighbor{}, fmt.Errorf("%d LLDP neighbours heard on %s: a report names one switch port", len(match), iface)
}

func interfaces(ns []netreport.Neighbor) string {
	var names []string
	for _, n := range ns {
		if len(names) == 0 || names[len(names)-1] != n.Interface {
			names = append(names, n.Interface)
		}
	}
	return strings.Join(names, ", ")
}

// Build reads the neighbours, chooses the one of iface (see Choose), and
// returns the report, observed now.
func Build(ctx context.Context, r Reader, iface string, now time.Time) (netreport.Report, error) {
	ns, err := r.Neighbors(ctx)
	if err != nil {
		return netreport.Report{}, err
	}
	n, err := Choose(ns, iface)
	if err != nil {
		return netreport.Report{}, err
	}
	rep := netreport.Report{Neighbor: n, ObservedAt: now.UTC()}
	return rep, rep.Check()
}
