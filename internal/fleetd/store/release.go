package store

import (
	"context"
	"time"
)

// Config release states (docs/install.md "Config release").
const (
	// ReleaseReady: the config waits for its fetch.
	ReleaseReady = "ready"
	// ReleaseClaimed: one fetch holds the config until ClaimedUntil; after
	// that another fetch may claim it again.
	ReleaseClaimed = "claimed"
	// ReleaseBurned: the config was delivered; its code is spent and the
	// sealed config is gone.
	ReleaseBurned = "burned"
)

// ConfigRelease is one machine's rendered config as it waits for its
// release over HTTPS: sealed under a key only the install code derives, so
// the store holds nothing usable without the code, which it never holds.
// There is at most one per UUID: a new render replaces it, and the earlier
// code then matches nothing.
type ConfigRelease struct {
	// UUID is the machine's product UUID, the {uuid} of GET
	// /v1/config/{uuid}.
	UUID string
	// NodeID is the node the release makes active once delivered.
	NodeID string
	// Generation counts the renders of UUID: the store sets it, 1 for the
	// first, one more than the replaced release's otherwise.
	Generation uint64
	// Verifier is derived from the code (internal/fleetd/install); a
	// fetch's code must derive the same.
	Verifier []byte
	// Sealed is the config sealed with a key derived from the code; empty
	// once burned or purged after expiry.
	Sealed      []byte
	ContentType string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	// State is ReleaseReady, ReleaseClaimed or ReleaseBurned.
	State string
	// ClaimID names the fetch holding a claim, ClaimedUntil when the
	// claim lapses; empty and zero unless State is ReleaseClaimed.
	ClaimID      string
	ClaimedUntil time.Time
	BurnedAt     time.Time
	// Activation is empty until the node's activation after the burn is
	// settled, then says how ("active", or why not); ActivatedAt is when
	// it was settled. ActivationAttempts and ActivationError count and
	// name the failed attempts before.
	Activation         string
	ActivatedAt        time.Time
	ActivationAttempts int
	ActivationError    string
}

// ConfigReleases keeps the configs waiting for their release and their
// burn state, so that both survive a restart and reach every replica. It is
// part of [Store].
type ConfigReleases interface {
	// PutConfigRelease stores r (state ReleaseReady) as the release of
	// r.UUID in place of any earlier one, at the next generation, and
	// returns it as stored. The audit event, when not nil, is appended in
	// the same transaction.
	PutConfigRelease(ctx context.Context, r ConfigRelease, audit *AuditEvent) (ConfigRelease, error)
	// GetConfigRelease returns the release of uuid; ErrNotFound if none.
	GetConfigRelease(ctx context.Context, uuid string) (ConfigRelease, error)
	// ClaimConfigRelease gives the release of uuid at generation to the
	// fetch claim until until, in one conditional write: only when it has
	// not expired at now and is ready, or claimed with a claim that lapsed
	// at or before now. Of concurrent claims one wins; the others get
	// ErrConflict, and so does a release of another generation, burned or
	// expired. ErrNotFound when there is none.
	ClaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now, until time.Time) error
	// UnclaimConfigRelease makes the release ready again when claim still
	// holds it; ErrConflict otherwise.
	UnclaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string) error
	// BurnConfigRelease marks the release burned at now and drops its
	// sealed config, when claim still holds it; ErrConflict otherwise.
	// Its activation is then pending.
	BurnConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now time.Time) error
	// ListUnsettledReleases returns at most limit burned releases whose
	// activation is not settled, burned longest ago first. A limit below 1
	// is an error.
	ListUnsettledReleases(ctx context.Context, limit int) ([]ConfigRelease, error)
	// SettleActivation records how the activation of the burned release
	// ended (outcome not empty); FailActivation records a failed attempt,
	// to be retried. Both are ErrConflict unless the release of uuid is
	// at generation, burned and unsettled.
	SettleActivation(ctx context.Context, uuid string, generation uint64, outcome string, now time.Time) error
	FailActivation(ctx context.Context, uuid string, generation uint64, reason string) error
	// PurgeExpiredReleases drops the sealed config of every release that
	// expired at or before now and was not burned, and returns how many
	// it purged. The rows stay, so a late fetch learns the code expired.
	PurgeExpiredReleases(ctx context.Context, now time.Time) (int, error)
}
