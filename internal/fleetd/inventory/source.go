package inventory

import (
	"context"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Source is where admission reads declarations from: the store (after
// fleetd inventory apply) or NetBox. A Source that cannot answer returns
// an error that is not ErrNotFound, and admission refuses the join;
// nothing already issued is touched.
type Source interface {
	// Name names the source in messages ("inventory", "netbox").
	Name() string
	// Get returns the declaration of a device; an error wrapping
	// store.ErrNotFound when there is none.
	Get(ctx context.Context, name string) (store.Declaration, error)
	// ByClaims returns the declarations whose product UUID or serial a
	// machine claims.
	ByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Declaration, error)
	// ByEKPin returns the declarations whose EK binding names pin.
	ByEKPin(ctx context.Context, pin string) ([]store.Declaration, error)
	// Binding says who wrote d's EK binding last and whether that makes
	// it honoured.
	Binding(ctx context.Context, d store.Declaration) (Authority, error)
}

// Authority is who wrote an EK binding, and whether admission honours it.
type Authority struct {
	Honoured bool
	// Why says, when not honoured, what is wrong; when honoured, who
	// wrote it.
	Why string
}

// StoreSource reads declarations from the store; a binding is honoured
// when the changelog shows that a credential of role declarer wrote each
// of its fields last.
type StoreSource struct{ Store store.Store }

// maxChanges bounds the changelog read to judge one binding.
const maxChanges = 10000

// Name is "inventory".
func (s StoreSource) Name() string { return "inventory" }

// Get returns the stored declaration.
func (s StoreSource) Get(ctx context.Context, name string) (store.Declaration, error) {
	return s.Store.GetDeclaration(ctx, name)
}

// ByClaims returns the stored declarations matching the claims.
func (s StoreSource) ByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Declaration, error) {
	return s.Store.DeclarationsByClaims(ctx, productUUID, serials)
}

// ByEKPin returns the stored declarations binding pin.
func (s StoreSource) ByEKPin(ctx context.Context, pin string) ([]store.Declaration, error) {
	return s.Store.DeclarationsByEKPin(ctx, pin)
}

// Binding reads the changelog of d.
func (s StoreSource) Binding(ctx context.Context, d store.Declaration) (Authority, error) {
	cs, err := s.Store.ListChanges(ctx, d.Name, maxChanges)
	if err != nil {
		return Authority{}, fmt.Errorf("read the changelog of %s: %w", d.Name, err)
	}
	return BindingAuthority(d.Name, cs), nil
}

// BindingAuthority judges a binding from its device's changelog (newest
// first): honoured only when the last write of each binding field was by
// a credential of role declarer, and the pins were written at all.
func BindingAuthority(device string, changes []store.FieldChange) Authority {
	last := map[string]store.FieldChange{}
	for _, c := range changes {
		if _, ok := last[c.Field]; !ok {
			last[c.Field] = c
		}
	}
	pins, ok := last[FieldEKPins]
	if !ok || pins.New == "" {
		return Authority{Why: fmt.Sprintf("the changelog of %s shows no EK binding written", device)}
	}
	for _, f := range BindingFields {
		c, ok := last[f]
		if ok && c.ActorRole != string(roles.Declarer) {
			return Authority{Why: fmt.Sprintf("the binding's %s of %s was last written by %s (role %s) at %s, not by a declarer: it authorizes nothing",
				f, device, c.Actor, c.ActorRole, c.Time.UTC().Format(time.RFC3339))}
		}
	}
	return Authority{Honoured: true, Why: fmt.Sprintf("written by declarer %s at %s", pins.Actor, pins.Time.UTC().Format(time.RFC3339))}
}
