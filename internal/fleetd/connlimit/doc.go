// Package connlimit bounds the connections a fleetd listener holds: a total,
// a share per source address, a bound on connections still in their TLS
// handshake (unauthenticated), and a deadline for that handshake.
//
// A connection that carries a stream (a node's live session, a call in
// flight) is never closed by these limits. When a limit is reached, a new
// connection displaces the oldest idle one of the source that holds the
// most, if that source holds more than the newcomer's does; otherwise the
// newcomer is refused. So one source cannot lock the others out by holding
// connections open, and a legitimate join from another address still gets
// in while the limit is full.
//
// fleetd's wiring wraps its gRPC and HTTPS listeners with a [Listener];
// [Listener.Credentials] and [Listener.StatsHandler] tell it when a gRPC
// connection finished its handshake and whether it carries a stream, and
// [Listener.ConnState] does the same for net/http. The package never logs:
// refusals and displacements are reported to Config.OnEvent.
package connlimit
