package store

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrNotFound means the named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict means the write lost a race or would overwrite a record
	// that must stay unique (a node id taken, a token already used).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable means the store could not be reached (a database
	// server down or a connection lost): nothing was decided, and the same
	// call may succeed once the store is back.
	ErrUnavailable = errors.New("store unavailable")
)

// Node states (seed 003's lifecycle; internal/fleetd/lifecycle says what
// each may do and which transitions are allowed). A declared device without
// a node record is planned.
const (
	StatePlanned      = "planned"
	StateProvisioning = "provisioning"
	StateActive       = "active"
	StateQuarantined  = "quarantined"
	StateRetired      = "retired"
	StateRevoked      = "revoked"
)

// Token is a join token as stored: only the SHA-256 of the secret is kept.
type Token struct {
	// ID is a short public name derived from Hash, safe to log and list.
	ID string
	// Hash is the SHA-256 of the token's secret.
	Hash            []byte
	Role            string
	Site            string
	NodeID          string // when set, the token joins only this node
	AllowReclaim    bool
	RequireApproval bool
	CreatedBy       string
	CreatedAt       time.Time
	ExpiresAt       time.Time
	UsedAt          time.Time // zero while unused
	UsedBy          string    // node id that used it
}

// Claims are the hardware facts a machine reported at its last join.
// They are claims, not proof.
type Claims struct {
	ProductUUID string
	Serials     []string
	MACs        []string
	GPUUUIDs    []string
	Hostname    string
	BootID      string
}

// Node is a machine known to the control plane.
type Node struct {
	ID       string
	SPIFFEID string
	Role     string
	Site     string
	State    string
	// Generation is the node's identity generation: it rises on every
	// revocation, re-join and deletion, and certificates of an older
	// generation are dead.
	Generation    uint64
	Attestor      string
	Claims        Claims
	DaemonVersion string
	JoinedAt      time.Time
	LastSeen      time.Time
	// CertSerial is the serial (lower-case hex) of the latest certificate.
	CertSerial   string
	CertNotAfter time.Time
	// EKPin is the pin ("sha256:" + hex of the SPKI DER) of the EK a tpm
	// join proved; empty for a node that never joined with its TPM.
	EKPin string
	// Class is the machine class its declaration names (worker,
	// control-plane, install-environment, or one configured); empty for a
	// node the inventory does not declare.
	Class string
	// LAKName is the TPM name of the LAK (the AK its intake certified)
	// that an installed node's join proved with its LAK certificate; its
	// boot checks must be quoted by that AK. Nil for a node installed
	// without intake.
	LAKName []byte
}

// Cert records one issued node certificate.
type Cert struct {
	Serial     string // lower-case hex
	NodeID     string
	Generation uint64
	Kind       string // "join" or "renew"
	IssuedAt   time.Time
	NotAfter   time.Time
	// RevokedAt is zero while the certificate is not revoked.
	RevokedAt     time.Time
	RevokedReason string
}

// Pending is a token join waiting for an owner's approval. The token is
// spent only when the approved join completes.
type Pending struct {
	// ID is the deferral id the node polls with; random, unguessable.
	ID        string
	TokenHash []byte
	TokenID   string
	// CSRHash binds the pending join to the node's request: a poll with
	// another CSR does not continue it.
	CSRHash    []byte
	NodeID     string
	Role       string
	Site       string
	Claims     Claims
	CreatedAt  time.Time
	ExpiresAt  time.Time
	ApprovedAt time.Time // zero until approved
	ApprovedBy string
}

// Join is everything one successful join writes, atomically.
type Join struct {
	// PendingID, when set, names the approved pending join this completes;
	// it is removed in the same transaction.
	PendingID string
	// TokenHash names the token this join spends; nil for attestors
	// without a token. The token must be unused and unexpired at Now, or
	// CompleteJoin fails with ErrConflict and writes nothing.
	TokenHash []byte
	Now       time.Time
	// Node is written as given. When Reclaim is false the node id must be
	// new (ErrConflict otherwise); when true it replaces the stored node,
	// whose live certificates are then revoked with reason "reclaimed".
	// When a deletion left a tombstone for the id, Node.Generation must be
	// above the tombstone's generation (ErrConflict otherwise): start a new
	// node at NextGeneration.
	Node    Node
	Reclaim bool
	Cert    Cert
	// Audit, when not nil, is appended to the audit trail in the same
	// transaction: it is written if and only if the join is.
	Audit *AuditEvent
	// ExpectState, when not empty, makes the join conditional (with
	// Reclaim): the stored node must exist with state ExpectState and
	// generation ExpectGeneration, or CompleteJoin fails with ErrConflict
	// and writes nothing. A quarantine or retirement between the decision
	// and the write thus refuses the join.
	ExpectState      string
	ExpectGeneration uint64
	// History is appended to the node's state history in the same
	// transaction (a join's planned → provisioning → active, say).
	History []StateChange
	// ClaimKey, when not empty, names the claim this join settles; it is
	// removed in the same transaction.
	ClaimKey string
}

// AuditEvent is one entry of the server's audit trail.
type AuditEvent struct {
	Time    time.Time
	Actor   string // who did it: an admin identity, a node id, "join"
	Action  string // e.g. "token.create", "join.refused", "join"
	Subject string // what it was done to: a node id, a token id
	Detail  string // free text; never a secret
}

// Challenge is an open round of a tpm join, kept until its answer comes
// back, to whichever replica it comes. State is the server's record of the
// round (its nonce, the credential's secret, the evidence it rests on):
// opaque to the store, secret, and never logged.
type Challenge struct {
	ID       string
	NotAfter time.Time
	State    []byte
}

// Store is the control plane's persistent state. Every method is safe for
// concurrent use.
type Store interface {
	// CreateToken stores a new token; ErrConflict if its ID exists.
	CreateToken(ctx context.Context, t Token) error
	// TokenByHash returns the token with this hash, used or not.
	TokenByHash(ctx context.Context, hash []byte) (Token, error)
	// ListTokens returns all tokens, newest first.
	ListTokens(ctx context.Context) ([]Token, error)

	// CompleteJoin spends the token (if any), writes the node, records
	// the certificate and appends j.Audit (if any) in one transaction.
	CompleteJoin(ctx context.Context, j Join) error
	// GetNode returns one node; ErrNotFound if there is none.
	GetNode(ctx context.Context, id string) (Node, error)
	// NodeByEKPin returns the node whose stored EKPin is pin, one that is
	// not retired when there is one (then the lowest id); ErrNotFound if
	// there is none (or pin is empty).
	NodeByEKPin(ctx context.Context, pin string) (Node, error)
	// ListNodes returns all nodes ordered by id.
	ListNodes(ctx context.Context) ([]Node, error)
	// NodesByClaims returns the nodes whose stored product UUID equals
	// productUUID (when not empty) or whose serials share one with serials.
	NodesByClaims(ctx context.Context, productUUID string, serials []string) ([]Node, error)

	// RecordRenewal stores a renewed certificate and updates the node's
	// current serial, expiry and last-seen time, only if the node's
	// generation still equals c.Generation and its state is StateActive
	// (the only state that renews); ErrConflict otherwise. The
	// audit event, when not nil, is appended in the same transaction.
	RecordRenewal(ctx context.Context, c Cert, audit *AuditEvent) error
	// RecordRenewalLimited is RecordRenewal under a renewal limit, checked
	// and written in one transaction that holds the node's row, so that
	// concurrent renewals of one node, on any replicas, are counted one
	// after the other. When the node (of c.Generation, active) has
	// limit.Max certificates of kind "renew" issued at or after
	// c.IssuedAt - limit.Window, nothing is written and the error is a
	// *RenewalLimitError saying when the next renewal may come. A node
	// that changed is ErrConflict, as for RecordRenewal, before the
	// limit is counted.
	RecordRenewalLimited(ctx context.Context, c Cert, limit RenewalLimit, audit *AuditEvent) error
	// GetCert returns one issued certificate by serial.
	GetCert(ctx context.Context, serial string) (Cert, error)
	// CountCerts counts the certificates of a node issued at or after since.
	CountCerts(ctx context.Context, nodeID string, since time.Time) (int, error)
	// ListCerts returns at most limit certificates issued to the node, of
	// every generation, revoked or not, newest first (by issue time, then
	// serial); none for an unknown node. A limit below 1 is refused.
	ListCerts(ctx context.Context, nodeID string, limit int) ([]Cert, error)
	// RevokedCerts returns the revoked certificates that have not expired
	// at now (NotAfter after now), latest revocation first (then by
	// serial), at most limit (a limit below 1 is refused). It is the
	// catch-up of the revocation feed to node daemons: a certificate that
	// expired needs no revocation, so the list spans one certificate
	// lifetime.
	RevokedCerts(ctx context.Context, now time.Time, limit int) ([]Cert, error)
	// RenewalTimes returns the IssuedAt times of the node's certificates of
	// kind "renew" issued at or after since, oldest first.
	RenewalTimes(ctx context.Context, nodeID string, since time.Time) ([]time.Time, error)
	// RevokeNode raises the node's generation, marks all its unrevoked
	// certificates revoked with reason, and sets its state to StateRevoked
	// unless it is quarantined or retired, which it stays (a revocation
	// lifts neither). A change of state is appended to the node's history
	// with the audit event's actor. It returns the new generation and the
	// serials it revoked. The audit event, when not nil, is appended in the
	// same transaction.
	RevokeNode(ctx context.Context, id, reason string, now time.Time, audit *AuditEvent) (uint64, []string, error)
	// DeleteNode revokes as RevokeNode does, then removes the node record;
	// its certificate records stay, revoked. It leaves a tombstone with the
	// node's last generation (the one it revoked at, which it returns with
	// the revoked serials), so that NextGeneration and CompleteJoin keep a
	// later node of the same id above it. The audit event, when not nil, is
	// appended in the same transaction.
	DeleteNode(ctx context.Context, id, reason string, now time.Time, audit *AuditEvent) (uint64, []string, error)
	// NextGeneration returns the identity generation a new node with this
	// id must start at: one more than the highest generation the id ever
	// had (its live row, or the tombstone a deletion left), and 1 for an id
	// never seen.
	NextGeneration(ctx context.Context, id string) (uint64, error)

	// CreatePending stores a join waiting for approval; ErrConflict if
	// its ID exists.
	CreatePending(ctx context.Context, p Pending) error
	// GetPending returns one pending join by ID; ErrNotFound if none.
	GetPending(ctx context.Context, id string) (Pending, error)
	// ListPending returns the pending joins that have not expired at now,
	// oldest first.
	ListPending(ctx context.Context, now time.Time) ([]Pending, error)
	// ApprovePending marks the unexpired, unapproved pending joins for
	// nodeID approved by by at now and returns them; ErrNotFound if there
	// is none.
	ApprovePending(ctx context.Context, nodeID, by string, now time.Time) ([]Pending, error)

	// PutChallenge stores an open tpm challenge round, after removing the
	// rounds that expired at now (NotAfter at or before now). It fails
	// with ErrConflict, storing nothing, when a round with c.ID exists or
	// when max unexpired rounds are stored already.
	PutChallenge(ctx context.Context, c Challenge, now time.Time, max int) error
	// TakeChallenge removes the round id and returns it, expired or not,
	// so that one answer is taken once; ErrNotFound if there is none.
	TakeChallenge(ctx context.Context, id string) (Challenge, error)
	// PutIntakeSession stores a passed intake's session, after removing
	// the sessions that expired at now (ExpiresAt at or before now). It
	// fails with ErrConflict, storing nothing, when a session with s.ID
	// exists or when max unexpired sessions are stored already.
	PutIntakeSession(ctx context.Context, s IntakeSession, now time.Time, max int) error
	// GetIntakeSession returns the session id, expired or not (until a
	// later PutIntakeSession removes it); ErrNotFound if there is none.
	GetIntakeSession(ctx context.Context, id string) (IntakeSession, error)
	// CreateAdmin records an admin credential; ErrConflict if its serial
	// exists or an unrevoked credential has the same name. The audit
	// event, when not nil, is appended in the same transaction.
	CreateAdmin(ctx context.Context, a AdminCred, audit *AuditEvent) error
	// GetAdmin returns the admin credential with this certificate serial;
	// ErrNotFound if there is none.
	GetAdmin(ctx context.Context, serial string) (AdminCred, error)
	// ListAdmins returns every admin credential, revoked ones included,
	// ordered by name, then by CreatedAt.
	ListAdmins(ctx context.Context) ([]AdminCred, error)
	// RevokeAdmin revokes every unrevoked credential named name, by by at
	// now, and returns them; ErrNotFound if there is none. The audit
	// event, when not nil, is appended in the same transaction.
	RevokeAdmin(ctx context.Context, name, by string, now time.Time, audit *AuditEvent) ([]AdminCred, error)

	// ApplyInventory writes declarations and their changelog in one
	// transaction: each write inserts its declaration when PrevVersion is
	// 0 (ErrConflict if the name exists) or replaces the stored one whose
	// Version equals PrevVersion (ErrConflict otherwise); the stored
	// Version becomes PrevVersion+1. The changes and the audit event (when
	// not nil) are appended. The class of a node record with a written
	// declaration's name follows the declaration, and so do its role and
	// site while it is planned or provisioning. On any error nothing is
	// written.
	ApplyInventory(ctx context.Context, w InventoryWrite) error
	// GetDeclaration returns one declaration; ErrNotFound if none.
	GetDeclaration(ctx context.Context, name string) (Declaration, error)
	// ListDeclarations returns every declaration ordered by name.
	ListDeclarations(ctx context.Context) ([]Declaration, error)
	// DeclarationsByClaims returns the declarations, ordered by name,
	// whose product UUID equals productUUID (when not empty) or whose
	// serial is one of serials (empty strings match nothing).
	DeclarationsByClaims(ctx context.Context, productUUID string, serials []string) ([]Declaration, error)
	// DeclarationsByEKPin returns the declarations, ordered by name, whose
	// EK binding names pin.
	DeclarationsByEKPin(ctx context.Context, pin string) ([]Declaration, error)
	// ListChanges returns the changelog of one device (all devices for
	// ""), newest first: ordered by Time, latest first, and changes of
	// the same Time latest appended first. A limit below 1 is an error.
	ListChanges(ctx context.Context, device string, limit int) ([]FieldChange, error)

	// TransitionNode changes a node's state in one transaction: the node
	// must be in one of t.From (ErrConflict otherwise; ErrNotFound when
	// there is no node and t.Create is nil). With t.Create set and no
	// node of that id, t.Create is written with state t.To (its
	// generation must be above any tombstone's, as CompleteJoin's). With
	// t.Revoke the generation rises and the unrevoked certificates are
	// revoked with reason t.Reason. The change is appended to the node's
	// history and t.Audit (when not nil) to the audit trail. It returns
	// the node as written and the serials it revoked.
	TransitionNode(ctx context.Context, t Transition) (Node, []string, error)
	// NodeHistory returns the state changes of a node id, oldest first
	// (in the order they were appended); none for an unknown id.
	NodeHistory(ctx context.Context, id string) ([]StateChange, error)

	// RecordClaim records a machine that asked to join and was not
	// admitted: a claim with a new Key is inserted with Count 1 and
	// FirstSeen = LastSeen = c.LastSeen; one with a known Key has its
	// fields replaced, its Count raised by one and FirstSeen kept. When
	// max claims are held and the key is new, the claim seen longest ago
	// is removed first, so the table never holds more than max (max < 1
	// is an error).
	RecordClaim(ctx context.Context, c Claim, max int) error
	// ListClaims returns at most limit claims, the most recently seen
	// first. A limit below 1 is an error.
	ListClaims(ctx context.Context, limit int) ([]Claim, error)

	// ExportSafeguards keeps the SPIRE export's held changes and
	// allowances, and removes a retired node's join credentials.
	ExportSafeguards

	// AppendAudit adds an audit event.
	AppendAudit(ctx context.Context, e AuditEvent) error
	// ListAudit returns the most recent audit events, newest first.
	ListAudit(ctx context.Context, limit int) ([]AuditEvent, error)

	// VerdictStore is the boot-policy verdict history (verdicts.go).
	VerdictStore
	// BootEvidenceStore keeps each node's latest boot evidence
	// (verdicts.go).
	BootEvidenceStore

	// ConfigReleases keeps the configs waiting for their release over
	// HTTPS and their burn state (release.go).
	ConfigReleases

	// Close releases the store's resources.
	Close() error
}
