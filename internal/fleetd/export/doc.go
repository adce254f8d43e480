// Package export builds and checks the registration export of
// docs/spire.md: the devices fleetd vouches for (eligible) and the retired
// ones it holds records of, each with its SPIFFE ID and the selectors a
// SPIRE server's node attestors give its agent, in a versioned JSON
// document with a SHA-256 digest. It is pure: node records in, bytes out,
// and bytes in, a checked document out (Parse refuses a malformed or
// unverifiable export).
package export
