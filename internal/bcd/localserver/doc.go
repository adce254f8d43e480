// Package localserver is the signed-call side of the node daemon (bcd node): the
// local API it serves on a unix socket to the command line and the
// instances of its machine, and the federation service it serves over TCP
// with TLS to the daemons of other machines.
//
// Every call but a probe carries a callsig envelope, and the daemon
// verifies it before it reads the sender: a local call with the key of the
// sender it gives (the command line's key, the key of a running instance),
// a call of another machine with the key its machine proof endorses. A
// refusal is a reply of kind "rejected" whose message starts with the name
// of the failed check. The services (status, leases, membership, launch)
// then see only the sender the call proved. bcd run holds each start of an
// instance on the Run stream: the daemon makes the instance's key, writes
// its key file and runtime configuration, endorses the key with its boot
// key, and forgets the key and removes the files when the stream ends.
//
// docs/local-api.md describes the API, the key expressions and the files.
// Only internal/bcdcli imports this package; it logs through the
// *slog.Logger of its Config.
package localserver
