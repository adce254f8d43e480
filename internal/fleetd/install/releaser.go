package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Defaults of Config.
const (
	DefaultTTL          = 4 * time.Hour
	DefaultWriteTimeout = 30 * time.Second
	DefaultAckTimeout   = 10 * time.Second
	DefaultSweepEvery   = time.Minute
	// claimMargin is how much longer a claim lasts than a fetch may take
	// (its write and its wait for the acknowledgement).
	claimMargin = 15 * time.Second
)

// Config configures a Releaser.
type Config struct {
	Store store.Store
	// Logger receives the releases and refusals, never a code or a
	// config.
	Logger *slog.Logger
	// Registry, when set, receives the release counters.
	Registry prometheus.Registerer
	// Activator makes a node active once its config was delivered.
	Activator Activator
	// TTL is how long a rendered config waits for its fetch (default
	// DefaultTTL); a later fetch is 410 Gone.
	TTL time.Duration
	// WriteTimeout bounds the writing of a response, AckTimeout the wait
	// for its acknowledgement after it was written (defaults
	// DefaultWriteTimeout, DefaultAckTimeout). A claim lasts both and a
	// margin, so a fetch whose process died gives way after it.
	WriteTimeout time.Duration
	AckTimeout   time.Duration
	// SweepEvery is how often Run retries unsettled activations and purges
	// expired configs (default DefaultSweepEvery).
	SweepEvery time.Duration
	// Now is the clock (default time.Now); Random the source of codes,
	// nonces and claim ids (default crypto/rand).
	Now    func() time.Time
	Random io.Reader
}

// Activator makes a node active after its config was released.
type Activator interface {
	// Activate returns the settled outcome ("active", or why the node was
	// not made active and never will be by retrying: it was quarantined
	// meanwhile, say) with a nil error; an error is a failure to retry.
	Activate(ctx context.Context, nodeID, reason string) (outcome string, err error)
}

// Releaser issues install codes and releases configs. It is safe for
// concurrent use.
type Releaser struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	kick    chan struct{}
	// observe, when set (by tests), is told each fetch's outcome once
	// the fetch is over, the burn or the claim's release included.
	observe func(outcome string)
}

// New makes a Releaser.
func New(cfg Config) (*Releaser, error) {
	if cfg.Store == nil || cfg.Logger == nil || cfg.Activator == nil {
		return nil, errors.New("install: a store, a logger and an activator are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if cfg.TTL < 0 || cfg.WriteTimeout < 0 || cfg.AckTimeout < 0 || cfg.SweepEvery < 0 {
		return nil, errors.New("install: TTL, WriteTimeout, AckTimeout and SweepEvery must be positive")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Releaser{cfg: cfg, log: cfg.Logger.With("component", "config-release"), metrics: m, kick: make(chan struct{}, 1)}, nil
}

// claimFor is how long a fetch's claim lasts.
func (r *Releaser) claimFor() time.Duration {
	return r.cfg.WriteTimeout + r.cfg.AckTimeout + claimMargin
}

// Render is a rendered config to release.
type Render struct {
	// UUID is the machine's product UUID (case-insensitive).
	UUID string
	// NodeID is the node made active once the config is delivered.
	NodeID      string
	Config      []byte
	ContentType string
	// Actor names who asked for the render, for the audit trail.
	Actor string
}

// Issued is what Issue stored.
type Issued struct {
	Generation uint64
	ExpiresAt  time.Time
}

// maxUUID bounds a UUID's length.
const maxUUID = 64

// NormalizeUUID checks a machine UUID (letters, digits, '-', '.', '_', at
// most 64) and lower-cases it, as both the render and the fetch name it.
func NormalizeUUID(uuid string) (string, error) {
	if uuid == "" || len(uuid) > maxUUID {
		return "", fmt.Errorf("machine UUID: 1 to %d characters", maxUUID)
	}
	for _, c := range uuid {
		ok := c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '.' || c == '_'
		if !ok {
			return "", errors.New("machine UUID: letters, digits, '-', '.' and '_' only")
		}
	}
	return strings.ToLower(uuid), nil
}

// Issue stores rd's config as the release of its UUID, sealed under a new
// install code, in place of any earlier release (whose code then stops
// working), and returns the code. The caller wraps it for the session's
// TPM (IssueWrapped does both) and keeps it nowhere.
func (r *Releaser) Issue(ctx context.Context, rd Render) (Code, Issued, error) {
	code, err := NewCode(r.cfg.Random)
	if err != nil {
		return Code{}, Issued{}, err
	}
	iss, err := r.issue(ctx, rd, code)
	if err != nil {
		return Code{}, Issued{}, err
	}
	return code, iss, nil
}

// IssueWrapped is Issue followed by WrapCode: the code leaves fleetd only
// wrapped to the TPM whose EK public area is ekPublicArea, for the AK named
// akName. The code is wrapped first, so a session that cannot receive it
// replaces no earlier release.
func (r *Releaser) IssueWrapped(ctx context.Context, rd Render, ekPublicArea, akName []byte) (Wrapped, Issued, error) {
	code, err := NewCode(r.cfg.Random)
	if err != nil {
		return Wrapped{}, Issued{}, err
	}
	w, err := WrapCode(ekPublicArea, akName, code)
	if err != nil {
		return Wrapped{}, Issued{}, err
	}
	iss, err := r.issue(ctx, rd, code)
	if err != nil {
		return Wrapped{}, Issued{}, err
	}
	return w, iss, nil
}

func (r *Releaser) issue(ctx context.Context, rd Render, code Code) (Issued, error) {
	uuid, err := NormalizeUUID(rd.UUID)
	if err != nil {
		return Issued{}, fmt.Errorf("issue an install code: %w", err)
	}
	if rd.NodeID == "" || len(rd.Config) == 0 {
		return Issued{}, errors.New("issue an install code: a node id and a config are required")
	}
	sealed, err := code.seal(uuid, rd.Config, r.cfg.Random)
	if err != nil {
		return Issued{}, err
	}
	ct := rd.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	now := r.cfg.Now()
	actor := rd.Actor
	if actor == "" {
		actor = "install"
	}
	expires := now.Add(r.cfg.TTL)
	rel, err := r.cfg.Store.PutConfigRelease(ctx, store.ConfigRelease{UUID: uuid, NodeID: rd.NodeID, Verifier: code.verifier(uuid), Sealed: sealed,
		ContentType: ct, CreatedAt: now, ExpiresAt: expires},
		&store.AuditEvent{Time: now, Actor: actor, Action: "config.render", Subject: rd.NodeID,
			Detail: fmt.Sprintf("config of machine %s sealed for release until %s; an earlier code of the machine no longer works", uuid, expires.UTC().Format(time.RFC3339))})
	if err != nil {
		return Issued{}, fmt.Errorf("issue an install code for %s: %w", rd.NodeID, err)
	}
	r.metrics.issued.Inc()
	r.log.InfoContext(ctx, "config sealed for release", "node", rd.NodeID, "uuid", uuid, "generation", rel.Generation, "expires", rel.ExpiresAt, "bytes", len(rd.Config))
	return Issued{Generation: rel.Generation, ExpiresAt: rel.ExpiresAt}, nil
}
