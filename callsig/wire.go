package callsig

import (
	"encoding/binary"
	"fmt"
)

// Every field of every format in this package is encoded the same way: its
// length as 4 bytes, unsigned big-endian, then its bytes. Fixed-size fields
// (timestamps, nonces, keys, signatures) are length-prefixed too, and their
// length must be exactly their size. See docs/callsig.md.

// lenSize is the size of a field's length prefix.
const lenSize = 4

// appendField appends the length of f as 4 bytes big-endian, then f. The
// caller has checked that len(f) fits in 32 bits (every field has a cap far
// below that).
func appendField[T ~string | ~[]byte](dst []byte, f T) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(f)))
	return append(dst, f...)
}

// appendInt64Field appends an 8-byte field holding v big-endian (two's
// complement).
func appendInt64Field(dst []byte, v int64) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 8)
	return binary.BigEndian.AppendUint64(dst, uint64(v))
}

// reader decodes fields in order. The first failure is kept in err, and every
// later call returns nothing, so a decoder can read all its fields and check
// err once.
type reader struct {
	what string // "envelope", "machine proof": names the format in errors
	b    []byte
	err  error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = &formatError{what: "decode " + r.what, detail: fmt.Sprintf(format, args...)}
	}
}

// version reads the version byte and fails unless it is want.
func (r *reader) version(want byte) {
	if r.err != nil {
		return
	}
	if len(r.b) == 0 {
		r.fail("empty input")
		return
	}
	if r.b[0] != want {
		r.fail("version byte is %#02x, want %#02x", r.b[0], want)
		return
	}
	r.b = r.b[1:]
}

// uint32 reads a bare 4-byte big-endian count; name and suffix name it in
// errors.
func (r *reader) uint32(name, suffix string) uint32 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < lenSize {
		r.fail("%s%s: input ends after %d bytes of its 4", name, suffix, len(r.b))
		return 0
	}
	n := binary.BigEndian.Uint32(r.b)
	r.b = r.b[lenSize:]
	return n
}

// field reads one length-prefixed field of min to max bytes. The result
// aliases the input.
func (r *reader) field(name string, min, max int) []byte {
	n := r.uint32(name, " length")
	if r.err != nil {
		return nil
	}
	switch {
	case uint64(n) > uint64(max) && min == max:
		r.fail("%s is %d bytes, want %d", name, n, max)
	case uint64(n) > uint64(max):
		r.fail("%s is %d bytes, more than the limit of %d", name, n, max)
	case int(n) < min && min == max:
		r.fail("%s is %d bytes, want %d", name, n, min)
	case int(n) < min:
		r.fail("%s is missing (empty)", name)
	case int(n) > len(r.b):
		r.fail("%s: input ends after %d of its %d bytes", name, len(r.b), n)
	}
	if r.err != nil {
		return nil
	}
	f := r.b[:n:n]
	r.b = r.b[n:]
	return f
}

// str reads a non-empty string field of at most max bytes.
func (r *reader) str(name string, max int) string {
	return string(r.field(name, 1, max))
}

// int64Field reads an 8-byte big-endian field.
func (r *reader) int64Field(name string) int64 {
	f := r.field(name, 8, 8)
	if r.err != nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(f))
}

// end fails if bytes remain after the last field.
func (r *reader) end() {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after the last field", len(r.b))
	}
}

// formatError is a value or encoding that breaks the format: "<what>:
// malformed: <detail>", wrapping ErrMalformed.
type formatError struct {
	what   string // the operation or the object: "decode envelope", "boot statement"
	detail string // what is wrong, naming the field
}

func (e *formatError) Error() string { return e.what + ": " + ErrMalformed.Error() + ": " + e.detail }
func (e *formatError) Unwrap() error { return ErrMalformed }

// checkLen reports a missing, oversized or wrongly sized field of a value
// about to be encoded or verified; it returns nil when min <= n <= max.
func checkLen(what, name string, n, min, max int) error {
	if n >= min && n <= max {
		return nil
	}
	return &formatError{what: what, detail: lenProblem(name, n, min, max)}
}

// lenProblem describes a length n outside min..max.
func lenProblem(name string, n, min, max int) string {
	switch {
	case min == max:
		return fmt.Sprintf("%s is %d bytes, want %d", name, n, max)
	case n < min:
		return name + " is missing (empty)"
	default:
		return fmt.Sprintf("%s is %d bytes, more than the limit of %d", name, n, max)
	}
}

// appendUint32 appends v as 4 bytes big-endian (a bare count, not a field).
func appendUint32(dst []byte, v uint32) []byte {
	return binary.BigEndian.AppendUint32(dst, v)
}
