package spireexport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
)

// DefaultPageSize is how many entries or agents one list call returns.
const DefaultPageSize = 500

// batchSize is how many entries one batch call carries.
const batchSize = 50

// Client talks to a SPIRE server's API over its admin Unix socket (which
// SPIRE serves without a credential to local callers).
type Client struct {
	conn     *grpc.ClientConn
	entries  entryv1.EntryClient
	agents   agentv1.AgentClient
	pageSize int32
	// Pages counts the list pages read, for the bounded-memory test.
	Pages int
}

// Dial connects to the SPIRE server's admin socket at path; pageSize 0
// takes DefaultPageSize.
func Dial(path string, pageSize int) (*Client, error) {
	if path == "" {
		return nil, errors.New("the SPIRE server's admin socket is not set ([export.spire] socket, --socket)")
	}
	if pageSize <= 0 {
		pageSize = DefaultPageSize
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("SPIRE server socket %s: %w", path, err)
	}
	return &Client{conn: conn, entries: entryv1.NewEntryClient(conn), agents: agentv1.NewAgentClient(conn), pageSize: int32(min(pageSize, 10000))}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// listEntries calls fn with each entry the filter matches, a page at a
// time; fn returns false to stop.
func (c *Client) listEntries(ctx context.Context, f *entryv1.ListEntriesRequest_Filter, fn func(*types.Entry) bool) error {
	token := ""
	for {
		resp, err := c.entries.ListEntries(ctx, &entryv1.ListEntriesRequest{Filter: f, PageSize: c.pageSize, PageToken: token})
		if err != nil {
			return fmt.Errorf("SPIRE ListEntries: %w", err)
		}
		c.Pages++
		for _, e := range resp.Entries {
			if !fn(e) {
				return nil
			}
		}
		token = resp.NextPageToken
		if token == "" || len(resp.Entries) == 0 {
			return nil
		}
	}
}

// FleetOwned lists the entries that carry the fleet's hint.
func (c *Client) FleetOwned(ctx context.Context) ([]Entry, error) {
	var out []Entry
	err := c.listEntries(ctx, &entryv1.ListEntriesRequest_Filter{ByHint: wrapperspb.String(Hint)}, func(e *types.Entry) bool {
		if e.Hint == Hint {
			out = append(out, fromProto(e))
		}
		return true
	})
	return out, err
}

// FindAgents finds a suspect node's agents: attested agents whose
// selectors include one of the node's selector sets, and the agents of
// join-token aliases of the node's SPIFFE ID (entries parented to a
// join-token agent). For each attested one it looks for a registration
// other than the node's own that carries it, skipping the entries skip
// says the plan deletes.
func (c *Client) FindAgents(ctx context.Context, trustDomain string, d export.Device, skip map[string]bool) ([]Agent, error) {
	byID := map[string]*Agent{}
	var order []string
	add := func(a *types.Agent, attested bool, id string) {
		if _, ok := byID[id]; ok {
			return
		}
		ag := &Agent{ID: id, Attested: attested}
		if a != nil {
			ag.Banned = a.Banned
		}
		byID[id] = ag
		order = append(order, id)
	}
	agentSelectors := map[string][]string{}
	for _, m := range d.Agents {
		want := m.Selectors
		token := ""
		for {
			resp, err := c.agents.ListAgents(ctx, &agentv1.ListAgentsRequest{
				Filter:   &agentv1.ListAgentsRequest_Filter{BySelectorMatch: &types.SelectorMatch{Selectors: toSelectors(want), Match: types.SelectorMatch_MATCH_SUPERSET}},
				PageSize: c.pageSize, PageToken: token})
			if err != nil {
				return nil, fmt.Errorf("SPIRE ListAgents for %s: %w", d.NodeID, err)
			}
			c.Pages++
			for _, a := range resp.Agents {
				have := selectorStrings(a.Selectors)
				if !containsAll(have, want) {
					continue
				}
				id := spiffeIDString(a.Id)
				add(a, true, id)
				agentSelectors[id] = have
			}
			token = resp.NextPageToken
			if token == "" || len(resp.Agents) == 0 {
				break
			}
		}
	}
	if d.SPIFFEID != "" {
		prefix := AgentPrefix(trustDomain)
		var parents []string
		err := c.listEntries(ctx, &entryv1.ListEntriesRequest_Filter{BySpiffeId: toSPIFFEID(trustDomain, d.SPIFFEID)}, func(e *types.Entry) bool {
			if p := spiffeIDString(e.ParentId); strings.HasPrefix(p, prefix) && !slices.Contains(parents, p) && len(parents) < 64 {
				parents = append(parents, p)
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		for _, p := range parents {
			a, err := c.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Id: toSPIFFEID(trustDomain, p)})
			switch {
			case status.Code(err) == codes.NotFound:
				add(nil, false, p)
			case err != nil:
				return nil, fmt.Errorf("SPIRE GetAgent %s: %w", p, err)
			default:
				add(a, true, p)
				agentSelectors[p] = selectorStrings(a.Selectors)
			}
		}
	}
	out := make([]Agent, 0, len(order))
	for _, id := range order {
		a := byID[id]
		if a.Attested && !a.Banned {
			carrier, err := c.carrier(ctx, trustDomain, id, agentSelectors[id], d.SPIFFEID, skip)
			if err != nil {
				return nil, err
			}
			if carrier != nil {
				a.Carriers = []Entry{*carrier}
			}
		}
		out = append(out, *a)
	}
	return out, nil
}

// carrier finds one registration other than the node's own, and not
// skipped, that carries the agent: parented to it, or parented to the
// server with selectors all among the agent's.
func (c *Client) carrier(ctx context.Context, trustDomain, agentID string, agentSelectors []string, nodeSPIFFEID string, skip map[string]bool) (*Entry, error) {
	var found *Entry
	other := func(e *types.Entry) bool {
		return !skip[e.Id] && spiffeIDString(e.SpiffeId) != nodeSPIFFEID
	}
	err := c.listEntries(ctx, &entryv1.ListEntriesRequest_Filter{ByParentId: toSPIFFEID(trustDomain, agentID)}, func(e *types.Entry) bool {
		if other(e) {
			x := fromProto(e)
			found = &x
			return false
		}
		return true
	})
	if err != nil || found != nil || len(agentSelectors) == 0 {
		return found, err
	}
	server := ServerID(trustDomain)
	err = c.listEntries(ctx, &entryv1.ListEntriesRequest_Filter{ByParentId: toSPIFFEID(trustDomain, server),
		BySelectors: &types.SelectorMatch{Selectors: toSelectors(agentSelectors), Match: types.SelectorMatch_MATCH_SUBSET}}, func(e *types.Entry) bool {
		sel := selectorStrings(e.Selectors)
		if other(e) && len(sel) > 0 && containsAll(agentSelectors, sel) {
			x := fromProto(e)
			found = &x
			return false
		}
		return true
	})
	return found, err
}

// Apply carries out the plan's entry changes and bans, and returns the
// failures (each names what failed); the rest is done.
func (c *Client) Apply(ctx context.Context, trustDomain string, p Plan) []string {
	var errs []string
	for chunk := range slices.Chunk(p.Create, batchSize) {
		req := &entryv1.BatchCreateEntryRequest{}
		for _, ch := range chunk {
			req.Entries = append(req.Entries, toProto(trustDomain, ch.Entry))
		}
		resp, err := c.entries.BatchCreateEntry(ctx, req)
		if err != nil {
			errs = append(errs, fmt.Sprintf("create %d entries: %v", len(chunk), err))
			continue
		}
		for i, r := range resp.Results {
			if r.Status.GetCode() != int32(codes.OK) && i < len(chunk) {
				errs = append(errs, fmt.Sprintf("create entry %s: %s (%s)", chunk[i].Entry.ID, r.Status.GetMessage(), codes.Code(r.Status.GetCode())))
			}
		}
	}
	for chunk := range slices.Chunk(p.Update, batchSize) {
		req := &entryv1.BatchUpdateEntryRequest{InputMask: &types.EntryMask{SpiffeId: true, ParentId: true, Selectors: true, Hint: true}}
		for _, ch := range chunk {
			req.Entries = append(req.Entries, toProto(trustDomain, ch.Entry))
		}
		resp, err := c.entries.BatchUpdateEntry(ctx, req)
		if err != nil {
			errs = append(errs, fmt.Sprintf("update %d entries: %v", len(chunk), err))
			continue
		}
		for i, r := range resp.Results {
			if r.Status.GetCode() != int32(codes.OK) && i < len(chunk) {
				errs = append(errs, fmt.Sprintf("update entry %s: %s", chunk[i].Entry.ID, r.Status.GetMessage()))
			}
		}
	}
	for chunk := range slices.Chunk(p.Delete, batchSize) {
		req := &entryv1.BatchDeleteEntryRequest{}
		for _, ch := range chunk {
			req.Ids = append(req.Ids, ch.Entry.ID)
		}
		resp, err := c.entries.BatchDeleteEntry(ctx, req)
		if err != nil {
			errs = append(errs, fmt.Sprintf("delete %d entries: %v", len(chunk), err))
			continue
		}
		for _, r := range resp.Results {
			if code := codes.Code(r.Status.GetCode()); code != codes.OK && code != codes.NotFound {
				errs = append(errs, fmt.Sprintf("delete entry %s: %s", r.Id, r.Status.GetMessage()))
			}
		}
	}
	for _, b := range p.Ban {
		_, err := c.agents.BanAgent(ctx, &agentv1.BanAgentRequest{Id: toSPIFFEID(trustDomain, b.AgentID)})
		if err != nil {
			errs = append(errs, fmt.Sprintf("ban agent %s of node %s: %v", b.AgentID, b.NodeID, err))
		}
	}
	return errs
}

func fromProto(e *types.Entry) Entry {
	sel := selectorStrings(e.Selectors)
	return Entry{ID: e.Id, SPIFFEID: spiffeIDString(e.SpiffeId), ParentID: spiffeIDString(e.ParentId), Selectors: sel, Hint: e.Hint}
}

func toProto(trustDomain string, e Entry) *types.Entry {
	return &types.Entry{Id: e.ID, SpiffeId: toSPIFFEID(trustDomain, e.SPIFFEID), ParentId: toSPIFFEID(trustDomain, e.ParentID),
		Selectors: toSelectors(e.Selectors), Hint: e.Hint}
}

func selectorStrings(s []*types.Selector) []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		out = append(out, x.Type+":"+x.Value)
	}
	slices.Sort(out)
	return out
}

func toSelectors(s []string) []*types.Selector {
	out := make([]*types.Selector, 0, len(s))
	for _, x := range s {
		t, v, _ := strings.Cut(x, ":")
		out = append(out, &types.Selector{Type: t, Value: v})
	}
	return out
}

func spiffeIDString(id *types.SPIFFEID) string {
	if id == nil {
		return ""
	}
	return "spiffe://" + id.TrustDomain + id.Path
}

// toSPIFFEID splits a SPIFFE ID of the trust domain into SPIRE's form.
func toSPIFFEID(trustDomain, id string) *types.SPIFFEID {
	return &types.SPIFFEID{TrustDomain: trustDomain, Path: strings.TrimPrefix(id, "spiffe://"+trustDomain)}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
