package localserver

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/localapi"
)

// Run holds one start of an instance for the life of its process. The
// first message must be a start signed by the command line of this
// machine. When the stream ends — bcd run reports the process's exit, or
// bcd run itself is gone — the daemon forgets the instance's key, drops
// its endorsement and leases, and removes its key file and runtime
// configuration.
func (a localAPI) Run(stream localv1.LocalAPI_RunServer) error {
	s := a.s
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	raw := first.GetStart()
	if raw == nil {
		return status.Error(codes.InvalidArgument, "the first message of Run must be a start")
	}
	in, bad := s.startInstance(ctx, raw)
	if bad != nil {
		return stream.Send(&localv1.RunReply{Body: &localv1.RunReply_Refused{Refused: bad}})
	}
	reason, code := "the Run stream ended (bcd run is gone)", int32(0)
	defer func() { s.endInstance(context.WithoutCancel(ctx), in, reason, code) }()
	if err := stream.Send(&localv1.RunReply{Body: &localv1.RunReply_Started{Started: &localv1.Started{Sender: in.name, RuntimeFile: in.runtimeFile, KeyFile: in.keyFile}}}); err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch b := m.Body.(type) {
		case *localv1.RunRequest_Pid:
			in.pid.Store(b.Pid)
			s.log.DebugContext(ctx, "instance process", logkey.Instance, in.name, "pid", b.Pid)
		case *localv1.RunRequest_Exited:
			reason, code = "its process exited", b.Exited.GetCode()
			s.endInstance(ctx, in, reason, code)
			return stream.Send(&localv1.RunReply{Body: &localv1.RunReply_Ended{Ended: &localv1.Ended{}}})
		default:
			return status.Error(codes.InvalidArgument, "Run takes one start, then pid and exited messages")
		}
	}
}

// startInstance verifies a start and makes the instance's key and files.
func (s *Server) startInstance(ctx context.Context, raw []byte) (*instance, *localv1.CallReply) {
	env, bad := decodeEnvelope(raw)
	if bad != nil {
		return nil, s.logRefusal(ctx, "run", nil, bad)
	}
	if err := s.verifier.Verify(env); err != nil {
		return nil, s.logRefusal(ctx, "run", env, refused(err))
	}
	ke, bad := s.keyExpr(env, s.nodeID, true)
	if bad != nil {
		return nil, s.logRefusal(ctx, "run", env, bad)
	}
	if ke.Service != localapi.ServiceInstances || ke.Method != localapi.MethodStart || env.Kind != callsig.KindQuery {
		return nil, failure("the start of Run is a query to instances/start, not a %s to %s/%s", env.Kind, ke.Service, ke.Method)
	}
	if env.Sender != localapi.CLISender {
		return nil, s.logRefusal(ctx, "run", env, refusal(checkRights, "sender %q may not start instances; only the command line of this machine may (bcd run)", env.Sender))
	}
	var req localapi.StartRequest
	if bad := decode(methodInstancesStart, env.Payload, &req); bad != nil {
		return nil, bad
	}
	name, err := instanceName(req)
	if err != nil {
		return nil, failure("instances/start: %v", err)
	}
	rt := localapi.Runtime{Version: localapi.RuntimeVersion, Namespace: s.namespace, NodeID: s.nodeID, BootID: s.machine.BootID(), Socket: s.socket}
	in, err := s.instances.start(name, rt, s.now())
	if err != nil {
		return nil, failure("instances/start: %v", err)
	}
	if !s.keys.add(name, in.key) {
		s.instances.end(in)
		return nil, failure("instances/start: sender %q has a key on this daemon; choose another --name", name)
	}
	if err := s.machine.Endorse(name, in.key); err != nil {
		s.keys.remove(name, in.key)
		s.instances.end(in)
		return nil, failure("instances/start: %v", err)
	}
	s.log.InfoContext(ctx, "instance started", logkey.Instance, name, "runtime", in.runtimeFile)
	return in, nil
}

// endInstance forgets the key of in (so its calls are refused as of an
// unknown sender), drops its endorsement and its lease goals, then
// removes its files. It runs once per instance.
func (s *Server) endInstance(ctx context.Context, in *instance, reason string, code int32) {
	in.ended.Do(func() {
		s.keys.remove(in.name, in.key)
		s.machine.Forget(in.name, in.key)
		goals := s.leases.Forget(localapi.Principal{NodeID: s.nodeID, Sender: in.name})
		if err := s.instances.end(in); err != nil {
			s.log.WarnContext(ctx, "instance files not removed", logkey.Instance, in.name, logkey.Error, err)
		}
		s.log.InfoContext(ctx, "instance ended", logkey.Instance, in.name, logkey.Reason, reason, "exit_code", code, "goals_cancelled", len(goals))
		if s.onEnd != nil {
			s.onEnd(in.name)
		}
	})
}
