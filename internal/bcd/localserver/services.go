package localserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/launch"
	"github.com/nodetrust/nodetrust/internal/bcd/leases"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/localapi"
	"github.com/nodetrust/nodetrust/pki"
)

// ok returns a reply of kind ok with v as its JSON payload.
func ok(v any) *localv1.CallReply {
	b, err := json.Marshal(v)
	if err != nil {
		return failure("encode the reply: %v", err)
	}
	return &localv1.CallReply{Kind: localapi.KindOK, Payload: b}
}

// decode reads a request payload strictly: an unknown field is an error.
// An empty payload is {}.
func decode(method string, payload []byte, v any) *localv1.CallReply {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return failure("%s: the request does not decode: %v; see docs/local-api.md", method, err)
	}
	if dec.More() {
		return failure("%s: the request has data after its JSON object", method)
	}
	return nil
}

// The methods the daemon serves, as "<service>/<method>" of the key
// expression.
const (
	methodStatusGet      = localapi.ServiceStatus + "/" + localapi.MethodGet
	methodLeasesAcquire  = localapi.ServiceLeases + "/" + localapi.MethodAcquire
	methodLeasesRenew    = localapi.ServiceLeases + "/" + localapi.MethodRenew
	methodLeasesRelease  = localapi.ServiceLeases + "/" + localapi.MethodRelease
	methodLeasesList     = localapi.ServiceLeases + "/" + localapi.MethodList
	methodMembershipList = localapi.ServiceMembership + "/" + localapi.MethodList
	methodLaunchGet      = localapi.ServiceLaunch + "/" + localapi.MethodGet
	methodLaunchApply    = localapi.ServiceLaunch + "/" + localapi.MethodApply
	methodInstancesStart = localapi.ServiceInstances + "/" + localapi.MethodStart
)

// serve runs a verified call of caller. local says whether the call came
// on the local socket.
func (s *Server) serve(ctx context.Context, caller localapi.Principal, local bool, ke localapi.KeyExpr, env *callsig.Envelope) *localv1.CallReply {
	method := ke.Service + "/" + ke.Method
	cancel := env.Kind == callsig.KindCancel
	switch {
	case env.Kind != callsig.KindQuery && !cancel:
		return failure("kind %q: this daemon takes the kinds query, cancel (of a leases/acquire goal) and probe", env.Kind)
	case cancel && method != methodLeasesAcquire:
		return failure("kind cancel cancels a goal of leases/acquire, and %s starts no goal", method)
	}
	s.log.DebugContext(ctx, "call", logkey.Service, method, logkey.Sender, caller.Sender, logkey.NodeID, caller.NodeID, "kind", env.Kind)
	var req struct{}
	switch method {
	case methodStatusGet:
		if bad := decode(method, env.Payload, &req); bad != nil {
			return bad
		}
		return ok(s.status(caller))
	case methodLeasesAcquire:
		if cancel {
			var r localapi.GoalRequest
			if bad := decode(method, env.Payload, &r); bad != nil {
				return bad
			}
			return leaseReply(s.leases.Cancel(caller, r.GoalID))
		}
		var r localapi.AcquireRequest
		if bad := decode(method, env.Payload, &r); bad != nil {
			return bad
		}
		return leaseReply(s.leases.Acquire(caller, r.Resource, time.Duration(r.TTLSeconds)*time.Second))
	case methodLeasesRenew:
		var r localapi.RenewRequest
		if bad := decode(method, env.Payload, &r); bad != nil {
			return bad
		}
		return leaseReply(s.leases.Renew(caller, r.GoalID, time.Duration(r.TTLSeconds)*time.Second))
	case methodLeasesRelease:
		var r localapi.GoalRequest
		if bad := decode(method, env.Payload, &r); bad != nil {
			return bad
		}
		return leaseReply(s.leases.Release(caller, r.GoalID))
	case methodLeasesList:
		if bad := decode(method, env.Payload, &req); bad != nil {
			return bad
		}
		return ok(s.leases.List())
	case methodMembershipList:
		if bad := decode(method, env.Payload, &req); bad != nil {
			return bad
		}
		return ok(s.membership())
	case methodLaunchGet:
		l := s.launch.Load()
		if l == nil {
			return failure("no launch is active on this daemon; apply one with bcd launch FILE")
		}
		return ok(l)
	case methodLaunchApply:
		if !local || caller.Sender != localapi.CLISender {
			return refusal(checkRights, "sender %s may not call %s; only the command line of this machine may (bcd launch)", caller, method)
		}
		l, err := launch.ParseJSON(env.Payload)
		if err != nil {
			return failure("%s: %v", method, err)
		}
		s.launch.Store(l)
		s.log.InfoContext(ctx, "launch applied", "launch", l.Name, "machines", len(l.Machines), "instances", len(l.Instances))
		return ok(l)
	case methodInstancesStart:
		return failure("instances/start is served on the Run stream only: start an instance with bcd run")
	}
	if !known(ke.Service) {
		return failure("this daemon has no service %q; its services are %s", ke.Service, strings.Join(services, ", "))
	}
	return failure("service %s has no method %q; see docs/local-api.md", ke.Service, ke.Method)
}

// leaseReply turns the outcome of a lease operation into a reply: the
// goal, a refusal when the caller is not the goal's sender, or a failure.
func leaseReply(g localapi.Goal, err error) *localv1.CallReply {
	switch {
	case err == nil:
		return ok(g)
	case errors.Is(err, leases.ErrNotSender):
		return refusal(checkGoalSender, "%s", strings.TrimPrefix(err.Error(), leases.ErrNotSender.Error()+": "))
	}
	return failure("%v", err)
}

// status describes the daemon to caller.
func (s *Server) status(caller localapi.Principal) localapi.Status {
	st := localapi.Status{
		NodeID:        s.nodeID,
		Namespace:     s.namespace,
		TrustDomain:   s.c.State.Identity.TrustDomain,
		BootID:        s.machine.BootID(),
		Version:       s.c.Version,
		Caller:        caller,
		Instances:     s.instances.count(),
		Resources:     s.leases.Resources(),
		ReplayEntries: s.verifier.ReplayStats().Entries,
	}
	if st.Resources == nil {
		st.Resources = []string{}
	}
	if c := s.machine.Certificate(); c != nil {
		st.MachineCertificate = &localapi.Certificate{Serial: pki.SerialHex(c), NotAfter: c.NotAfter.UTC()}
	}
	if a := s.fedAddr.Load(); a != nil {
		st.FederationAddress = *a
	}
	if l := s.launch.Load(); l != nil {
		st.Launch = l.Name
	}
	return st
}

// membership lists the machines and instances the daemon knows.
func (s *Server) membership() localapi.Membership {
	machines := map[string]*localapi.Machine{}
	get := func(node, source string) *localapi.Machine {
		m, found := machines[node]
		if !found {
			m = &localapi.Machine{NodeID: node}
			machines[node] = m
		}
		if !slices.Contains(m.Sources, source) {
			m.Sources = append(m.Sources, source)
		}
		return m
	}
	self := get(s.nodeID, "self")
	self.Self, self.BootID = true, s.machine.BootID()
	if a := s.fedAddr.Load(); a != nil {
		self.Address = *a
	}
	l := s.launch.Load()
	if l != nil {
		for node, lm := range l.Machines {
			m := get(node, "launch")
			if m.Address == "" {
				m.Address = lm.Address
			}
		}
	}
	for node, addr := range s.c.Peers {
		m := get(node, "config")
		if m.Address == "" {
			m.Address = addr
		}
	}
	for _, p := range s.peers.list() {
		m := get(p.node, "call")
		m.BootID = p.bootID
		t := p.last.UTC()
		m.LastCall = &t
	}
	out := localapi.Membership{Machines: []localapi.Machine{}, Instances: []localapi.Instance{}}
	for _, node := range sortedNodes(machines, s.nodeID) {
		out.Machines = append(out.Machines, *machines[node])
	}
	for _, in := range s.instances.list() {
		t := in.started.UTC()
		out.Instances = append(out.Instances, localapi.Instance{Name: in.name, NodeID: s.nodeID, State: localapi.InstanceRunning, PID: int(in.pid.Load()), StartedAt: &t})
	}
	if l != nil {
		for node := range l.Machines {
			if node == s.nodeID {
				continue
			}
			for _, name := range l.Placed(node) {
				out.Instances = append(out.Instances, localapi.Instance{Name: name, NodeID: node, State: localapi.InstancePlaced})
			}
		}
	}
	slices.SortStableFunc(out.Instances, func(a, b localapi.Instance) int {
		if c := strings.Compare(a.NodeID, b.NodeID); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// sortedNodes returns the node ids of m, self first, then sorted.
func sortedNodes(m map[string]*localapi.Machine, self string) []string {
	nodes := make([]string, 0, len(m))
	for n := range m {
		if n != self {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return append([]string{self}, nodes...)
}
