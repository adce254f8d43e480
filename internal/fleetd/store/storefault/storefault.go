package storefault

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// ErrInjected is a ready-made error for FailAt: it is not one of the
// store's sentinels, so a caller sees an internal store failure.
var ErrInjected = errors.New("storefault: injected store failure")

// Store is a store.Store that delegates to the store it wraps, except for
// the calls a test armed. It is safe for concurrent use.
type Store struct {
	store.Store

	mu    sync.Mutex
	calls map[string]int
	armed map[string][]*hook
}

// hook is one armed call: the call number it fires at and what it does.
type hook struct {
	at int
	fn func(ctx context.Context) error
}

// New wraps s.
func New(s store.Store) *Store {
	return &Store{Store: s, calls: map[string]int{}, armed: map[string][]*hook{}}
}

// Unwrap returns the wrapped store, whose calls are neither counted nor
// failed.
func (f *Store) Unwrap() store.Store { return f.Store }

var storeType = reflect.TypeFor[store.Store]()

func checkMethod(method string) {
	if _, ok := storeType.MethodByName(method); !ok {
		panic(fmt.Sprintf("storefault: store.Store has no method %q", method))
	}
}

// FailAt makes the nth call of method from now on (1 is the next call)
// return err without reaching the wrapped store.
func (f *Store) FailAt(method string, nth int, err error) {
	f.Before(method, nth, func(context.Context) error { return err })
}

// FailNext makes the next call of method return err.
func (f *Store) FailNext(method string, err error) { f.FailAt(method, 1, err) }

// Before runs fn before the nth call of method from now on (1 is the
// next call), with the call's context. When fn returns an error the call
// returns it without reaching the wrapped store; when it returns nil the
// call goes on. fn may use Unwrap() to change the store.
func (f *Store) Before(method string, nth int, fn func(ctx context.Context) error) {
	checkMethod(method)
	if nth < 1 {
		panic(fmt.Sprintf("storefault: call number %d of %s: the next call is 1", nth, method))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed[method] = append(f.armed[method], &hook{at: f.calls[method] + nth, fn: fn})
}

// Calls returns how many calls of method the wrapper has seen, failed ones
// included.
func (f *Store) Calls(method string) int {
	checkMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Unfired lists the armed calls not reached yet, as "Method#n" with n the
// call's number counted from the wrapper's start, sorted.
func (f *Store) Unfired() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for m, hs := range f.armed {
		for _, h := range hs {
			out = append(out, fmt.Sprintf("%s#%d", m, h.at))
		}
	}
	slices.Sort(out)
	return out
}

// Disarm drops every armed call not reached yet.
func (f *Store) Disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.armed)
}

// enter counts a call of method and runs its hook, if one is armed for
// this call, outside the lock (a hook may use the store).
func (f *Store) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	f.calls[method]++
	n := f.calls[method]
	var fire *hook
	hs := f.armed[method]
	for i, h := range hs {
		if h.at == n {
			fire = h
			f.armed[method] = slices.Delete(hs, i, i+1)
			break
		}
	}
	f.mu.Unlock()
	if fire == nil {
		return nil
	}
	return fire.fn(ctx)
}

// CreateToken implements store.Store.
func (f *Store) CreateToken(ctx context.Context, t store.Token) error {
	if err := f.enter(ctx, "CreateToken"); err != nil {
		return err
	}
	return f.Store.CreateToken(ctx, t)
}

// TokenByHash implements store.Store.
func (f *Store) TokenByHash(ctx context.Context, hash []byte) (store.Token, error) {
	if err := f.enter(ctx, "TokenByHash"); err != nil {
		return store.Token{}, err
	}
	return f.Store.TokenByHash(ctx, hash)
}

// ListTokens implements store.Store.
func (f *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	if err := f.enter(ctx, "ListTokens"); err != nil {
		return nil, err
	}
	return f.Store.ListTokens(ctx)
}

// CompleteJoin implements store.Store.
func (f *Store) CompleteJoin(ctx context.Context, j store.Join) error {
	if err := f.enter(ctx, "CompleteJoin"); err != nil {
		return err
	}
	return f.Store.CompleteJoin(ctx, j)
}

// GetNode implements store.Store.
func (f *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	if err := f.enter(ctx, "GetNode"); err != nil {
		return store.Node{}, err
	}
	return f.Store.GetNode(ctx, id)
}

// NodeByEKPin implements store.Store.
func (f *Store) NodeByEKPin(ctx context.Context, pin string) (store.Node, error) {
	if err := f.enter(ctx, "NodeByEKPin"); err != nil {
		return store.Node{}, err
	}
	return f.Store.NodeByEKPin(ctx, pin)
}

// ListNodes implements store.Store.
func (f *Store) ListNodes(ctx context.Context) ([]store.Node, error) {
	if err := f.enter(ctx, "ListNodes"); err != nil {
		return nil, err
	}
	return f.Store.ListNodes(ctx)
}

// NodesByClaims implements store.Store.
func (f *Store) NodesByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Node, error) {
	if err := f.enter(ctx, "NodesByClaims"); err != nil {
		return nil, err
	}
	return f.Store.NodesByClaims(ctx, productUUID, serials)
}

// RecordRenewal implements store.Store.
func (f *Store) RecordRenewal(ctx context.Context, c store.Cert, audit *store.AuditEvent) error {
	if err := f.enter(ctx, "RecordRenewal"); err != nil {
		return err
	}
	return f.Store.RecordRenewal(ctx, c, audit)
}

// GetCert implements store.Store.
func (f *Store) GetCert(ctx context.Context, serial string) (store.Cert, error) {
	if err := f.enter(ctx, "GetCert"); err != nil {
		return store.Cert{}, err
	}
	return f.Store.GetCert(ctx, serial)
}

// CountCerts implements store.Store.
func (f *Store) CountCerts(ctx context.Context, nodeID string, since time.Time) (int, error) {
	if err := f.enter(ctx, "CountCerts"); err != nil {
		return 0, err
	}
	return f.Store.CountCerts(ctx, nodeID, since)
}

// ListCerts implements store.Store.
func (f *Store) ListCerts(ctx context.Context, nodeID string, limit int) ([]store.Cert, error) {
	if err := f.enter(ctx, "ListCerts"); err != nil {
		return nil, err
	}
	return f.Store.ListCerts(ctx, nodeID, limit)
}

// RevokedCerts implements store.Store.
func (f *Store) RevokedCerts(ctx context.Context, now time.Time, limit int) ([]store.Cert, error) {
	if err := f.enter(ctx, "RevokedCerts"); err != nil {
		return nil, err
	}
	return f.Store.RevokedCerts(ctx, now, limit)
}

// RecordRenewalLimited implements store.Store.
func (f *Store) RecordRenewalLimited(ctx context.Context, c store.Cert, limit store.RenewalLimit, audit *store.AuditEvent) error {
	if err := f.enter(ctx, "RecordRenewalLimited"); err != nil {
		return err
	}
	return f.Store.RecordRenewalLimited(ctx, c, limit, audit)
}

// RenewalTimes implements store.Store.
func (f *Store) RenewalTimes(ctx context.Context, nodeID string, since time.Time) ([]time.Time, error) {
	if err := f.enter(ctx, "RenewalTimes"); err != nil {
		return nil, err
	}
	return f.Store.RenewalTimes(ctx, nodeID, since)
}

// RevokeNode implements store.Store.
func (f *Store) RevokeNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	if err := f.enter(ctx, "RevokeNode"); err != nil {
		return 0, nil, err
	}
	return f.Store.RevokeNode(ctx, id, reason, now, audit)
}

// DeleteNode implements store.Store.
func (f *Store) DeleteNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	if err := f.enter(ctx, "DeleteNode"); err != nil {
		return 0, nil, err
	}
	return f.Store.DeleteNode(ctx, id, reason, now, audit)
}

// NextGeneration implements store.Store.
func (f *Store) NextGeneration(ctx context.Context, id string) (uint64, error) {
	if err := f.enter(ctx, "NextGeneration"); err != nil {
		return 0, err
	}
	return f.Store.NextGeneration(ctx, id)
}

// CreatePending implements store.Store.
func (f *Store) CreatePending(ctx context.Context, p store.Pending) error {
	if err := f.enter(ctx, "CreatePending"); err != nil {
		return err
	}
	return f.Store.CreatePending(ctx, p)
}

// GetPending implements store.Store.
func (f *Store) GetPending(ctx context.Context, id string) (store.Pending, error) {
	if err := f.enter(ctx, "GetPending"); err != nil {
		return store.Pending{}, err
	}
	return f.Store.GetPending(ctx, id)
}

// ListPending implements store.Store.
func (f *Store) ListPending(ctx context.Context, now time.Time) ([]store.Pending, error) {
	if err := f.enter(ctx, "ListPending"); err != nil {
		return nil, err
	}
	return f.Store.ListPending(ctx, now)
}

// ApprovePending implements store.Store.
func (f *Store) ApprovePending(ctx context.Context, nodeID, by string, now time.Time) ([]store.Pending, error) {
	if err := f.enter(ctx, "ApprovePending"); err != nil {
		return nil, err
	}
	return f.Store.ApprovePending(ctx, nodeID, by, now)
}

// AppendAudit implements store.Store.
func (f *Store) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	if err := f.enter(ctx, "AppendAudit"); err != nil {
		return err
	}
	return f.Store.AppendAudit(ctx, e)
}

// ListAudit implements store.Store.
func (f *Store) ListAudit(ctx context.Context, limit int) ([]store.AuditEvent, error) {
	if err := f.enter(ctx, "ListAudit"); err != nil {
		return nil, err
	}
	return f.Store.ListAudit(ctx, limit)
}

// Close implements store.Store: it closes the wrapped store.
func (f *Store) Close() error {
	if err := f.enter(context.Background(), "Close"); err != nil {
		return err
	}
	return f.Store.Close()
}

// PutChallenge implements store.Store.
func (f *Store) PutChallenge(ctx context.Context, c store.Challenge, now time.Time, max int) error {
	if err := f.enter(ctx, "PutChallenge"); err != nil {
		return err
	}
	return f.Store.PutChallenge(ctx, c, now, max)
}

// PutIntakeSession implements store.Store.
func (f *Store) PutIntakeSession(ctx context.Context, s store.IntakeSession, now time.Time, max int) error {
	if err := f.enter(ctx, "PutIntakeSession"); err != nil {
		return err
	}
	return f.Store.PutIntakeSession(ctx, s, now, max)
}

// GetIntakeSession implements store.Store.
func (f *Store) GetIntakeSession(ctx context.Context, id string) (store.IntakeSession, error) {
	if err := f.enter(ctx, "GetIntakeSession"); err != nil {
		return store.IntakeSession{}, err
	}
	return f.Store.GetIntakeSession(ctx, id)
}

// TakeChallenge implements store.Store.
func (f *Store) TakeChallenge(ctx context.Context, id string) (store.Challenge, error) {
	if err := f.enter(ctx, "TakeChallenge"); err != nil {
		return store.Challenge{}, err
	}
	return f.Store.TakeChallenge(ctx, id)
}

// CreateAdmin implements store.Store.
func (f *Store) CreateAdmin(ctx context.Context, a store.AdminCred, audit *store.AuditEvent) error {
	if err := f.enter(ctx, "CreateAdmin"); err != nil {
		return err
	}
	return f.Store.CreateAdmin(ctx, a, audit)
}

// GetAdmin implements store.Store.
func (f *Store) GetAdmin(ctx context.Context, serial string) (store.AdminCred, error) {
	if err := f.enter(ctx, "GetAdmin"); err != nil {
		return store.AdminCred{}, err
	}
	return f.Store.GetAdmin(ctx, serial)
}

// ListAdmins implements store.Store.
func (f *Store) ListAdmins(ctx context.Context) ([]store.AdminCred, error) {
	if err := f.enter(ctx, "ListAdmins"); err != nil {
		return nil, err
	}
	return f.Store.ListAdmins(ctx)
}

// RevokeAdmin implements store.Store.
func (f *Store) RevokeAdmin(ctx context.Context, name, by string, now time.Time, audit *store.AuditEvent) ([]store.AdminCred, error) {
	if err := f.enter(ctx, "RevokeAdmin"); err != nil {
		return nil, err
	}
	return f.Store.RevokeAdmin(ctx, name, by, now, audit)
}

// ApplyInventory implements store.Store.
func (f *Store) ApplyInventory(ctx context.Context, w store.InventoryWrite) error {
	if err := f.enter(ctx, "ApplyInventory"); err != nil {
		return err
	}
	return f.Store.ApplyInventory(ctx, w)
}

// GetDeclaration implements store.Store.
func (f *Store) GetDeclaration(ctx context.Context, name string) (store.Declaration, error) {
	if err := f.enter(ctx, "GetDeclaration"); err != nil {
		return store.Declaration{}, err
	}
	return f.Store.GetDeclaration(ctx, name)
}

// ListDeclarations implements store.Store.
func (f *Store) ListDeclarations(ctx context.Context) ([]store.Declaration, error) {
	if err := f.enter(ctx, "ListDeclarations"); err != nil {
		return nil, err
	}
	return f.Store.ListDeclarations(ctx)
}

// DeclarationsByClaims implements store.Store.
func (f *Store) DeclarationsByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Declaration, error) {
	if err := f.enter(ctx, "DeclarationsByClaims"); err != nil {
		return nil, err
	}
	return f.Store.DeclarationsByClaims(ctx, productUUID, serials)
}

// DeclarationsByEKPin implements store.Store.
func (f *Store) DeclarationsByEKPin(ctx context.Context, pin string) ([]store.Declaration, error) {
	if err := f.enter(ctx, "DeclarationsByEKPin"); err != nil {
		return nil, err
	}
	return f.Store.DeclarationsByEKPin(ctx, pin)
}

// ListChanges implements store.Store.
func (f *Store) ListChanges(ctx context.Context, device string, limit int) ([]store.FieldChange, error) {
	if err := f.enter(ctx, "ListChanges"); err != nil {
		return nil, err
	}
	return f.Store.ListChanges(ctx, device, limit)
}

// TransitionNode implements store.Store.
func (f *Store) TransitionNode(ctx context.Context, t store.Transition) (store.Node, []string, error) {
	if err := f.enter(ctx, "TransitionNode"); err != nil {
		return store.Node{}, nil, err
	}
	return f.Store.TransitionNode(ctx, t)
}

// NodeHistory implements store.Store.
func (f *Store) NodeHistory(ctx context.Context, id string) ([]store.StateChange, error) {
	if err := f.enter(ctx, "NodeHistory"); err != nil {
		return nil, err
	}
	return f.Store.NodeHistory(ctx, id)
}

// RecordClaim implements store.Store.
func (f *Store) RecordClaim(ctx context.Context, c store.Claim, max int) error {
	if err := f.enter(ctx, "RecordClaim"); err != nil {
		return err
	}
	return f.Store.RecordClaim(ctx, c, max)
}

// ListClaims implements store.Store.
func (f *Store) ListClaims(ctx context.Context, limit int) ([]store.Claim, error) {
	if err := f.enter(ctx, "ListClaims"); err != nil {
		return nil, err
	}
	return f.Store.ListClaims(ctx, limit)
}

// AppendVerdict implements store.Store.
func (f *Store) AppendVerdict(ctx context.Context, v store.Verdict, keep int) error {
	if err := f.enter(ctx, "AppendVerdict"); err != nil {
		return err
	}
	return f.Store.AppendVerdict(ctx, v, keep)
}

// ListVerdicts implements store.Store.
func (f *Store) ListVerdicts(ctx context.Context, nodeID string, limit int) ([]store.Verdict, error) {
	if err := f.enter(ctx, "ListVerdicts"); err != nil {
		return nil, err
	}
	return f.Store.ListVerdicts(ctx, nodeID, limit)
}

// PutBootEvidence implements store.Store.
func (f *Store) PutBootEvidence(ctx context.Context, e store.BootEvidence) error {
	if err := f.enter(ctx, "PutBootEvidence"); err != nil {
		return err
	}
	return f.Store.PutBootEvidence(ctx, e)
}

// GetBootEvidence implements store.Store.
func (f *Store) GetBootEvidence(ctx context.Context, nodeID string) (store.BootEvidence, error) {
	if err := f.enter(ctx, "GetBootEvidence"); err != nil {
		return store.BootEvidence{}, err
	}
	return f.Store.GetBootEvidence(ctx, nodeID)
}

// CountVerdictStatus implements store.Store.
func (f *Store) CountVerdictStatus(ctx context.Context) ([]store.VerdictStatus, error) {
	if err := f.enter(ctx, "CountVerdictStatus"); err != nil {
		return nil, err
	}
	return f.Store.CountVerdictStatus(ctx)
}
