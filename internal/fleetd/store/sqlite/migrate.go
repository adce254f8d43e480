package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migrations are the schema changes in order: migrations[i] takes the
// schema from version i to version i+1. Append only; never edit or reorder
// an entry that has shipped.
var migrations = []string{
	// 1: the initial schema.
	`
CREATE TABLE tokens (
	id               TEXT PRIMARY KEY,
	hash             BLOB NOT NULL UNIQUE,
	role             TEXT NOT NULL,
	site             TEXT NOT NULL,
	node_id          TEXT NOT NULL,
	allow_reclaim    INTEGER NOT NULL,
	require_approval INTEGER NOT NULL,
	created_by       TEXT NOT NULL,
	created_at       INTEGER,
	expires_at       INTEGER,
	used_at          INTEGER,
	used_by          TEXT NOT NULL
) STRICT;
CREATE INDEX tokens_created_at ON tokens (created_at);

CREATE TABLE nodes (
	id             TEXT PRIMARY KEY,
	spiffe_id      TEXT NOT NULL,
	role           TEXT NOT NULL,
	site           TEXT NOT NULL,
	state          TEXT NOT NULL,
	generation     INTEGER NOT NULL,
	attestor       TEXT NOT NULL,
	product_uuid   TEXT NOT NULL,
	macs           TEXT NOT NULL,
	gpu_uuids      TEXT NOT NULL,
	hostname       TEXT NOT NULL,
	boot_id        TEXT NOT NULL,
	daemon_version TEXT NOT NULL,
	joined_at      INTEGER,
	last_seen      INTEGER,
	cert_serial    TEXT NOT NULL,
	cert_not_after INTEGER
) STRICT;
CREATE INDEX nodes_product_uuid ON nodes (product_uuid);

-- The serial numbers a node claimed, in the order it claimed them.
CREATE TABLE node_serials (
	node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
	pos     INTEGER NOT NULL,
	serial  TEXT NOT NULL,
	PRIMARY KEY (node_id, pos)
) STRICT;
CREATE INDEX node_serials_serial ON node_serials (serial);

-- Certificate records outlive their node, so node_id is not a foreign key.
CREATE TABLE certs (
	serial         TEXT PRIMARY KEY,
	node_id        TEXT NOT NULL,
	generation     INTEGER NOT NULL,
	kind           TEXT NOT NULL,
	issued_at      INTEGER,
	not_after      INTEGER,
	revoked_at     INTEGER,
	revoked_reason TEXT NOT NULL
) STRICT;
CREATE INDEX certs_node_issued ON certs (node_id, issued_at);

CREATE TABLE audit (
	seq     INTEGER PRIMARY KEY,
	time    INTEGER,
	actor   TEXT NOT NULL,
	action  TEXT NOT NULL,
	subject TEXT NOT NULL,
	detail  TEXT NOT NULL
) STRICT;
CREATE INDEX audit_time ON audit (time, seq);
`,
	// 2: joins waiting for an owner's approval. The claims are kept as
	// the nodes table keeps them, except that the serials are a JSON array
	// here: nothing looks pending joins up by serial. A pending join is
	// not a node yet, so node_id is not a foreign key.
	`
CREATE TABLE pending_joins (
	id           TEXT PRIMARY KEY,
	token_hash   BLOB,
	token_id     TEXT NOT NULL,
	csr_hash     BLOB,
	node_id      TEXT NOT NULL,
	role         TEXT NOT NULL,
	site         TEXT NOT NULL,
	product_uuid TEXT NOT NULL,
	serials      TEXT NOT NULL,
	macs         TEXT NOT NULL,
	gpu_uuids    TEXT NOT NULL,
	hostname     TEXT NOT NULL,
	boot_id      TEXT NOT NULL,
	created_at   INTEGER,
	expires_at   INTEGER,
	approved_at  INTEGER,
	approved_by  TEXT NOT NULL
) STRICT;
CREATE INDEX pending_joins_node_id ON pending_joins (node_id);
CREATE INDEX pending_joins_created_at ON pending_joins (created_at);
`,
	// 3: the pin of the EK a tpm join proved, so the same TPM reclaims its
	// node without a token.
	`
ALTER TABLE nodes ADD COLUMN ek_pin TEXT NOT NULL DEFAULT '';
CREATE INDEX nodes_ek_pin ON nodes (ek_pin) WHERE ek_pin <> '';
`,
	// 4: what a deletion leaves of a node: its last generation, so that a
	// later node of the same id starts above it and the deleted node's
	// certificates stay dead.
	`
CREATE TABLE node_tombstones (
	id         TEXT PRIMARY KEY,
	generation INTEGER NOT NULL,
	deleted_at INTEGER
) STRICT;
`,
	// 5: the open rounds of tpm joins, so that an answer may come back to
	// any replica (PostgreSQL) and a restart keeps them.
	`
CREATE TABLE tpm_challenges (
	id        TEXT PRIMARY KEY,
	not_after INTEGER,
	state     BLOB NOT NULL
) STRICT;
CREATE INDEX tpm_challenges_not_after ON tpm_challenges (not_after);
`,
	// 6: the fleet lifecycle (internal/fleetd/lifecycle): a node's class,
	// admin credentials with roles, the declared inventory with its
	// changelog, each node's state history, and claims of machines not
	// admitted. A declaration is not a node: node ids are not foreign keys
	// here, and a declared device without a node record is planned.
	`
ALTER TABLE nodes ADD COLUMN class TEXT NOT NULL DEFAULT '';

CREATE TABLE admins (
	serial     TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	role       TEXT NOT NULL,
	created_by TEXT NOT NULL,
	created_at INTEGER,
	not_after  INTEGER,
	revoked_at INTEGER,
	revoked_by TEXT NOT NULL
) STRICT;
CREATE UNIQUE INDEX admins_unrevoked_name ON admins (name) WHERE revoked_at IS NULL;

CREATE TABLE declarations (
	name           TEXT PRIMARY KEY,
	serial         TEXT NOT NULL,
	product_uuid   TEXT NOT NULL,
	macs           TEXT NOT NULL,
	class          TEXT NOT NULL,
	site           TEXT NOT NULL,
	role           TEXT NOT NULL,
	switch_chassis TEXT NOT NULL,
	switch_port    TEXT NOT NULL,
	ek_pins        TEXT NOT NULL,
	ek_source      TEXT NOT NULL,
	ek_reference   TEXT NOT NULL,
	version        INTEGER NOT NULL,
	updated_at     INTEGER
) STRICT;
CREATE INDEX declarations_serial ON declarations (serial) WHERE serial <> '';
CREATE INDEX declarations_product_uuid ON declarations (product_uuid) WHERE product_uuid <> '';

-- The EK pins of each declaration's binding, for lookups by pin.
CREATE TABLE declaration_ek_pins (
	name TEXT NOT NULL REFERENCES declarations (name) ON DELETE CASCADE,
	pin  TEXT NOT NULL,
	PRIMARY KEY (name, pin)
) STRICT;
CREATE INDEX declaration_ek_pins_pin ON declaration_ek_pins (pin);

CREATE TABLE inventory_changes (
	seq        INTEGER PRIMARY KEY,
	time       INTEGER,
	device     TEXT NOT NULL,
	field      TEXT NOT NULL,
	old        TEXT NOT NULL,
	new        TEXT NOT NULL,
	actor      TEXT NOT NULL,
	actor_role TEXT NOT NULL,
	request_id TEXT NOT NULL,
	source     TEXT NOT NULL
) STRICT;
CREATE INDEX inventory_changes_device ON inventory_changes (device, time, seq);
CREATE INDEX inventory_changes_time ON inventory_changes (time, seq);

CREATE TABLE node_history (
	seq        INTEGER PRIMARY KEY,
	time       INTEGER,
	node_id    TEXT NOT NULL,
	from_state TEXT NOT NULL,
	to_state   TEXT NOT NULL,
	actor      TEXT NOT NULL,
	reason     TEXT NOT NULL,
	request_id TEXT NOT NULL
) STRICT;
CREATE INDEX node_history_node ON node_history (node_id, seq);

CREATE TABLE claims (
	key          TEXT PRIMARY KEY,
	attestor     TEXT NOT NULL,
	ek_pin       TEXT NOT NULL,
	product_uuid TEXT NOT NULL,
	serials      TEXT NOT NULL,
	macs         TEXT NOT NULL,
	hostname     TEXT NOT NULL,
	peer         TEXT NOT NULL,
	reason       TEXT NOT NULL,
	declared     TEXT NOT NULL,
	first_seen   INTEGER,
	last_seen    INTEGER,
	count        INTEGER NOT NULL
) STRICT;
CREATE INDEX claims_last_seen ON claims (last_seen, key);
`,
	// 7: each node's boot-policy verdicts, the last few kept per node.
	`
CREATE TABLE verdicts (
	seq          INTEGER PRIMARY KEY,
	node_id      TEXT NOT NULL,
	time         INTEGER,
	stage        TEXT NOT NULL,
	class        TEXT NOT NULL,
	passed       INTEGER NOT NULL,
	failed       TEXT NOT NULL,
	policy       TEXT NOT NULL,
	nonce_sha256 TEXT NOT NULL,
	quote_sha256 TEXT NOT NULL
) STRICT;
CREATE INDEX verdicts_node ON verdicts (node_id, seq);
`,
	// 8: the SPIRE export's safeguards (docs/spire.md): the changes held
	// back until the owner allows their digest.
	`
CREATE TABLE export_holds (
	digest      TEXT PRIMARY KEY,
	nodes       INTEGER NOT NULL,
	withdrawals INTEGER NOT NULL,
	bans        INTEGER NOT NULL,
	detail      TEXT NOT NULL,
	first_held  INTEGER,
	last_held   INTEGER,
	allowed_at  INTEGER,
	allowed_by  TEXT NOT NULL
) STRICT;
CREATE INDEX export_holds_last_held ON export_holds (last_held, digest);
`,
	// 9: a declaration's install disk, which a render needs
	// (docs/install.md).
	`
ALTER TABLE declarations ADD COLUMN install_disk TEXT NOT NULL DEFAULT '';
`,
	// 10: configs waiting for their release over HTTPS (docs/install.md
	// "Config release"), one per machine UUID, sealed under a key only the
	// install code derives; the code itself is never stored.
	`
CREATE TABLE config_releases (
	uuid                TEXT PRIMARY KEY,
	node_id             TEXT NOT NULL,
	generation          INTEGER NOT NULL,
	verifier            BLOB NOT NULL,
	sealed              BLOB NOT NULL,
	content_type        TEXT NOT NULL,
	created_at          INTEGER,
	expires_at          INTEGER NOT NULL,
	state               TEXT NOT NULL,
	claim_id            TEXT NOT NULL,
	claimed_until       INTEGER,
	burned_at           INTEGER,
	activation          TEXT NOT NULL,
	activated_at        INTEGER,
	activation_attempts INTEGER NOT NULL,
	activation_error    TEXT NOT NULL
) STRICT;
CREATE INDEX config_releases_unsettled ON config_releases (burned_at) WHERE state = 'burned' AND activation = '';
`,
	// 11: intake sessions (docs/install.md, "Intake"): the TPM a passed
	// intake proved and the device it was admitted as, until expires_at.
	`
CREATE TABLE intake_sessions (
	id            TEXT PRIMARY KEY,
	device        TEXT NOT NULL,
	ek_pin        TEXT NOT NULL,
	ek_public     BLOB NOT NULL,
	ak_name       BLOB NOT NULL,
	ak_public     BLOB NOT NULL,
	ldevid_serial TEXT NOT NULL,
	lak_serial    TEXT NOT NULL,
	created_at    INTEGER,
	expires_at    INTEGER,
	boot_verdict  TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX intake_sessions_expires_at ON intake_sessions (expires_at);
`,
	// 12: each node's latest TPM-proven boot evidence, for fleetd policy
	// capture --node: one row per node, replaced.
	`
CREATE TABLE boot_evidence (
	node_id         TEXT PRIMARY KEY,
	time            INTEGER,
	stage           TEXT NOT NULL,
	class           TEXT NOT NULL,
	passed          INTEGER NOT NULL,
	pcrs            TEXT NOT NULL,
	event_log       BLOB NOT NULL,
	ak_public       BLOB NOT NULL,
	quote_attest    BLOB NOT NULL,
	quote_signature BLOB NOT NULL,
	nonce           BLOB NOT NULL
) STRICT;
`,
	// 13: which state of its policy a passing verdict matched (current,
	// next, both), for fleetd policy status.
	`
ALTER TABLE verdicts ADD COLUMN matched TEXT NOT NULL DEFAULT '';
`,
	// 14: the TPM name of the LAK an installed node's join proved with
	// its LAK certificate (NULL for a node installed without intake).
	`
ALTER TABLE nodes ADD COLUMN lak_name BLOB;
`,
	// 15: the revoked certificates by expiry, for the revocation feed's
	// catch-up (RevokedCerts) without a scan of every certificate issued.
	`
CREATE INDEX certs_revoked_not_after ON certs (not_after) WHERE revoked_at IS NOT NULL;
`,
}

const createMigrationsTable = `
CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	applied_at INTEGER NOT NULL
) STRICT`

// migrate brings the schema of db, the writer, up to len(migrations),
// applying each pending migration and recording its version in one
// transaction. Each step re-reads the version under the write lock, so
// processes opening the same file at once apply every migration once.
func migrate(ctx context.Context, db *sql.DB, migrations []string) error {
	if _, err := db.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for {
		done, err := migrateStep(ctx, db, migrations)
		if err != nil || done {
			return err
		}
	}
}

// migrateStep applies the next pending migration; done reports that there
// was none.
func migrateStep(ctx context.Context, db *sql.DB, migrations []string) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("begin migration: %w", err)
	}
	defer func() {
		if err != nil || done {
			_ = tx.Rollback()
		}
	}()
	var version int
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case version > len(migrations):
		return false, fmt.Errorf("database schema version %d is newer than this fleetd knows (%d): upgrade fleetd", version, len(migrations))
	case version == len(migrations):
		return true, nil
	}
	next := version + 1
	if _, err := tx.ExecContext(ctx, migrations[version]); err != nil {
		return false, fmt.Errorf("apply migration %d: %w", next, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
		next, time.Now().UnixNano()); err != nil {
		return false, fmt.Errorf("record migration %d: %w", next, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("commit migration %d: %w", next, err)
	}
	return false, nil
}
