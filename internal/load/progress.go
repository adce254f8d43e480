package load

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// console writes warnings and the progress line to the terminal without
// mixing them: a warning clears the progress line and the next update
// draws it again.
type console struct {
	mu       sync.Mutex
	log      io.Writer
	progress io.Writer
	shown    int // width of the progress line on screen
}

func newConsole(log, progress io.Writer) *console {
	return &console{log: log, progress: progress}
}

func (c *console) println(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintln(c.log, msg)
}

// status draws line as the progress line.
func (c *console) status(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.progress == nil {
		return
	}
	pad := ""
	if n := c.shown - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	fmt.Fprintf(c.progress, "\r%s%s", line, pad)
	c.shown = len(line)
}

// done ends the progress line, leaving nothing on it.
func (c *console) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
}

func (c *console) clearLocked() {
	if c.progress != nil && c.shown > 0 {
		fmt.Fprintf(c.progress, "\r%s\r", strings.Repeat(" ", c.shown))
		c.shown = 0
	}
}

// counter is a phase's live progress, updated by its workers.
type counter struct {
	name  string
	total int
	ok    atomic.Int64
	fail  atomic.Int64
	start time.Time
}

// progressInterval bounds the progress line's updates to a few a second.
const progressInterval = 250 * time.Millisecond

// watch draws ctr on the progress line until stop is closed, with the
// server's CPU use and memory (summed over pids) when its processes are
// known.
func (c *console) watch(ctr *counter, pids []int, stop <-chan struct{}) {
	if c.progress == nil {
		return
	}
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	var last procUsage
	lastAt := time.Now()
	if len(pids) > 0 {
		last, _ = sampleProcs(pids)
	}
	for {
		select {
		case <-stop:
			c.done()
			return
		case now := <-t.C:
			ok, fail := ctr.ok.Load(), ctr.fail.Load()
			rate := float64(ok) / now.Sub(ctr.start).Seconds()
			line := fmt.Sprintf("%-12s %d/%d ok, %d errors, %.0f/s", ctr.name, ok, ctr.total, fail, rate)
			if len(pids) > 0 {
				if u, err := sampleProcs(pids); err == nil {
					cpu := float64(u.CPU-last.CPU) / float64(now.Sub(lastAt))
					line += fmt.Sprintf(", server CPU %.0f%%, RSS %s", 100*cpu, mib(u.RSS))
					last, lastAt = u, now
				}
			}
			c.status(line)
		}
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
