// Package load is nodetrust's load tool (cmd/nodetrust-load): it starts a
// control plane (the real fleetd binary, with `fleetd init` and `fleetd
// serve` in a temporary folder) or targets a running one, drives N
// simulated nodes through token joins, live sessions, renewals over those
// sessions and a revocation fan-out, and reports for each phase the
// operations, rate, latency percentiles, errors, and the server's CPU time
// and memory read from /proc of the server process.
//
// Each simulated node does on the wire what a real node (package agent)
// does: its own P-256 key and hardware claims, a join token sealed with HPKE
// to the join encryption key and bound to its CSR, each join on a fresh TLS
// connection, one live Gateway session over mutual TLS with its node
// certificate, renewals with a new key and a proof of possession on that
// session's stream. What a node checks in the answers (joinresponse.Open)
// is checked too, after each timed phase, so that the load tool's own CPU
// is spent on the server's measurement as little as possible.
//
// In the same run it measures the crypto floor: the unavoidable
// cryptography of one join and one renewal on this machine, in process,
// and compares it with the server CPU the control plane actually spent per
// operation.
//
// The run's correctness checks (every node joined, every renewal certified
// a new key, every revoked session received its notice and ended, no other
// session ended) fail the run; the performance goals of DESIGN.md are
// reported but never fail it. docs/performance.md explains the output.
//
// The tool reads /proc and so runs on Linux.
package load
