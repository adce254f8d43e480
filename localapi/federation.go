package localapi

import (
	"context"
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
)

// Federation is a client of the federation service of another machine's
// daemon: calls that carry a machine proof. A daemon relays its clients'
// calls to other machines through it; tools and tests may use it directly.
type Federation struct {
	conn *grpc.ClientConn
	api  localv1.FederationClient
	addr string
}

// DialFederation returns a client of the federation service at addr
// (host:port) over TLS configured by tc. The connection is made by the
// first call. tc decides whom the client trusts: a daemon checks that the
// server's certificate is the node certificate of the node it calls.
func DialFederation(addr string, tc *tls.Config) (*Federation, error) {
	if tc == nil {
		return nil, fmt.Errorf("dial federation %s: no TLS configuration", addr)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageLen), grpc.MaxCallSendMsgSize(MaxMessageLen)))
	if err != nil {
		return nil, fmt.Errorf("dial federation %s: %w", addr, err)
	}
	return &Federation{conn: conn, api: localv1.NewFederationClient(conn), addr: addr}, nil
}

// Call sends one call with its machine proof. A nil envelope or proof is
// sent empty. Only transport failures are errors; a refusal is a reply of
// kind "rejected".
func (f *Federation) Call(ctx context.Context, env *callsig.Envelope, proof *callsig.MachineProof) (*localv1.CallReply, error) {
	req := &localv1.CallRequest{}
	if env != nil {
		b, err := env.MarshalBinary()
		if err != nil {
			return nil, err
		}
		req.Envelope = b
	}
	if proof != nil {
		b, err := proof.MarshalBinary()
		if err != nil {
			return nil, err
		}
		req.MachineProof = b
	}
	return f.Send(ctx, req)
}

// Send sends a call as it is.
func (f *Federation) Send(ctx context.Context, req *localv1.CallRequest) (*localv1.CallReply, error) {
	r, err := f.api.Call(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("call the daemon at %s: %w", f.addr, err)
	}
	return r, nil
}

// Close closes the connection.
func (f *Federation) Close() error { return f.conn.Close() }
