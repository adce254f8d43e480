// Package logkey defines, once, the attribute keys that fleetd's and bcd's
// log lines share, so that one query finds a node, a request or a token in
// every component's lines. Values marked "claimed" come from an
// unauthenticated peer and are capped before they are logged.
package logkey

// Attribute keys of log lines (log/slog).
const (
	// Component names the part of a program that logs: agent, localapi…
	Component = "component"
	// Error is the error a line reports.
	Error = "error"
	// Op is the operation that failed.
	Op = "op"

	// NodeID is a node's id.
	NodeID = "node_id"
	// Generation is a node's identity generation.
	Generation = "identity_generation"
	// Serial is a certificate's serial number, lower-case hex.
	Serial = "serial"
	// Attestor is how a machine proved itself: token or tpm.
	Attestor = "attestor"
	// EKPin is the pin of a TPM's endorsement key.
	EKPin = "ek_pin"
	// Reason is why something was refused or revoked.
	Reason = "reason"

	// RequestID names one request in the log and in the answer a caller
	// gets, so an operator can find the one from the other.
	RequestID = "request_id"
	// TokenID is a join token's public id (never the token).
	TokenID = "token_id"
	// Peer is the network address of the caller.
	Peer = "peer"
	// Admin is the name of an admin credential.
	Admin = "admin"
	// ClaimedHostname is the hostname a joining machine claims.
	ClaimedHostname = "claimed_hostname"

	// Instance is an instance's name, or a bcd node process's instance id.
	Instance = "instance"
	// Sender is the proven sender of a signed call.
	Sender = "sender"
	// ClaimedSender is the sender a refused signed call gives.
	ClaimedSender = "claimed_sender"
	// Service is a local-API service.
	Service = "service"
	// Via is the machine a relayed call came through.
	Via = "via"
	// JournalID is the id of a node's journal.
	JournalID = "journal_id"

	// Key is the use of one of the PKI's private keys (node-ca, …), and
	// KeyWhere where it lives (a file or a PKCS#11 URI).
	Key      = "key"
	KeyWhere = "where"
	// PKCS11Token names a PKCS#11 token (its URI without object or PIN
	// source), PKCS11Module its library.
	PKCS11Token  = "pkcs11_token"
	PKCS11Module = "pkcs11_module"
)
