// Package netboxfake is a fake NetBox, for tests: NetBox (Python, Django,
// PostgreSQL) cannot run on these machines. It serves the two endpoints
// fleetd reads — GET /api/dcim/devices/ and GET /api/core/object-changes/ —
// with the documents NetBox 4.x's OpenAPI schema describes
// (PaginatedDeviceWithConfigContextList, PaginatedObjectChangeList), checks
// the "Authorization: Token" header, records an object change for every
// write as NetBox does, and can be made to fail (SetDown). Its tests check
// its answers against the schema go-netbox v4.3.0 ships.
package netboxfake
