package command

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	// optional: no source, an empty one, or a token file that does not
	// exist is no token rather than an error (the tpm attestor of a
	// machine known by its EK).
	optional bool
	// warn, when set, is told what the user should know: a token file
	// others may read, a missing one that counts as none.
	warn func(string)
}

func (s tokenSource) read() ([]byte, error) {
	if s.file != "" && s.envSet {
		return nil, fmt.Errorf("the join token comes from exactly one source, but both --token-file and %s are set; unset one", TokenEnv)
	}
	var raw []byte
	switch {
	case s.file != "":
		f, err := os.Open(s.file)
		if s.optional && errors.Is(err, fs.ErrNotExist) {
			s.tell(fmt.Sprintf("no token file %s: joining with the TPM alone (the control plane must know this machine's EK)", s.file))
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the join token: %w", err)
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o004 != 0 {
			s.tell(fmt.Sprintf("the join token file %s is readable by others (mode %04o): chmod 600 %s, or remove it once the machine has joined",
				s.file, fi.Mode().Perm(), s.file))
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

func (s tokenSource) tell(msg string) {
	if s.warn != nil {
		s.warn(msg)
	}
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
