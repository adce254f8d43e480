package command

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// TokenEnv is the environment variable that may carry the join token.
const TokenEnv = "BCD_JOIN_TOKEN"

// maxTokenBytes bounds what is read as a token.
const maxTokenBytes = 4 << 10

// tokenSource reads the join credential from exactly one source: a file,
// the environment, or standard input. Never from argv.
type tokenSource struct {
	file     string
	env      string
	envSet   bool
	stdin    io.Reader
	terminal bool
	// optional: no source, or an empty one, is no token rather than an
	// error (the tpm attestor of a machine known by its EK).
	optional bool
}

func (s tokenSource) read() ([]byte, error) {
	if s.file != "" && s.envSet {
		return nil, fmt.Errorf("the join token comes from exactly one source, but both --token-file and %s are set; unset one", TokenEnv)
	}
	var raw []byte
	switch {
	case s.file != "":
		f, err := os.Open(s.file)
		if err != nil {
			return nil, fmt.Errorf("read the join token: %w", err)
		}
		defer f.Close()
		raw, err = io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read the join token from %s: %w", s.file, err)
		}
	case s.envSet:
		raw = []byte(s.env)
	default:
		if s.optional && (s.terminal || s.stdin == nil) {
			return nil, nil
		}
		if s.terminal || s.stdin == nil {
			return nil, errors.New("no join token: pipe it on standard input (bcd join < token.txt), or use --token-file or " + TokenEnv)
		}
		var err error
		raw, err = io.ReadAll(io.LimitReader(s.stdin, maxTokenBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read the join token from standard input: %w", err)
		}
	}
	if len(raw) > maxTokenBytes {
		return nil, fmt.Errorf("the join token is longer than %d bytes; is it the right file?", maxTokenBytes)
	}
	tok := bytes.TrimSpace(raw)
	if len(tok) == 0 {
		if s.optional && s.file == "" && !s.envSet {
			return nil, nil
		}
		return nil, errors.New("the join token is empty")
	}
	return tok, nil
}

// isTerminal reports whether r is a character device (an interactive
// terminal), where waiting for a token would only hang.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
