package localserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/launch"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/localapi"
)

// Checks a daemon makes after callsig's, named at the start of a
// rejection's message.
const (
	// checkKeyExpr: the key expression does not name this daemon as
	// receiver, or not the sender and node the call proved.
	checkKeyExpr = "key expression"
	// checkRights: the proved sender may not call the method.
	checkRights = "rights"
	// checkPlacement: the active launch does not place the instance of
	// another machine on that machine.
	checkPlacement = "placement"
	// checkGoalSender: only the sender of a goal may cancel, renew or
	// release it.
	checkGoalSender = "goal sender"
)

// services are the services a client may call with Call.
var services = []string{localapi.ServiceStatus, localapi.ServiceLeases, localapi.ServiceMembership, localapi.ServiceLaunch}

// refusal returns a reply of kind rejected; check starts the message.
func refusal(check, format string, args ...any) *localv1.CallReply {
	return &localv1.CallReply{Kind: localapi.KindRejected, Message: check + ": " + fmt.Sprintf(format, args...)}
}

// failure returns a reply of kind error.
func failure(format string, args ...any) *localv1.CallReply {
	return &localv1.CallReply{Kind: localapi.KindError, Message: fmt.Sprintf(format, args...)}
}

// refused turns a callsig rejection into a reply.
func refused(err error) *localv1.CallReply {
	var r *callsig.Rejection
	if errors.As(err, &r) {
		return &localv1.CallReply{Kind: localapi.KindRejected, Message: r.Msg}
	}
	return failure("%v", err)
}

// decodeEnvelope decodes a call's envelope: nil for an empty one (a call
// with no signature), a malformed refusal for one that does not decode.
func decodeEnvelope(b []byte) (*callsig.Envelope, *localv1.CallReply) {
	if len(b) == 0 {
		return nil, nil
	}
	env := new(callsig.Envelope)
	if err := env.UnmarshalBinary(b); err != nil {
		return nil, refusal(callsig.CheckMalformed, "the envelope does not decode: %v", err)
	}
	return env, nil
}

// localAPI serves the calls of local clients.
type localAPI struct {
	localv1.UnimplementedLocalAPIServer
	s *Server
}

// Hello tells a client how to address its calls.
func (a localAPI) Hello(context.Context, *localv1.HelloRequest) (*localv1.HelloReply, error) {
	s := a.s
	return &localv1.HelloReply{Namespace: s.namespace, NodeId: s.nodeID, BootId: s.machine.BootID(), Services: services, CliSender: localapi.CLISender}, nil
}

// Call serves a call of a local client: the command line or an instance
// of this machine.
func (a localAPI) Call(ctx context.Context, req *localv1.CallRequest) (*localv1.CallReply, error) {
	s := a.s
	env, bad := decodeEnvelope(req.GetEnvelope())
	if bad != nil {
		return s.logRefusal(ctx, "local", nil, bad), nil
	}
	if env != nil && callsig.IsProbe(env.Kind) {
		return s.probe(env), nil
	}
	// The sender is read only once the call verifies with its key.
	if err := s.verifier.Verify(env); err != nil {
		return s.logRefusal(ctx, "local", env, refused(err)), nil
	}
	ke, bad := s.keyExpr(env, s.nodeID, false)
	if bad != nil {
		return s.logRefusal(ctx, "local", env, bad), nil
	}
	if ke.Receiver != s.nodeID {
		return s.relay(ctx, env, req.GetEnvelope(), ke, req.GetAddress()), nil
	}
	caller := localapi.Principal{NodeID: s.nodeID, Sender: env.Sender}
	return s.serve(ctx, caller, true, ke, env), nil
}

// federationServer serves the calls of other machines.
type federationServer struct {
	localv1.UnimplementedFederationServer
	s *Server
}

// Call serves a call of another machine: it checks the machine proof, then
// the call under the key the proof endorses.
func (f federationServer) Call(ctx context.Context, req *localv1.CallRequest) (*localv1.CallReply, error) {
	s := f.s
	env, bad := decodeEnvelope(req.GetEnvelope())
	if bad != nil {
		return s.logRefusal(ctx, "federation", nil, bad), nil
	}
	if env != nil && callsig.IsProbe(env.Kind) {
		return s.probe(env), nil
	}
	if env == nil || len(env.Signature) == 0 {
		return s.logRefusal(ctx, "federation", env, refused(s.verifier.Verify(env))), nil
	}
	// A proof this daemon accepted before, under the same trust, is
	// served from the cache until its chain expires.
	peer, err := s.proofs.Verify(req.GetMachineProof(), s.machine.Trust(), s.namespace, s.now())
	if err != nil {
		return s.logRefusal(ctx, "federation", env, refused(err)), nil
	}
	if err := s.verifier.VerifyPeer(env, peer); err != nil {
		return s.logRefusal(ctx, "federation", env, refused(err)), nil
	}
	ke, bad := s.keyExpr(env, peer.NodeID, true)
	if bad != nil {
		return s.logRefusal(ctx, "federation", env, bad), nil
	}
	if bad := s.placement(peer); bad != nil {
		return s.logRefusal(ctx, "federation", env, bad), nil
	}
	s.peers.called(peer.NodeID, peer.BootID, s.now())
	caller := localapi.Principal{NodeID: peer.NodeID, Sender: peer.Sender}
	return s.serve(ctx, caller, false, ke, env), nil
}

// keyExpr checks the key expression of a verified call: it names the
// namespace and the sender the call is signed for, the sender's node, and,
// for a call of another machine, this daemon as receiver.
func (s *Server) keyExpr(env *callsig.Envelope, senderNode string, remote bool) (localapi.KeyExpr, *localv1.CallReply) {
	ke, err := localapi.ParseKeyExpr(env.KeyExpr)
	switch {
	case err != nil:
		return ke, refusal(checkKeyExpr, "%v", err)
	case ke.Namespace != env.Namespace:
		return ke, refusal(checkKeyExpr, "it names namespace %q, but the call is signed for %q", ke.Namespace, env.Namespace)
	case ke.Sender != env.Sender:
		return ke, refusal(checkKeyExpr, "it names sender %q, but the call is signed by sender %q", ke.Sender, env.Sender)
	case ke.SenderNode != senderNode:
		return ke, refusal(checkKeyExpr, "it names sender node %q, but the call comes from node %q", ke.SenderNode, senderNode)
	case remote && ke.Receiver != s.nodeID:
		return ke, refusal(checkKeyExpr, "it names receiver %q, but this daemon is node %q", ke.Receiver, s.nodeID)
	}
	return ke, nil
}

// placement is the launch coordinator's check: the daemon takes a call of
// an instance of another machine as that instance only when the active
// launch places the instance on that machine.
func (s *Server) placement(peer *callsig.Peer) *localv1.CallReply {
	if peer.Sender == localapi.CLISender || peer.Sender == localapi.DaemonSender {
		return nil
	}
	l := s.launch.Load()
	if l == nil {
		return refusal(checkPlacement, "no launch is active on this daemon, so it takes no call of an instance of another machine; run bcd launch FILE with a launch that places instance %q on node %q", peer.Sender, peer.NodeID)
	}
	if err := l.Check(peer.NodeID, peer.Sender); err != nil {
		return refusal(checkPlacement, "%s", strings.TrimPrefix(err.Error(), launch.ErrNotPlaced.Error()+": "))
	}
	return nil
}

// probe answers a probe with presence alone: it runs nothing, and reads
// nothing of the call but the service its key expression names.
func (s *Server) probe(env *callsig.Envelope) *localv1.CallReply {
	p := localapi.ProbeReply{}
	if ke, err := localapi.ParseKeyExpr(env.KeyExpr); err == nil {
		p.Service = ke.Service
		p.Present = ke.Receiver == s.nodeID && known(ke.Service)
	}
	return ok(p)
}

func known(service string) bool {
	for _, sv := range services {
		if sv == service {
			return true
		}
	}
	return false
}

// logRefusal logs a refused call once, with the sender it claims, and
// returns the reply.
func (s *Server) logRefusal(ctx context.Context, via string, env *callsig.Envelope, r *localv1.CallReply) *localv1.CallReply {
	claimed := ""
	if env != nil {
		claimed = env.Sender
	}
	s.log.InfoContext(ctx, "call refused", logkey.Via, via, logkey.ClaimedSender, claimed, logkey.Reason, r.GetMessage())
	return r
}
