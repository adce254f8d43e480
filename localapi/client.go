package localapi

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
)

// MaxMessageLen is the largest gRPC message a client or daemon sends or
// takes: a call with the longest envelope and machine proof.
const MaxMessageLen = callsig.MaxEnvelopeLen + callsig.MaxMachineProofLen + 4096

// The kinds of a reply (localv1.CallReply.Kind).
const (
	KindOK       = "ok"
	KindRejected = "rejected"
	KindError    = "error"
)

// Rejected is the refusal of a call: the daemon did not take it. Message
// starts with the name of the check that failed, such as
// "replay: a call of the last 30s carried nonce …".
type Rejected struct{ Message string }

// Error returns "rejected: " followed by the message.
func (r *Rejected) Error() string { return "rejected: " + r.Message }

// Check returns the name of the check that failed: the message up to its
// first colon.
func (r *Rejected) Check() string {
	check, _, _ := strings.Cut(r.Message, ":")
	return check
}

// Failed is a call the daemon took that failed, such as a lease of an
// unknown resource.
type Failed struct{ Message string }

func (f *Failed) Error() string { return f.Message }

// ReplyError returns nil for an "ok" reply, a *Rejected for a refusal, and
// a *Failed for any other kind.
func ReplyError(r *localv1.CallReply) error {
	switch r.GetKind() {
	case KindOK:
		return nil
	case KindRejected:
		return &Rejected{Message: r.GetMessage()}
	case "":
		return &Failed{Message: "the daemon sent a reply without a kind"}
	default:
		return &Failed{Message: r.GetMessage()}
	}
}

// Client signs calls as one sender and sends them to the daemon of its
// machine, which serves them or relays them to the daemon of another
// machine. It is safe for concurrent use.
type Client struct {
	conn      *grpc.ClientConn
	api       localv1.LocalAPIClient
	signer    *callsig.Signer
	namespace string
	node      string
	socket    string
}

// Dial connects to the daemon at the unix socket path socket and signs as
// signer. It asks the daemon for its namespace and node id (Hello), so it
// fails when no daemon serves the socket.
func Dial(ctx context.Context, socket string, signer *callsig.Signer) (*Client, error) {
	c, err := dial(socket, signer)
	if err != nil {
		return nil, err
	}
	h, err := c.Hello(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.namespace, c.node = h.GetNamespace(), h.GetNodeId()
	return c, nil
}

func dial(socket string, signer *callsig.Signer) (*Client, error) {
	if signer == nil {
		return nil, fmt.Errorf("dial %s: no signer", socket)
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socket, err)
	}
	conn, err := grpc.NewClient("passthrough:///"+abs,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return DialUnix(ctx, abs) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageLen), grpc.MaxCallSendMsgSize(MaxMessageLen)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socket, err)
	}
	return &Client{conn: conn, api: localv1.NewLocalAPIClient(conn), signer: signer, socket: abs}, nil
}

// FromEnv returns a client for a program started by bcd run: it reads the
// runtime configuration that NODETRUST_RUNTIME names and signs with the key
// file of this start.
func FromEnv(ctx context.Context) (*Client, error) {
	rt, err := RuntimeFromEnv()
	if err != nil {
		return nil, err
	}
	return FromRuntime(ctx, rt)
}

// FromRuntime returns a client that signs as the instance of rt with its
// key file. It does not call the daemon.
func FromRuntime(_ context.Context, rt *Runtime) (*Client, error) {
	key, err := ReadKeyFile(rt.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w (the key file goes when the instance's process ends; was this program started by bcd run?)", err)
	}
	signer, err := callsig.NewSigner(callsig.SignerConfig{Sender: rt.Sender, Key: key})
	if err != nil {
		return nil, err
	}
	c, err := dial(rt.Socket, signer)
	if err != nil {
		return nil, err
	}
	c.namespace, c.node = rt.Namespace, rt.NodeID
	return c, nil
}

// Close closes the connection to the daemon.
func (c *Client) Close() error { return c.conn.Close() }

// Namespace returns the namespace the client's calls are signed for.
func (c *Client) Namespace() string { return c.namespace }

// NodeID returns the node id of the client's daemon.
func (c *Client) NodeID() string { return c.node }

// Sender returns the sender id the client's calls give.
func (c *Client) Sender() string { return c.signer.Sender() }

// Hello asks the daemon for its namespace, node id, boot and services.
func (c *Client) Hello(ctx context.Context) (*localv1.HelloReply, error) {
	h, err := c.api.Hello(ctx, &localv1.HelloRequest{})
	if err != nil {
		return nil, c.transportError(err)
	}
	return h, nil
}

// Call describes one call.
type Call struct {
	// Node is the node id of the receiving daemon; empty means the
	// client's own daemon.
	Node string
	// Address is the federation address (host:port) of Node's daemon, for
	// a call to another machine; empty lets the client's daemon find it.
	Address string
	Service string
	Method  string
	// Kind is the call's kind; empty means callsig.KindQuery.
	Kind string
	// Request is the payload: nil means {}, a []byte or json.RawMessage is
	// sent as it is, anything else is marshalled as JSON.
	Request any
}

// KeyExpr returns the key expression of call as this client sends it.
func (c *Client) KeyExpr(call Call) KeyExpr {
	node := call.Node
	if node == "" {
		node = c.node
	}
	return KeyExpr{Namespace: c.namespace, Receiver: node, Service: call.Service, Method: call.Method, SenderNode: c.node, Sender: c.signer.Sender()}
}

// Envelope signs call and returns its envelope.
func (c *Client) Envelope(call Call) (*callsig.Envelope, error) {
	payload, err := marshalPayload(call.Request)
	if err != nil {
		return nil, err
	}
	kind := call.Kind
	if kind == "" {
		kind = callsig.KindQuery
	}
	ke := c.KeyExpr(call)
	if err := ke.Validate(); err != nil {
		return nil, err
	}
	return c.signer.Sign(c.namespace, ke.String(), kind, payload)
}

// Do signs and sends call, and decodes the reply's payload into reply
// (when not nil). A refusal is a *Rejected, a failed call a *Failed.
func (c *Client) Do(ctx context.Context, call Call, reply any) error {
	env, err := c.Envelope(call)
	if err != nil {
		return err
	}
	b, err := env.MarshalBinary()
	if err != nil {
		return err
	}
	r, err := c.Send(ctx, &localv1.CallRequest{Envelope: b, Address: call.Address})
	if err != nil {
		return err
	}
	return DecodeReply(r, reply)
}

// Call makes a query to a service of the client's own daemon.
func (c *Client) Call(ctx context.Context, service, method string, request, reply any) error {
	return c.Do(ctx, Call{Service: service, Method: method, Request: request}, reply)
}

// Cancel cancels a goal that an earlier call to service and method
// started; request names the goal. Only the goal's sender may cancel it.
func (c *Client) Cancel(ctx context.Context, service, method string, request, reply any) error {
	return c.Do(ctx, Call{Service: service, Method: method, Kind: callsig.KindCancel, Request: request}, reply)
}

// Probe reports whether the client's daemon serves service. A probe
// carries no signature.
func (c *Client) Probe(ctx context.Context, service string) (bool, error) {
	env := &callsig.Envelope{
		Namespace: c.namespace,
		KeyExpr:   c.KeyExpr(Call{Service: service, Method: MethodGet}).String(),
		Kind:      callsig.KindProbe,
		Sender:    c.signer.Sender(),
	}
	if _, err := rand.Read(env.Nonce[:]); err != nil {
		return false, err
	}
	b, err := env.MarshalBinary()
	if err != nil {
		return false, err
	}
	r, err := c.Send(ctx, &localv1.CallRequest{Envelope: b})
	if err != nil {
		return false, err
	}
	var p ProbeReply
	if err := DecodeReply(r, &p); err != nil {
		return false, err
	}
	return p.Present, nil
}

// ProbeReply is the reply to a probe.
type ProbeReply struct {
	Service string `json:"service"`
	Present bool   `json:"present"`
}

// Send sends a call as it is: the building block for tools and tests that
// make their own envelopes. Only transport failures are errors; a refusal
// is a reply of kind "rejected".
func (c *Client) Send(ctx context.Context, req *localv1.CallRequest) (*localv1.CallReply, error) {
	r, err := c.api.Call(ctx, req)
	if err != nil {
		return nil, c.transportError(err)
	}
	return r, nil
}

// Run opens the Run stream that holds one start of an instance (bcd run).
func (c *Client) Run(ctx context.Context) (localv1.LocalAPI_RunClient, error) {
	s, err := c.api.Run(ctx)
	if err != nil {
		return nil, c.transportError(err)
	}
	return s, nil
}

// transportError says what to do when the daemon cannot be reached.
func (c *Client) transportError(err error) error {
	if status.Code(err) == codes.Unavailable {
		return fmt.Errorf("no daemon answers at %s: is bcd node running? (%w)", c.socket, err)
	}
	return fmt.Errorf("call the daemon at %s: %w", c.socket, err)
}

// DecodeReply returns ReplyError(r), and for an "ok" reply decodes its
// payload into reply (when not nil).
func DecodeReply(r *localv1.CallReply, reply any) error {
	if err := ReplyError(r); err != nil {
		return err
	}
	if reply == nil {
		return nil
	}
	if err := json.Unmarshal(r.GetPayload(), reply); err != nil {
		return fmt.Errorf("decode the reply: %w", err)
	}
	return nil
}

func marshalPayload(v any) ([]byte, error) {
	switch p := v.(type) {
	case nil:
		return []byte("{}"), nil
	case []byte:
		return p, nil
	case json.RawMessage:
		return p, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode the request: %w", err)
	}
	return b, nil
}
