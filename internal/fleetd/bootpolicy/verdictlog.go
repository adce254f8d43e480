package bootpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// VerdictLogName is the verdict log's file name in the state directory.
const VerdictLogName = "verdicts.jsonl"

// Defaults and bounds of the verdict log's rotation.
const (
	DefaultVerdictLogMaxBytes = 10 << 20
	DefaultVerdictLogKeep     = 5
	MinVerdictLogMaxBytes     = 64 << 10
	MaxVerdictLogKeep         = 100
)

// VerdictLog appends verdicts, one JSON object a line, to verdicts.jsonl
// in a directory, and rotates it by size: when a line would take the file
// past MaxBytes, verdicts.jsonl becomes verdicts.jsonl.1, the .1 becomes
// .2 and so on, and the oldest past Keep is removed. Each Append is
// written with one write and synced before it returns, so a verdict that
// was acknowledged survives a crash; a line a crash cut short is removed
// when the log is opened again. It is safe for concurrent use.
type VerdictLog struct {
	mu       sync.Mutex
	dir      string
	maxBytes int64
	keep     int
	f        *os.File
	size     int64
}

// VerdictLogConfig configures [OpenVerdictLog].
type VerdictLogConfig struct {
	// Dir is the state directory (fleetd's data_dir).
	Dir string
	// MaxBytes is the size past which the log rotates; default 10 MiB, at
	// least 64 KiB.
	MaxBytes int64
	// Keep is how many rotated files are kept; default 5, at most 100.
	Keep int
}

// OpenVerdictLog opens (creating it, mode 0600) the verdict log in
// cfg.Dir.
func OpenVerdictLog(cfg VerdictLogConfig) (*VerdictLog, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultVerdictLogMaxBytes
	}
	if cfg.Keep == 0 {
		cfg.Keep = DefaultVerdictLogKeep
	}
	if cfg.MaxBytes < MinVerdictLogMaxBytes {
		return nil, fmt.Errorf("verdict log: a maximum size of %d bytes is below %d", cfg.MaxBytes, MinVerdictLogMaxBytes)
	}
	if cfg.Keep < 1 || cfg.Keep > MaxVerdictLogKeep {
		return nil, fmt.Errorf("verdict log: keep %d files: want 1 to %d", cfg.Keep, MaxVerdictLogKeep)
	}
	l := &VerdictLog{dir: cfg.Dir, maxBytes: cfg.MaxBytes, keep: cfg.Keep}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

// Path is the current file's path.
func (l *VerdictLog) Path() string { return filepath.Join(l.dir, VerdictLogName) }

// open opens the current file for appending and cuts a last line a crash
// left without its newline.
func (l *VerdictLog) open() error {
	f, err := os.OpenFile(l.Path(), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open the verdict log: %w", err)
	}
	size, err := completeLines(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("open the verdict log %s: %w", l.Path(), err)
	}
	l.f, l.size = f, size
	return nil
}

// completeLines truncates f after its last newline and returns its size.
func completeLines(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	if size == 0 {
		return 0, nil
	}
	// Look back for the last newline, a block at a time.
	const block = 4096
	end := size
	buf := make([]byte, block)
	for end > 0 {
		start := max(0, end-block)
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			end = start + int64(i) + 1
			break
		}
		end = start
	}
	if end == size {
		return size, nil
	}
	if err := f.Truncate(end); err != nil {
		return 0, err
	}
	return end, f.Sync()
}

// Append writes v as one line and syncs it.
func (l *VerdictLog) Append(v *Verdict) error {
	line, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode a verdict: %w", err)
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return errors.New("the verdict log is closed")
	}
	if l.size > 0 && l.size+int64(len(line)) > l.maxBytes {
		if err := l.rotate(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("write the verdict log: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync the verdict log: %w", err)
	}
	return nil
}

// rotate shifts verdicts.jsonl.N to .N+1, dropping the oldest, and starts
// a new file.
func (l *VerdictLog) rotate() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("close the verdict log: %w", err)
	}
	l.f = nil
	base := l.Path()
	if err := os.Remove(fmt.Sprintf("%s.%d", base, l.keep)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rotate the verdict log: %w", err)
	}
	for i := l.keep - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", base, i), fmt.Sprintf("%s.%d", base, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate the verdict log: %w", err)
		}
	}
	if err := os.Rename(base, base+".1"); err != nil {
		return fmt.Errorf("rotate the verdict log: %w", err)
	}
	if err := syncDir(l.dir); err != nil {
		return fmt.Errorf("rotate the verdict log: %w", err)
	}
	return l.open()
}

// Close closes the file.
func (l *VerdictLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
