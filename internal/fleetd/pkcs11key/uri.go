package pkcs11key

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// URI is a PKCS#11 URI (RFC 7512) as fleetd uses it: which token (by
// label, serial or slot), which key (by label and id), and, optionally,
// which module and where its PIN is.
type URI struct {
	// Token, Serial and SlotID select the token; exactly one is set.
	Token  string
	Serial string
	SlotID *int
	// Object is the key's label (CKA_LABEL); ID its CKA_ID.
	Object string
	ID     []byte
	// ModulePath is the query attribute module-path: the PKCS#11 library.
	ModulePath string
	// PINSource is the query attribute pin-source, as a file path.
	PINSource string
}

// maxURILen bounds a URI; RFC 7512 sets no limit, real ones are short.
const maxURILen = 2048

// Attributes fleetd understands; RFC 7512 defines more, which are refused
// by name rather than ignored, so that a URI never selects something other
// than what it says.
var (
	pathAttrs  = []string{"token", "serial", "slot-id", "object", "id", "type"}
	queryAttrs = []string{"module-path", "pin-source"}
)

// ParseURI parses an RFC 7512 PKCS#11 URI. It refuses pin-value (a PIN in
// a URI ends up in argv and in files: use pin-source or pkcs11.pin_file),
// a type other than private, attributes it does not support, repeated
// attributes, and a URI that selects no token or more than one way.
func ParseURI(s string) (*URI, error) {
	if len(s) > maxURILen {
		return nil, fmt.Errorf("PKCS#11 URI is %d bytes, more than %d", len(s), maxURILen)
	}
	rest, ok := strings.CutPrefix(s, "pkcs11:")
	if !ok {
		return nil, fmt.Errorf("PKCS#11 URI %q does not start with \"pkcs11:\"", s)
	}
	path, query, _ := strings.Cut(rest, "?")
	u := &URI{}
	seen := map[string]bool{}
	each := func(part, sep string, known []string, set func(name, value string) error) error {
		if part == "" {
			return nil
		}
		for _, attr := range strings.Split(part, sep) {
			name, raw, ok := strings.Cut(attr, "=")
			if !ok || name == "" {
				return fmt.Errorf("PKCS#11 URI attribute %q is not name=value", attr)
			}
			if name == "pin-value" {
				return errors.New("PKCS#11 URI carries pin-value: a PIN must not sit in a URI, which ends up in argv and files; put it in a file (mode 0600) and name it with pin-source or pkcs11.pin_file")
			}
			if !contains(known, name) {
				return fmt.Errorf("PKCS#11 URI attribute %q is not supported here (use %s)", name, strings.Join(known, ", "))
			}
			if seen[name] {
				return fmt.Errorf("PKCS#11 URI names %q twice", name)
			}
			seen[name] = true
			value, err := url.PathUnescape(raw)
			if err != nil {
				return fmt.Errorf("PKCS#11 URI attribute %s: %w", name, err)
			}
			if err := set(name, value); err != nil {
				return fmt.Errorf("PKCS#11 URI attribute %s: %w", name, err)
			}
		}
		return nil
	}
	err := each(path, ";", pathAttrs, func(name, v string) error {
		switch name {
		case "token":
			u.Token = v
		case "serial":
			u.Serial = v
		case "slot-id":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("%q is not a slot number", v)
			}
			u.SlotID = &n
		case "object":
			u.Object = v
		case "id":
			u.ID = []byte(v)
		case "type":
			if v != "private" {
				return fmt.Errorf("%q: fleetd's keys are private keys (type=private)", v)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = each(query, "&", queryAttrs, func(name, v string) error {
		switch name {
		case "module-path":
			if !filepath.IsAbs(v) {
				return fmt.Errorf("%q is not an absolute path", v)
			}
			u.ModulePath = v
		case "pin-source":
			p, err := pinSourcePath(v)
			if err != nil {
				return err
			}
			u.PINSource = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	n := 0
	for _, set := range []bool{u.Token != "", u.Serial != "", u.SlotID != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("PKCS#11 URI %q must select its token one way: token=, serial= or slot-id=", s)
	}
	// Its canonical form escapes what the input may have written raw, up
	// to three bytes for one: bound that too, so that what String writes
	// (a log line, a saved config) always parses again.
	if n := len(u.String()); n > maxURILen {
		return nil, fmt.Errorf("PKCS#11 URI is %d bytes once escaped, more than %d", n, maxURILen)
	}
	return u, nil
}

// pinSourcePath accepts pin-source as an absolute path or a file: URI of
// one; other schemes (a command to run, say) are refused.
func pinSourcePath(v string) (string, error) {
	if p, ok := strings.CutPrefix(v, "file:"); ok {
		p = strings.TrimPrefix(p, "//")
		if !filepath.IsAbs(p) {
			return "", fmt.Errorf("%q is not a file: URI of an absolute path", v)
		}
		return p, nil
	}
	if !filepath.IsAbs(v) {
		return "", fmt.Errorf("%q: want an absolute path or a file: URI", v)
	}
	return v, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// String formats u as a PKCS#11 URI, percent-encoding what needs it; the
// id is always percent-encoded, byte by byte. ParseURI(u.String()) is u.
func (u *URI) String() string {
	var b strings.Builder
	b.WriteString("pkcs11:")
	var attrs []string
	add := func(name, value string) {
		attrs = append(attrs, name+"="+escape(value, false))
	}
	switch {
	case u.Token != "":
		add("token", u.Token)
	case u.Serial != "":
		add("serial", u.Serial)
	case u.SlotID != nil:
		add("slot-id", strconv.Itoa(*u.SlotID))
	}
	if u.Object != "" {
		add("object", u.Object)
	}
	if len(u.ID) > 0 {
		var id strings.Builder
		for _, c := range u.ID {
			fmt.Fprintf(&id, "%%%02x", c)
		}
		attrs = append(attrs, "id="+id.String())
	}
	if u.Object != "" || len(u.ID) > 0 {
		attrs = append(attrs, "type=private")
	}
	b.WriteString(strings.Join(attrs, ";"))
	var q []string
	if u.ModulePath != "" {
		q = append(q, "module-path="+escape(u.ModulePath, true))
	}
	if u.PINSource != "" {
		q = append(q, "pin-source="+escape(u.PINSource, true))
	}
	if len(q) > 0 {
		b.WriteString("?" + strings.Join(q, "&"))
	}
	return b.String()
}

// TokenString names the token alone ("pkcs11:token=fleet"), for messages.
func (u *URI) TokenString() string {
	t := *u
	t.Object, t.ID, t.ModulePath, t.PINSource = "", nil, "", ""
	return t.String()
}

// escape percent-encodes a value: RFC 7512's unreserved characters and
// the few reserved ones it allows stay as they are.
func escape(s string, query bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			strings.IndexByte("-._~:[]@!$'()*+,", c) >= 0,
			query && strings.IndexByte("/|", c) >= 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// Limits on a PIN file.
const maxPINLen = 256

// ReadPIN reads a PIN file: its first line, without the line end. It
// refuses a file others may read (the PIN is a secret: mode 0600 or 0400),
// an empty PIN and one longer than 256 bytes.
func ReadPIN(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("read PIN file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("PIN file %s has mode %v: others may read the PIN; chmod 600 %s", path, st.Mode().Perm(), path)
	}
	if st.Size() > maxPINLen+2 {
		return "", fmt.Errorf("PIN file %s is %d bytes, more than a PIN of %d", path, st.Size(), maxPINLen)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read PIN file: %w", err)
	}
	pin, _, _ := strings.Cut(string(b), "\n")
	pin = strings.TrimSuffix(pin, "\r")
	if pin == "" {
		return "", fmt.Errorf("PIN file %s is empty: write the token's user PIN into it", path)
	}
	if len(pin) > maxPINLen {
		return "", fmt.Errorf("PIN file %s holds more than %d bytes", path, maxPINLen)
	}
	return pin, nil
}
