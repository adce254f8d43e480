package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the schema changes in order: migrations[i] takes the
// schema from version i to version i+1. They follow SQLite's migrations
// (the same tables and meaning, PostgreSQL's types); a table only
// PostgreSQL needs (the revocations of the replicas' catch-up read) is in
// a migration of its own. Append only; never edit or reorder an entry that
// has shipped.
var migrations = []string{
	// 1: the initial schema. Claim lists are text[]; the serials' GIN
	// index answers NodesByClaims.
	`
CREATE TABLE tokens (
	id               text PRIMARY KEY,
	hash             bytea NOT NULL UNIQUE,
	role             text NOT NULL,
	site             text NOT NULL,
	node_id          text NOT NULL,
	allow_reclaim    boolean NOT NULL,
	require_approval boolean NOT NULL,
	created_by       text NOT NULL,
	created_at       timestamptz,
	expires_at       timestamptz,
	used_at          timestamptz,
	used_by          text NOT NULL
);
CREATE INDEX tokens_created_at ON tokens (created_at);

CREATE TABLE nodes (
	id             text PRIMARY KEY,
	spiffe_id      text NOT NULL,
	role           text NOT NULL,
	site           text NOT NULL,
	state          text NOT NULL,
	generation     bigint NOT NULL,
	attestor       text NOT NULL,
	product_uuid   text NOT NULL,
	serials        text[] NOT NULL,
	macs           text[] NOT NULL,
	gpu_uuids      text[] NOT NULL,
	hostname       text NOT NULL,
	boot_id        text NOT NULL,
	daemon_version text NOT NULL,
	joined_at      timestamptz,
	last_seen      timestamptz,
	cert_serial    text NOT NULL,
	cert_not_after timestamptz
);
CREATE INDEX nodes_product_uuid ON nodes (product_uuid);
CREATE INDEX nodes_serials ON nodes USING gin (serials);

-- Certificate records outlive their node, so node_id is not a foreign key.
CREATE TABLE certs (
	serial         text PRIMARY KEY,
	node_id        text NOT NULL,
	generation     bigint NOT NULL,
	kind           text NOT NULL,
	issued_at      timestamptz,
	not_after      timestamptz,
	revoked_at     timestamptz,
	revoked_reason text NOT NULL
);
CREATE INDEX certs_node_issued ON certs (node_id, issued_at);

CREATE TABLE audit (
	seq     bigserial PRIMARY KEY,
	time    timestamptz,
	actor   text NOT NULL,
	action  text NOT NULL,
	subject text NOT NULL,
	detail  text NOT NULL
);
CREATE INDEX audit_time ON audit (time, seq);
`,
	// 2: joins waiting for an owner's approval.
	`
CREATE TABLE pending_joins (
	id           text PRIMARY KEY,
	token_hash   bytea,
	token_id     text NOT NULL,
	csr_hash     bytea,
	node_id      text NOT NULL,
	role         text NOT NULL,
	site         text NOT NULL,
	product_uuid text NOT NULL,
	serials      text[] NOT NULL,
	macs         text[] NOT NULL,
	gpu_uuids    text[] NOT NULL,
	hostname     text NOT NULL,
	boot_id      text NOT NULL,
	created_at   timestamptz,
	expires_at   timestamptz,
	approved_at  timestamptz,
	approved_by  text NOT NULL
);
CREATE INDEX pending_joins_node_id ON pending_joins (node_id);
CREATE INDEX pending_joins_created_at ON pending_joins (created_at);
`,
	// 3: the pin of the EK a tpm join proved.
	`
ALTER TABLE nodes ADD COLUMN ek_pin text NOT NULL DEFAULT '';
CREATE INDEX nodes_ek_pin ON nodes (ek_pin) WHERE ek_pin <> '';
`,
	// 4: what a deletion leaves of a node: its last generation.
	`
CREATE TABLE node_tombstones (
	id         text PRIMARY KEY,
	generation bigint NOT NULL,
	deleted_at timestamptz
);
`,
	// 5: the open rounds of tpm joins, so that an answer may come back to
	// any replica.
	`
CREATE TABLE tpm_challenges (
	id        text PRIMARY KEY,
	not_after timestamptz,
	state     bytea NOT NULL
);
CREATE INDEX tpm_challenges_not_after ON tpm_challenges (not_after);
`,
	// 6, PostgreSQL only (SQLite serves one process): every revocation, in
	// commit order, for the replicas' catch-up read after a lost
	// notification. The same transaction sends the NOTIFY.
	`
CREATE TABLE revocations (
	seq        bigserial PRIMARY KEY,
	node_id    text NOT NULL,
	generation bigint NOT NULL,
	reason     text NOT NULL,
	at         timestamptz NOT NULL
);
CREATE INDEX revocations_at ON revocations (at);
`,
	// 7, PostgreSQL only: which replica holds each node's live session,
	// for clone detection across replicas.
	`
CREATE TABLE live_sessions (
	node_id   text PRIMARY KEY,
	instance  text NOT NULL,
	replica   text NOT NULL,
	opened_at timestamptz NOT NULL
);
`,
	// 8: the fleet lifecycle, as SQLite's migration 6: a node's class,
	// admin credentials with roles, the declared inventory with its
	// changelog, each node's state history, and claims.
	`
ALTER TABLE nodes ADD COLUMN class text NOT NULL DEFAULT '';

CREATE TABLE admins (
	serial     text PRIMARY KEY,
	name       text NOT NULL,
	role       text NOT NULL,
	created_by text NOT NULL,
	created_at timestamptz,
	not_after  timestamptz,
	revoked_at timestamptz,
	revoked_by text NOT NULL
);
CREATE UNIQUE INDEX admins_unrevoked_name ON admins (name) WHERE revoked_at IS NULL;

CREATE TABLE declarations (
	name           text PRIMARY KEY,
	serial         text NOT NULL,
	product_uuid   text NOT NULL,
	macs           text[] NOT NULL,
	class          text NOT NULL,
	site           text NOT NULL,
	role           text NOT NULL,
	switch_chassis text NOT NULL,
	switch_port    text NOT NULL,
	ek_pins        text[] NOT NULL,
	ek_source      text NOT NULL,
	ek_reference   text NOT NULL,
	version        bigint NOT NULL,
	updated_at     timestamptz
);
CREATE INDEX declarations_serial ON declarations (serial) WHERE serial <> '';
CREATE INDEX declarations_product_uuid ON declarations (product_uuid) WHERE product_uuid <> '';
CREATE INDEX declarations_ek_pins ON declarations USING gin (ek_pins);

CREATE TABLE inventory_changes (
	seq        bigserial PRIMARY KEY,
	time       timestamptz,
	device     text NOT NULL,
	field      text NOT NULL,
	old        text NOT NULL,
	new        text NOT NULL,
	actor      text NOT NULL,
	actor_role text NOT NULL,
	request_id text NOT NULL,
	source     text NOT NULL
);
CREATE INDEX inventory_changes_device ON inventory_changes (device, time, seq);
CREATE INDEX inventory_changes_time ON inventory_changes (time, seq);

CREATE TABLE node_history (
	seq        bigserial PRIMARY KEY,
	time       timestamptz,
	node_id    text NOT NULL,
	from_state text NOT NULL,
	to_state   text NOT NULL,
	actor      text NOT NULL,
	reason     text NOT NULL,
	request_id text NOT NULL
);
CREATE INDEX node_history_node ON node_history (node_id, seq);

CREATE TABLE claims (
	key          text PRIMARY KEY,
	attestor     text NOT NULL,
	ek_pin       text NOT NULL,
	product_uuid text NOT NULL,
	serials      text[] NOT NULL,
	macs         text[] NOT NULL,
	hostname     text NOT NULL,
	peer         text NOT NULL,
	reason       text NOT NULL,
	declared     text NOT NULL,
	first_seen   timestamptz,
	last_seen    timestamptz,
	count        bigint NOT NULL
);
CREATE INDEX claims_last_seen ON claims (last_seen, key);
`,
	// 9: each node's boot-policy verdicts, the last few kept per node.
	`
CREATE TABLE verdicts (
	seq          bigserial PRIMARY KEY,
	node_id      text NOT NULL,
	time         timestamptz,
	stage        text NOT NULL,
	class        text NOT NULL,
	passed       boolean NOT NULL,
	failed       jsonb NOT NULL,
	policy       text NOT NULL,
	nonce_sha256 text NOT NULL,
	quote_sha256 text NOT NULL
);
CREATE INDEX verdicts_node ON verdicts (node_id, seq);
`,
	// 10: the SPIRE export's safeguards, as SQLite's migration 8: the
	// changes held back until the owner allows their digest.
	`
CREATE TABLE export_holds (
	digest      text PRIMARY KEY,
	nodes       bigint NOT NULL,
	withdrawals bigint NOT NULL,
	bans        bigint NOT NULL,
	detail      text NOT NULL,
	first_held  timestamptz,
	last_held   timestamptz,
	allowed_at  timestamptz,
	allowed_by  text NOT NULL
);
CREATE INDEX export_holds_last_held ON export_holds (last_held, digest);
`,
	// 11: a declaration's install disk, as SQLite's migration 9.
	`
ALTER TABLE declarations ADD COLUMN install_disk text NOT NULL DEFAULT '';
`,
	// 12: configs waiting for their release over HTTPS, as SQLite's
	// migration 10: one per machine UUID, sealed under a key only the
	// install code derives; the code itself is never stored.
	`
CREATE TABLE config_releases (
	uuid                text PRIMARY KEY,
	node_id             text NOT NULL,
	generation          bigint NOT NULL,
	verifier            bytea NOT NULL,
	sealed              bytea NOT NULL,
	content_type        text NOT NULL,
	created_at          timestamptz,
	expires_at          timestamptz NOT NULL,
	state               text NOT NULL,
	claim_id            text NOT NULL,
	claimed_until       timestamptz,
	burned_at           timestamptz,
	activation          text NOT NULL,
	activated_at        timestamptz,
	activation_attempts integer NOT NULL,
	activation_error    text NOT NULL
);
CREATE INDEX config_releases_unsettled ON config_releases (burned_at) WHERE state = 'burned' AND activation = '';
`,
	// 13: intake sessions, as SQLite's migration 11.
	`
CREATE TABLE intake_sessions (
	id            text PRIMARY KEY,
	device        text NOT NULL,
	ek_pin        text NOT NULL,
	ek_public     bytea NOT NULL,
	ak_name       bytea NOT NULL,
	ak_public     bytea NOT NULL,
	ldevid_serial text NOT NULL,
	lak_serial    text NOT NULL,
	created_at    timestamptz,
	expires_at    timestamptz,
	boot_verdict  text NOT NULL DEFAULT ''
);
CREATE INDEX intake_sessions_expires_at ON intake_sessions (expires_at);
`,
	// 14: each node's latest TPM-proven boot evidence, as SQLite's
	// migration 12: one row per node, replaced.
	`
CREATE TABLE boot_evidence (
	node_id         text PRIMARY KEY,
	time            timestamptz,
	stage           text NOT NULL,
	class           text NOT NULL,
	passed          boolean NOT NULL,
	pcrs            jsonb NOT NULL,
	event_log       bytea NOT NULL,
	ak_public       bytea NOT NULL,
	quote_attest    bytea NOT NULL,
	quote_signature bytea NOT NULL,
	nonce           bytea NOT NULL
);
`,
	// 15: which state of its policy a passing verdict matched, as SQLite's
	// migration 13.
	`
ALTER TABLE verdicts ADD COLUMN matched text NOT NULL DEFAULT '';
`,
	// 16: an installed node's LAK name, as SQLite's migration 14.
	`
ALTER TABLE nodes ADD COLUMN lak_name bytea;
`,
	// 17: the revoked certificates by expiry, as SQLite's migration 15.
	`
CREATE INDEX certs_revoked_not_after ON certs (not_after) WHERE revoked_at IS NOT NULL;
`,
}

// migrationLock is the advisory lock key replicas take while they migrate
// (the bytes of "ntmigrat").
const migrationLock = 0x6e746d6967726174

// migrate brings the schema up to len(migrations) in one transaction that
// holds the migration lock, so replicas starting at once wait for the
// first and then find nothing to do.
func migrate(ctx context.Context, pool *pgxpool.Pool, migrations []string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		applied_at timestamptz NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this fleetd knows (%d): upgrade fleetd", version, len(migrations))
	}
	for v := version; v < len(migrations); v++ {
		if err := apply(ctx, tx, v+1, migrations[v]); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migrations: %w", err)
	}
	return nil
}

func apply(ctx context.Context, tx pgx.Tx, version int, sql string) error {
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("apply migration %d: %w", version, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, now())`, version); err != nil {
		return fmt.Errorf("record migration %d: %w", version, err)
	}
	return nil
}
