package localapi

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/pki"
)

// The sender ids that are not instances.
const (
	// CLISender is the sender id of the command line (bcd call, bcd run,
	// bcd launch), which signs with credentials/command_line.key.
	CLISender = "nodetrust-cli"
	// DaemonSender is the sender id of a daemon itself, which signs with
	// its boot key.
	DaemonSender = "nodetrust-daemon"
	// reservedPrefix starts every sender id that is not an instance.
	reservedPrefix = "nodetrust-"
)

// The services of a daemon and their methods.
const (
	ServiceStatus     = "status"
	ServiceLeases     = "leases"
	ServiceMembership = "membership"
	ServiceLaunch     = "launch"
	ServiceInstances  = "instances"

	MethodGet     = "get"     // status, launch
	MethodAcquire = "acquire" // leases: a goal; kind "cancel" cancels it
	MethodRenew   = "renew"   // leases
	MethodRelease = "release" // leases
	MethodList    = "list"    // leases, membership
	MethodApply   = "apply"   // launch
	MethodStart   = "start"   // instances, only on the Run stream
)

// The markers of a key expression.
const (
	daemonMarker = "@daemon"
	fromMarker   = "@from"
)

// KeyExpr is the key expression of a call: it names the receiver and the
// sender. Its text is
//
//	<namespace>/@daemon/<receiver>/<service>/<method>/@from/<sender node>/<sender>
//
// such as "fleet.example/@daemon/node-a/leases/acquire/@from/node-b/trainer":
// a call to service leases, method acquire, of the daemon of node-a, from
// the instance trainer of node-b. A local client's sender node is its own
// daemon's node id. The signature covers the key expression, so a call
// cannot be replayed to another daemon, service, method or sender.
type KeyExpr struct {
	Namespace string
	// Receiver is the node id of the daemon that serves the call.
	Receiver string
	Service  string
	Method   string
	// SenderNode is the node id of the daemon the sender belongs to.
	SenderNode string
	// Sender is the sender id: an instance's name, CLISender or
	// DaemonSender. It must equal the envelope's sender.
	Sender string
}

// String returns the key expression's text. It does not validate k.
func (k KeyExpr) String() string {
	return strings.Join([]string{k.Namespace, daemonMarker, k.Receiver, k.Service, k.Method, fromMarker, k.SenderNode, k.Sender}, "/")
}

// Validate checks each part of k, naming the first that is wrong.
func (k KeyExpr) Validate() error {
	if err := ValidNamespace(k.Namespace); err != nil {
		return fmt.Errorf("key expression: %w", err)
	}
	if err := pki.ValidNodeID(k.Receiver); err != nil {
		return fmt.Errorf("key expression: receiver: %w", err)
	}
	if err := validWord("service", k.Service); err != nil {
		return fmt.Errorf("key expression: %w", err)
	}
	if err := validWord("method", k.Method); err != nil {
		return fmt.Errorf("key expression: %w", err)
	}
	if err := pki.ValidNodeID(k.SenderNode); err != nil {
		return fmt.Errorf("key expression: sender node: %w", err)
	}
	if err := ValidSender(k.Sender); err != nil {
		return fmt.Errorf("key expression: %w", err)
	}
	if s := k.String(); len(s) > callsig.MaxKeyExprLen {
		return fmt.Errorf("key expression: %d bytes, more than %d", len(s), callsig.MaxKeyExprLen)
	}
	return nil
}

// ParseKeyExpr parses and validates the text of a key expression. It
// refuses any other form than the one [KeyExpr] describes.
func ParseKeyExpr(s string) (KeyExpr, error) {
	if len(s) > callsig.MaxKeyExprLen {
		return KeyExpr{}, fmt.Errorf("key expression: %d bytes, more than %d", len(s), callsig.MaxKeyExprLen)
	}
	parts := strings.Split(s, "/")
	if len(parts) != 8 || parts[1] != daemonMarker || parts[5] != fromMarker {
		return KeyExpr{}, fmt.Errorf("key expression %q is not <namespace>/@daemon/<receiver>/<service>/<method>/@from/<sender node>/<sender>", clip(s))
	}
	k := KeyExpr{Namespace: parts[0], Receiver: parts[2], Service: parts[3], Method: parts[4], SenderNode: parts[6], Sender: parts[7]}
	if err := k.Validate(); err != nil {
		return KeyExpr{}, err
	}
	return k, nil
}

// ValidNamespace checks a namespace: 1 to 255 bytes of ASCII letters,
// digits, '.', '_' and '-', a letter or digit first. A trust domain is a
// valid namespace.
func ValidNamespace(ns string) error {
	if ns == "" {
		return errors.New("namespace is empty")
	}
	if len(ns) > callsig.MaxNamespaceLen {
		return fmt.Errorf("namespace is %d bytes, more than %d", len(ns), callsig.MaxNamespaceLen)
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if isAlnum(c) || i > 0 && (c == '.' || c == '_' || c == '-') {
			continue
		}
		return fmt.Errorf("namespace %q: character %q at offset %d is not allowed (letters, digits, '.', '_', '-'; a letter or digit first)", clip(ns), c, i)
	}
	return nil
}

// ValidSender checks a sender id: the rules of a node id (1 to 63
// characters, a lower-case letter or digit first, then lower-case letters,
// digits, '.', '_' or '-').
func ValidSender(s string) error {
	if err := pki.ValidNodeID(s); err != nil {
		return fmt.Errorf("sender: %s", strings.Replace(err.Error(), "node id", "sender id", 1))
	}
	return nil
}

// ValidInstanceName checks the name of an instance, which is its sender
// id: a valid sender id that does not start with "nodetrust-" (kept for
// the command line and the daemon).
func ValidInstanceName(name string) error {
	if err := pki.ValidNodeID(name); err != nil {
		return fmt.Errorf("instance name: %s", strings.Replace(err.Error(), "node id", "name", 1))
	}
	if strings.HasPrefix(name, reservedPrefix) {
		return fmt.Errorf("instance name %q: names starting with %q are kept for the command line and the daemon", name, reservedPrefix)
	}
	return nil
}

// validWord checks a service or method name: 1 to 32 characters, a
// lower-case letter first, then lower-case letters, digits or '_'.
func validWord(what, s string) error {
	if s == "" || len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return fmt.Errorf("%s %q: want 1 to 32 characters, a lower-case letter first", what, clip(s))
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("%s %q: character %q at offset %d is not allowed (lower-case letters, digits, '_')", what, clip(s), c, i)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// clip cuts s for error messages.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
